"""The ``[weights]`` keys of a law of weights (``dynamics = "fokker-planck"``; docs/model.md, M1b).

Checked by :func:`drivers.engine.validate` (here): ``p`` in 1..3, an S1/S2 mesh and a scheme that
runs with a weight law (its :class:`~solvers.transport.SchemeSpec`), ``B`` p symmetric d x d
matrices, a box ``lower < upper`` with at most 4096 cells, ``std0 > 0`` and ``sigma > 0``, and
a symmetric ``V`` of the first head (D_0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivers.engine._config import ConfigError, as_float, as_int, as_vector, head_matrix
from drivers.engine._schema import scheme_spec, scheme_words

__all__ = ["check_weight_law"]


def check_weight_law(w: dict[str, Any], cfg: dict[str, Any], d: int) -> None:
    """Validate the [weights] keys of dynamics = "fokker-planck" (in place)."""
    p = w["p"] = as_int(w["p"], "weights.p")
    if p not in (1, 2, 3):
        raise ConfigError("weights.p", f"must be 1, 2 or 3, got {p}")
    if (
        cfg["mesh"]["manifold"] not in ("S1", "S2")
        or not scheme_spec(cfg["time"]["scheme"]).weight_law
    ):
        raise ConfigError(
            "weights.dynamics",
            f"fokker-planck weights drive the {scheme_words('weight_law')} on S1/S2",
        )
    B = w["B"] if w["B"] else [np.diag([1.0] + [0.0] * (d - 1)).tolist()] * p
    try:
        Barr = np.array(B, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(
            "weights.B", f"must be a list of {p} symmetric {d}x{d} matrices"
        ) from None
    if (
        Barr.shape != (p, d, d)
        or not np.all(np.isfinite(Barr))
        or not np.allclose(Barr, Barr.swapaxes(1, 2))
    ):
        raise ConfigError("weights.B", f"must be a list of {p} symmetric {d}x{d} matrices")
    w["B"] = Barr.tolist()
    for key in ("lower", "upper", "centre", "mean0"):
        w[key] = as_vector(w[key], p, f"weights.{key}")
    if not all(lo < hi for lo, hi in zip(w["lower"], w["upper"], strict=True)):
        raise ConfigError("weights.upper", "must be > weights.lower on every axis")
    cells = w["cells"] if isinstance(w["cells"], list) else [w["cells"]] * p
    if len(cells) != p:
        raise ConfigError("weights.cells", f"must be an integer or a list of {p} integers")
    w["cells"] = [as_int(c, "weights.cells") for c in cells]
    if min(w["cells"]) < 1 or int(np.prod(w["cells"])) > 4096:
        raise ConfigError("weights.cells", "must be >= 1 per axis and at most 4096 cells in all")
    w["std0"] = as_float(w["std0"], "weights.std0")
    if not w["std0"] > 0 or not w["sigma"] > 0:
        raise ConfigError("weights.std0", "std0 and sigma must be > 0 for the weight measure")
    head = cfg["attention"]["heads"][0]
    V = head_matrix(head, 0, "V", d)
    if not np.allclose(V, V.T):
        raise ConfigError("attention.heads[0].V", "D0 = V of the first head must be symmetric")
