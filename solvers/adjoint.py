"""The forward map and its discrete adjoint, under the path of the first version.

A kept public path (the first version's acceptance checks import ``solvers.adjoint``): the
names are those of :mod:`solvers.training`, where the code lives (``_adjoint``); new code
imports them from there.
"""

from solvers.training import (
    AdjointGradient,
    ForwardSolution,
    TokenTransportModel,
    softmax_sums,
    softmax_transposed_sums,
)

__all__ = [
    "AdjointGradient",
    "ForwardSolution",
    "TokenTransportModel",
    "softmax_sums",
    "softmax_transposed_sums",
]
