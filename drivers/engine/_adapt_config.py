"""The ``[adapt]`` table of a run config: adaptive meshes (docs/adaptivity.md).

Checked by :func:`drivers.engine.validate` (here): ``every >= 1``, ``tolerance >= 0`` (0: the
default target), ``refine >= 0`` (0: from the tolerance; > 0 not with a tolerance), ``coarsen``
in [0, refine/2] and 0 without ``refine``, ``grading >= 0``, ``conserve_energy`` and ``local_time_stepping``
booleans (local time steps need an adaptive mesh, a scheme that takes them and coupled
diffusion), and for ``max_level > 0`` a built-in S1/S2 mesh, a level in (``mesh.refinement``,
:data:`~drivers.engine._schema.MAX_ADAPT_LEVEL`] and a scheme that runs on adaptive meshes
(its :class:`~solvers.transport.SchemeSpec`).
"""

from __future__ import annotations

import math
from typing import Any

from drivers.engine._config import ConfigError, as_float, as_int
from drivers.engine._schema import MAX_ADAPT_LEVEL, schemes_with
from solvers.transport import scheme_spec

__all__ = ["check_adapt"]


def check_adapt(cfg: dict[str, Any]) -> None:
    """Check the ``[adapt]`` table (in place)."""
    ad, m, scheme = cfg["adapt"], cfg["mesh"], cfg["time"]["scheme"]
    ad["max_level"] = as_int(ad["max_level"], "adapt.max_level")
    ad["every"] = as_int(ad["every"], "adapt.every")
    ad["refine"] = as_float(ad["refine"], "adapt.refine")
    ad["coarsen"] = as_float(ad["coarsen"], "adapt.coarsen")
    ad["tolerance"] = as_float(ad["tolerance"], "adapt.tolerance")
    ad["grading"] = as_int(ad["grading"], "adapt.grading")
    ad["budget"] = as_float(ad["budget"], "adapt.budget")
    if not (ad["budget"] >= 0 and math.isfinite(ad["budget"])):
        raise ConfigError("adapt.budget", f"must be >= 0 (0: off), got {ad['budget']}")
    if ad["grading"] < 0:
        raise ConfigError("adapt.grading", f"must be >= 0, got {ad['grading']}")
    for key in ("conserve_energy", "local_time_stepping"):
        if not isinstance(ad[key], bool):
            raise ConfigError(f"adapt.{key}", f"must be true or false, got {ad[key]!r}")
    if ad["every"] < 1:
        raise ConfigError("adapt.every", f"must be >= 1, got {ad['every']}")
    if not (ad["tolerance"] >= 0 and math.isfinite(ad["tolerance"])):
        raise ConfigError(
            "adapt.tolerance", f"must be > 0 (0: the default target), got {ad['tolerance']}"
        )
    if not (ad["refine"] >= 0 and math.isfinite(ad["refine"])):
        raise ConfigError(
            "adapt.refine", f"must be > 0 (0: thresholds from the tolerance), got {ad['refine']}"
        )
    if ad["refine"] == 0:
        if ad["coarsen"] != 0:
            raise ConfigError(
                "adapt.coarsen",
                f"needs adapt.refine (fixed thresholds), got {ad['coarsen']}: with a tolerance "
                "the thresholds follow from it",
            )
    elif ad["tolerance"] > 0:
        raise ConfigError(
            "adapt.refine",
            "give adapt.tolerance (an accuracy target) or adapt.refine/coarsen (fixed "
            "thresholds), not both",
        )
    elif not 0 <= ad["coarsen"] <= ad["refine"] / 2:
        raise ConfigError(
            "adapt.coarsen",
            f"must be in [0, refine/2] = [0, {ad['refine'] / 2:g}] (a merged cell must not be "
            f"split again at once), got {ad['coarsen']}",
        )
    if ad["max_level"] == 0:
        if ad["local_time_stepping"]:
            raise ConfigError(
                "adapt.local_time_stepping", "needs an adaptive mesh (adapt.max_level > 0)"
            )
        return
    if m["manifold"] not in MAX_ADAPT_LEVEL or m["file"]:
        raise ConfigError(
            "adapt.max_level", "adaptive meshes are built-in S1/S2 meshes (no mesh.file, no boxes)"
        )
    top = MAX_ADAPT_LEVEL[m["manifold"]]
    if not m["refinement"] < ad["max_level"] <= top:
        raise ConfigError(
            "adapt.max_level",
            f"must be in (mesh.refinement, {top}] = ({m['refinement']}, {top}] for "
            f"{m['manifold']} (0: no adaptation), got {ad['max_level']}",
        )
    if ad["forest"] == "distributed" and m["manifold"] != "S2":
        raise ConfigError("adapt.forest", f'"distributed" is a forest of S2, got {m["manifold"]}')
    if ad["local_time_stepping"]:
        if not scheme_spec(scheme).local_steps:
            names = " or ".join(f'"{n}"' for n in schemes_with("local_steps"))
            raise ConfigError(
                "adapt.local_time_stepping",
                f"the {scheme!r} scheme takes no local time steps: use time.scheme = {names}",
            )
        if cfg["transport"]["diffusion_step"] != "coupled" and cfg["attention"]["diffusion"]:
            raise ConfigError(
                "adapt.local_time_stepping",
                'needs transport.diffusion_step = "coupled" with noise (split diffusion '
                "steps are not multirate)",
            )
    if not scheme_spec(scheme).adaptive_mesh:
        names = " or ".join(f'"{n}"' for n in schemes_with("adaptive_mesh"))
        raise ConfigError(
            "adapt.max_level",
            f"the {scheme!r} scheme does not run on adaptive meshes: use time.scheme = "
            f"{names}, or set adapt.max_level = 0",
        )
