#!/usr/bin/env bash
# Runs INSIDE the image (docker/build.sh, `make image`): a 2-rank solve whose outputs are
# checked (files, mass conservation), then MPI smoke tests of the suite. The run goes to
# RESULTS (default /work/results, a mounted host folder). pytest is not in the default image:
# it is installed, pinned by requirements.lock, into /tmp of this container only (pip uses
# /run/secrets/ca as its CA bundle when that file is mounted).
set -euo pipefail
res=${RESULTS:-/work/results}
echo "smoke: uid $(id -u) ($(id -un 2>/dev/null || echo '?')), $(python --version), $(command -v mpiexec), $(transformer-pde --version)"

echo "smoke: mpiexec -n 2 transformer-pde run configs/demo_s2.toml --out $res/demo (level 3, t_end 1, no pictures)"
t=$SECONDS
mpiexec -n 2 transformer-pde run configs/demo_s2.toml --out "$res/demo" \
    --set mesh.refinement=3 --set time.t_end=1.0 --set output.pictures=false
echo "smoke: solve took $((SECONDS - t)) s"
python - "$res/demo" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np
out = Path(sys.argv[1])
for name in ("density.xdmf", "density.h5", "final.npz", "metrics.csv", "summary.json"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0, f"missing {name}"
summary = json.loads((out / "summary.json").read_text())
assert summary["status"] == "ok" and summary["ranks"] == 2, summary["status"]
mass = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)["mass"]
final = np.load(out / "final.npz")
total = float(final["density"] @ final["weights"])
drift = float(np.max(np.abs(mass - mass[0])))
assert drift < 1e-12 and abs(total - mass[0]) < 1e-12, (drift, total, mass[0])
print(f"smoke: outputs complete; mass {mass[0]:.15f} over {len(mass)} outputs, "
      f"max drift {drift:.1e}, final.npz mass {total:.15f}, {summary['steps']} steps")
EOF

echo "smoke: MPI tests of the suite (mpiexec -n 2 pytest -m 'not serial' tests/test_cli.py, a subset)"
[ -s /run/secrets/ca ] && export PIP_CERT=/run/secrets/ca
python -m pip install -q --target /tmp/pytest-env -c requirements.lock pytest
PYTHONPATH=/tmp/pytest-env timeout 600 mpiexec -n 2 python -m pytest -q -p no:cacheprovider \
    -m "not serial" tests/test_cli.py -k "test_run_outputs or test_missing_config_and_bad_set"
echo "smoke: passed"
