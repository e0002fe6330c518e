"""The ``[attention]`` and ``[weights]`` tables of a run config: the heads and their dynamics.

Checked by :func:`drivers.engine.validate` (here, after ``[mesh]``, which fixes the dimension
d): ``beta > 0``, ``tolerance`` in (0, 1), ``diffusion >= 0``, ``sign`` +1 or -1, a non-empty
list of heads {Q, K, V, seed} whose products beta Q^T K (and, for evolving weights, Q^T K +
K^T Q and V + V^T) are finite; the weights' seed, noise ``sigma`` in [0, MAX_SIGMA], step
``dt > 0``, random phases only for oscillating weights, a law of weights
(:mod:`drivers.engine._weights_config`), and heads with V symmetric and Q^T K = V for weights
that evolve D = V = Q^T K from the config.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivers.engine._config import MAX_SIGMA, ConfigError, as_float, as_int, head_matrix

__all__ = ["check_attention", "check_weights"]


def check_attention(cfg: dict[str, Any], d: int) -> None:
    """Check ``[attention]`` (in place) for tokens in R^d."""
    a = cfg["attention"]
    a["beta"] = as_float(a["beta"], "attention.beta")
    if not a["beta"] > 0:
        raise ConfigError("attention.beta", f"must be > 0, got {a['beta']}")
    a["tolerance"] = as_float(a["tolerance"], "attention.tolerance")
    if not 0 < a["tolerance"] < 1:
        raise ConfigError("attention.tolerance", f"must be in (0, 1), got {a['tolerance']}")
    a["diffusion"] = as_float(a["diffusion"], "attention.diffusion")
    if not a["diffusion"] >= 0:
        raise ConfigError(
            "attention.diffusion", f"must be >= 0 (0: no noise), got {a['diffusion']}"
        )
    if isinstance(a["sign"], bool) or a["sign"] not in (1, -1):
        raise ConfigError("attention.sign", f"must be +1 or -1, got {a['sign']!r}")
    a["sign"] = int(a["sign"])
    if not isinstance(a["heads"], list) or not a["heads"]:
        raise ConfigError("attention.heads", "must be a non-empty list of tables {Q, K, V}")
    for h, head in enumerate(a["heads"]):
        if not isinstance(head, dict):
            raise ConfigError(f"attention.heads[{h}]", "must be a table {Q, K, V}")
        for k in head:
            if k not in ("Q", "K", "V", "seed"):
                raise ConfigError(
                    f"attention.heads[{h}].{k}", "unknown key (expected Q, K, V, seed)"
                )
        if "seed" in head and as_int(head["seed"], f"attention.heads[{h}].seed") < 0:
            raise ConfigError(f"attention.heads[{h}].seed", f"must be >= 0, got {head['seed']}")
        Q, K, V = (head_matrix(head, h, k, d) for k in ("Q", "K", "V"))
        with np.errstate(all="ignore"):  # overflow is the finding, reported below
            products = [a["beta"] * (Q.T @ K)]
            if cfg["weights"]["dynamics"] != "frozen":  # evolving weights symmetrise D
                products += [V + V.T, Q.T @ K + (Q.T @ K).T]
        if not all(np.all(np.isfinite(x)) for x in products):
            raise ConfigError(
                f"attention.heads[{h}]",
                "beta Q^T K (or, for evolving weights, Q^T K + K^T Q or V + V^T) overflows "
                "float64: scale the matrices or beta down",
            )


def check_weights(cfg: dict[str, Any], d: int) -> None:
    """Check ``[weights]`` (in place) for the heads of ``[attention]`` in R^d."""
    a = cfg["attention"]
    w = cfg["weights"]
    w["seed"] = as_int(w["seed"], "weights.seed")
    if w["seed"] < 0:
        raise ConfigError("weights.seed", "must be >= 0")
    w["sigma"] = as_float(w["sigma"], "weights.sigma")
    if not 0 <= w["sigma"] <= MAX_SIGMA:
        raise ConfigError(
            "weights.sigma",
            f"must be in [0, {MAX_SIGMA:g}] (a larger noise overflows the kernel "
            f"exp(beta x^T D y) within one weight step), got {w['sigma']}",
        )
    w["dt"] = as_float(w["dt"], "weights.dt")
    if not w["dt"] > 0:
        raise ConfigError("weights.dt", f"must be > 0, got {w['dt']}")
    if w["phases"] == "random" and w["dynamics"] != "oscillating":
        raise ConfigError(
            "weights.phases",
            f'random phases are for dynamics = "oscillating", not {w["dynamics"]!r}',
        )
    if w["dynamics"] == "fokker-planck":
        from drivers.engine._weights_config import check_weight_law

        check_weight_law(w, cfg, d)
    if w["dynamics"] not in ("frozen", "fokker-planck") and w["init"] == "config":
        from solvers.attention import Head
        from solvers.weights import config_matrices

        for h, head in enumerate(a["heads"]):
            Q, K, V = (head_matrix(head, h, k, d) for k in ("Q", "K", "V"))
            try:  # the solver's own check (same tolerances)
                config_matrices([Head(Q, K, V)])
            except ValueError:
                raise ConfigError(
                    f"attention.heads[{h}]",
                    f"weights.dynamics = {w['dynamics']!r} evolves D = V = Q^T K: needs V symmetric "
                    'and Q^T K = V (or set weights.init = "random")',
                ) from None
