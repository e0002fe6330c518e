"""The ``[particles]`` table of a run config: mesh-free particles on S^{d-1}, any d >= 2.

A ``[particles]`` table with ``n`` makes a particle run mesh-free (:func:`mesh_free`): the
tokens are n particles of mass 1/n on S^{d-1}, d = ``particles.d``, started from the law of
``particles.initial`` ("uniform", "vmf" mixture, or a "file"), and the run has no mesh. Without
``n`` (the default) the particle scheme keeps one particle per cell centre of ``[mesh]``.

The rules (checked by :func:`drivers.engine.validate`, here): ``n`` in 1..1,000,000, ``d`` in
2..64, ``time.scheme = "particles"``, ``time.dt > 0`` (no mesh size for a CFL step), the
``[mesh]``, ``[initial]`` and ``[adapt]`` tables at their defaults, frozen, OU or oscillating
weights (no weight law on a parameter mesh); vmf centres are d-vectors (normalised), kappa >= 0
(one or one per centre), weights >= 0 with a positive sum (normalised); a file is read here
(:func:`solvers.transport.read_positions`: an (n, d) array of finite, nonzero rows), so that a
bad file is refused before any work starts.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from drivers.engine._config import DEFAULTS, ConfigError, as_float, as_int, mesh_free

__all__ = ["MAX_D", "MAX_PARTICLES", "check_mesh_free_rules", "check_particle_table"]

#: the most particles of a mesh-free run (the velocity costs O(n^2 d) a stage)
MAX_PARTICLES = 1_000_000
#: the largest ambient dimension
MAX_D = 64
#: the largest concentration of a vMF component (beyond it the particles coincide in float64)
MAX_KAPPA = 1e12


def check_particle_table(cfg: dict[str, Any]) -> None:
    """Check and normalise ``[particles]`` (in place; before the dimension is used)."""
    p = cfg["particles"]
    if p["n"] is None:
        changed = [k for k in p if p[k] != DEFAULTS["particles"][k]]
        if changed:
            raise ConfigError(
                "particles.n",
                f"required in a [particles] table (particles.{changed[0]} is set; the table "
                "makes the run mesh-free)",
            )
        return
    p["n"] = as_int(p["n"], "particles.n")
    if not 1 <= p["n"] <= MAX_PARTICLES:
        raise ConfigError("particles.n", f"must be in 1..{MAX_PARTICLES:,}, got {p['n']}")
    p["d"] = d = as_int(p["d"], "particles.d")
    if not 2 <= d <= MAX_D:
        raise ConfigError(
            "particles.d", f"must be in 2..{MAX_D} (the tokens lie on S^(d-1)), got {d}"
        )
    p["seed"] = as_int(p["seed"], "particles.seed")
    if p["seed"] < 0:
        raise ConfigError("particles.seed", f"must be >= 0, got {p['seed']}")
    law = p["initial"]
    for key, owner in (("centres", "vmf"), ("weights", "vmf"), ("file", "file")):
        if law != owner and p[key] != DEFAULTS["particles"][key]:
            raise ConfigError(
                f"particles.{key}", f'is for initial = "{owner}", not initial = "{law}"'
            )
    if law == "vmf":
        _vmf(p, d)
    elif law == "file":
        _file(p)


def _vmf(p: dict[str, Any], d: int) -> None:
    centres = p["centres"]
    if not isinstance(centres, list) or not centres:
        raise ConfigError("particles.centres", 'initial = "vmf" needs a list of d-vectors')
    rows = []
    for c, centre in enumerate(centres):
        key = f"particles.centres[{c}]"
        if not isinstance(centre, list) or len(centre) != d:
            raise ConfigError(key, f"must be a list of d = {d} numbers, got {centre!r}")
        x = np.array([as_float(v, key) for v in centre])
        norm = float(np.linalg.norm(x))
        if not (norm > 0 and math.isfinite(norm)):
            raise ConfigError(key, "must be a nonzero finite vector (a direction)")
        rows.append((x / norm).tolist())
    p["centres"] = rows
    k = len(rows)
    kappa = p["kappa"] if isinstance(p["kappa"], list) else [p["kappa"]] * k
    if len(kappa) != k:
        raise ConfigError(
            "particles.kappa", f"must be a number or a list of {k} numbers (one per centre)"
        )
    kappa = [as_float(v, "particles.kappa") for v in kappa]
    if not all(0 <= v <= MAX_KAPPA for v in kappa):
        raise ConfigError("particles.kappa", f"must be in [0, {MAX_KAPPA:g}], got {kappa}")
    p["kappa"] = kappa
    weights = p["weights"] or [1.0] * k
    if not isinstance(weights, list) or len(weights) != k:
        raise ConfigError("particles.weights", f"must be a list of {k} numbers (one per centre)")
    weights = [as_float(v, "particles.weights") for v in weights]
    if min(weights) < 0 or not sum(weights) > 0:
        raise ConfigError("particles.weights", "must be >= 0 with a positive sum")
    total = math.fsum(weights)
    p["weights"] = [w / total for w in weights]


def _file(p: dict[str, Any]) -> None:
    from solvers.transport import read_positions

    if not isinstance(p["file"], str) or not p["file"]:
        raise ConfigError("particles.file", 'initial = "file" needs the path of an .npy/.npz file')
    try:
        read_positions(p["file"], p["n"], p["d"])
    except ValueError as exc:
        raise ConfigError("particles.file", str(exc)) from None


def check_mesh_free_rules(cfg: dict[str, Any]) -> None:
    """The rules that tie a mesh-free run to the other tables (module docstring)."""
    if not mesh_free(cfg):
        return
    t = cfg["time"]
    if t["scheme"] != "particles":
        raise ConfigError(
            "time.scheme",
            f'a [particles] table is for time.scheme = "particles", got {t["scheme"]!r}',
        )
    if not t["dt"] > 0:
        raise ConfigError(
            "time.dt",
            "mesh-free particles ([particles]) take a fixed step: set time.dt > 0 (there is no "
            "mesh size for a CFL step)",
        )
    for section in ("mesh", "initial", "adapt"):
        for key, default in DEFAULTS[section].items():
            if cfg[section][key] != default:
                raise ConfigError(
                    f"{section}.{key}",
                    f"a mesh-free particle run ([particles] n) has no [{section}]: the "
                    "particles' law is particles.initial, the sphere S^(d-1) with d = particles.d",
                )
    if cfg["weights"]["dynamics"] == "fokker-planck":
        raise ConfigError(
            "weights.dynamics",
            "a law of weights on a parameter mesh drives mesh schemes, not mesh-free particles",
        )
