"""``transformer-pde gaussian CONFIG.toml [--out DIR]``: the moment ODE of docs/model.md, M3 alone.

The config has one table:

    [gaussian]
    A = [[...]]    B = [[...]]    V = [[...]]     (d x d, "identity" or "zero" allowed)
    b = [...]      m0 = [...]     S0 = [[...]]    (S0 symmetric positive semidefinite)
    t_end = 2.0
    outputs = 201  (number of output times)

Writes moments.csv (t, m_i, S_ij, eigenvalues), summary.json (classification of the
time-invariant parameters, blow-up time with its bracket) and moments.png. Exit codes as for
``run``: 0 completed; 2 invalid input (one line naming the key); 3 blow-up detected (t* and its
bracket reported, everything up to it written, never NaN).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from drivers.engine._config import ConfigError, as_float, as_int, as_matrix, as_vector, read_toml
from drivers.engine._provenance import provenance
from drivers.engine._schema import GAUSSIAN_KEYS
from drivers.engine.io import write_json

__all__ = ["load_gaussian_config", "run_gaussian"]

_KEYS = tuple(k.name for k in GAUSSIAN_KEYS)
_DEFAULT = {k.name: k.default for k in GAUSSIAN_KEYS}


def load_gaussian_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    raw = read_toml(path, overrides)
    extra = [s for s in raw if s != "gaussian"]
    if extra or "gaussian" not in raw:
        hint = (
            " (a run config: run it with `transformer-pde run CONFIG.toml`)"
            if set(extra) & {"mesh", "attention", "time", "initial", "weights", "output"}
            else ""
        )
        raise ConfigError(
            extra[0] if extra else "gaussian", f"expected exactly one table [gaussian]{hint}"
        )
    g = raw["gaussian"]
    for key in g:
        if key not in _KEYS:
            raise ConfigError(f"gaussian.{key}", f"unknown key (known: {', '.join(_KEYS)})")
    if "m0" not in g:
        raise ConfigError("gaussian.m0", "missing (the initial mean, a list of d numbers)")
    d = len(g["m0"]) if isinstance(g["m0"], list) else 1
    cfg = {
        k: as_matrix(g.get(k, _DEFAULT[k]), d, f"gaussian.{k}", allow_zero=True).tolist()
        for k in ("A", "B", "V")
    }
    cfg["b"] = as_vector(g.get("b", _DEFAULT["b"]), d, "gaussian.b")
    cfg["m0"] = as_vector(g["m0"], d, "gaussian.m0")
    S0 = as_matrix(g.get("S0", _DEFAULT["S0"]), d, "gaussian.S0")
    if not np.allclose(S0, S0.T) or np.linalg.eigvalsh(0.5 * (S0 + S0.T))[0] < -1e-12:
        raise ConfigError("gaussian.S0", "must be symmetric positive semidefinite")
    cfg["S0"] = S0.tolist()
    cfg["t_end"] = as_float(g.get("t_end", _DEFAULT["t_end"]), "gaussian.t_end")
    if not cfg["t_end"] > 0:
        raise ConfigError("gaussian.t_end", f"must be > 0, got {cfg['t_end']}")
    cfg["outputs"] = as_int(g.get("outputs", _DEFAULT["outputs"]), "gaussian.outputs")
    if cfg["outputs"] < 2:
        raise ConfigError("gaussian.outputs", "must be >= 2")
    return cfg


def run_gaussian(
    cfg: dict[str, Any], out: Path, verbose: bool = True, argv: list[str] | None = None
) -> int:
    """Solve, write the outputs; returns the exit code (0, or 3 on a detected blow-up)."""
    from solvers.gaussian import Controls, classify, solve_moments

    A, B, V = (np.array(cfg[k]) for k in ("A", "B", "V"))
    b, m0, S0 = np.array(cfg["b"]), np.array(cfg["m0"]), np.array(cfg["S0"])
    sol = solve_moments(
        Controls.constant(A, B, V, b),
        m0,
        S0,
        cfg["t_end"],
        t_eval=np.linspace(0.0, cfg["t_end"], cfg["outputs"]),
    )
    cls = classify(A, B, V, S0)
    out.mkdir(parents=True, exist_ok=True)
    d = len(m0)
    cols = ["t"] + [f"m{i}" for i in range(d)] + [f"S{i}{j}" for i in range(d) for j in range(d)]
    cols += [f"lambda{i}" for i in range(d)]
    with open(out / "moments.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for t, m, S in zip(sol.t, sol.m, sol.S, strict=True):
            w.writerow([repr(float(v)) for v in [t, *m, *S.ravel(), *np.linalg.eigvalsh(S)]])
    bu = sol.blowup
    summary = {
        "config": cfg,
        "provenance": provenance(argv),
        "status": "ok" if bu is None else "blow-up",
        "classification": {"regime": cls.regime, "condition": cls.condition},
        "t_final": float(sol.t[-1]),
        "m_final": sol.m[-1],
        "S_final": sol.S[-1],
        "blowup": None
        if bu is None
        else {
            "t_star": bu.t_star,
            "bracket": [bu.t_lo, bu.t_hi],
            "reason": bu.reason,
            "message": bu.message,
        },
    }
    write_json(out / "summary.json", summary)
    _plot(out / "moments.png", sol)
    if verbose:
        print(f"[transformer-pde gaussian] {cls.regime}: {cls.condition}", flush=True)
    if bu is not None:
        print(
            f"transformer-pde: blow-up at t* = {bu.t_star:.10g} in [{bu.t_lo:.10g}, {bu.t_hi:.10g}] "
            f"({bu.reason}); outputs up to t = {sol.t[-1]:.6g} in {out}",
            flush=True,
        )
        return 3
    return 0


def _plot(path: Path, sol: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = np.array([np.linalg.eigvalsh(S) for S in sol.S])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    a1.plot(sol.t, sol.m)
    a1.set_title("mean m(t)")
    a2.semilogy(sol.t, np.maximum(ev, 1e-300))
    a2.set_title("eigenvalues of S(t)")
    if sol.blowup is not None:
        a2.axvline(sol.blowup.t_star, color="r", ls="--", label=f"t* = {sol.blowup.t_star:.6g}")
        a2.legend()
    for ax in (a1, a2):
        ax.set_xlabel("t")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
