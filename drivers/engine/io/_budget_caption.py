"""The caption of edi.png: how large the energy-budget residual is, and how large it should be.

The residual of the energy-dissipation identity (docs/model.md, M1; docs/numerics.md, "Energy-
dissipation budget") is never exactly zero in a computation. What it should be depends on the
scheme, on the weights and on how often the budget is recorded (measured in
``tests/test_edi_cli.py``, ``tests/test_edi.py`` and drivers/README.md, "EDI residual under
refinement"):

- every term is integrated in time by the trapezoid rule between budget records
  (``[output] edi_every``; 0: at the outputs): O(dt_rec^2) for smooth integrands, large where
  G^2 or the weights change fast between two records;
- ``fv``: the cell-centre quadrature of the finite volumes, O(h^2) under joint refinement, plus
  O(dt^2) in time (MUSCL + SSP-RK3);
- ``jko``: O(tau), the first-order minimizing movement (plus a spatial part of the two-point
  flux metric);
- ``particles``: O(dt^2) for RK4 (O(dt) for Euler), no spatial part;
- Ornstein-Uhlenbeck weights: O(sigma^2 dt_rec) with a systematic sign (the Euler-Maruyama
  path of the weights is seen only at the records);
- noisy particles: the Brownian martingale is not computed (the budget sees states only), so
  the budget closes in expectation, up to O(sqrt(nu T / n));
- adaptive meshes: the residual contains the energy jumps of the adaptations
  (``adapt_energy_jump``).

Measured (configs/s2_oscillating.toml, t = 3, three heads): the residual is 19 % of dE on an
icosphere of level 2 and 5.4 % on level 3 (0.95 and 0.29, ratio 3.3: the spatial part), and
recording the budget every step instead of at the outputs changes it by 1 % (0.945 to 0.936).

For one head with frozen weights the residual is a pure discretisation error and tends to
zero at the scheme's order; :func:`budget_caption` says this, with the measured relative
size, under the picture.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

__all__ = ["budget_caption", "budget_context"]

#: the title that drivers.engine._finish gives edi.png
TITLE = re.compile(r"energy budget: ([\w-]+), (\d+) head\(s\), ([\w-]+) weights")

#: the expected residual of each scheme (without the weights' and the records' part)
SCHEME_ORDER = {
    "fv": (
        "O(h^2) from the cell-centre quadrature (mostly the largest part: about 4x smaller "
        "per mesh level) + O(dt^2) in time (MUSCL, SSP-RK3)"
    ),
    "jko": "O(tau) (first-order minimizing movement) + a spatial part",
    "particles": "O(dt^2) for RK4 (O(dt) for Euler)",
}


def _column(rows: Sequence[dict[str, float]], key: str) -> np.ndarray:
    return np.array([float(r.get(key, 0.0)) for r in rows], dtype=np.float64)


def budget_context(
    title: str, rows: Sequence[dict[str, float]]
) -> tuple[str | None, str | None, int | None]:
    """The scheme, the weight dynamics and the number of heads of a budget: from the title
    that the run gives edi.png ("energy budget: fv, 3 head(s), ou weights"), else what the
    rows show (a martingale: OU weights; an explicit time derivative: moving weights;
    neither: frozen), with the scheme and the heads unknown (None)."""
    match = TITLE.search(title or "")
    if match:
        return match.group(1), match.group(3), int(match.group(2))
    if np.any(_column(rows, "martingale") != 0.0):
        return None, "ou", None
    if np.any(_column(rows, "int_dtE") != 0.0):
        return None, "time-dependent", None
    return None, "frozen", None


def budget_caption(
    rows: Sequence[dict[str, float]],
    scheme: str | None = None,
    dynamics: str | None = None,
    heads: int | None = None,
) -> str:
    """Two or three sentences for under edi.png: the residual at the end relative to the
    largest budget term, and the residual expected of this scheme and these weights (module
    docstring). ``rows``: dicts with ``t`` and the budget columns."""
    t = _column(rows, "t")
    if len(t) == 0:
        return "No budget rows."
    residual = _column(rows, "edi_residual")
    terms = [_column(rows, k) for k in ("dE", "int_dtE", "int_dissipation", "int_diffusion")]
    size = max((float(np.max(np.abs(c))) for c in terms if len(c)), default=0.0)
    final = float(abs(residual[-1])) if len(residual) else 0.0
    gaps = np.diff(t)
    gap = float(np.median(gaps)) if len(gaps) else 0.0
    if size > 0.0:
        measured = (
            f"Residual at t = {t[-1]:.3g}: {final:.2g} = {100 * final / size:.2g} % of the "
            f"largest term ({size:.3g})."
        )
    else:
        measured = f"Residual at t = {t[-1]:.3g}: {final:.2g} (all terms are 0)."
    parts = [SCHEME_ORDER.get(scheme or "", "the scheme's discretisation error")]
    parts.append(
        f"O(dt_rec^2) from the trapezoid rule between budget records (outputs here "
        f"{gap:.2g} apart; [output] edi_every = 1 records every step)"
    )
    if dynamics == "ou":
        parts.append("O(sigma^2 dt_rec) with a systematic sign from the OU weights")
    elif dynamics not in (None, "frozen"):
        parts.append("the weights' d_tE between records (large where they move fast)")
    if np.any(_column(rows, "int_diffusion") != 0.0) and scheme == "particles":
        parts.append("the Brownian martingale, not computed: closes in expectation only")
    if any("adapt_energy_jump" in r for r in rows[-1:]):
        parts.append("the energy jumps of the mesh adaptations (adapt_energy_jump)")
    expected = "Expected: " + " + ".join(parts) + "."
    if heads == 1 and dynamics == "frozen":
        expected += " One head, frozen weights: a pure discretisation error, -> 0 with h, dt."
    return f"{measured} {expected}"
