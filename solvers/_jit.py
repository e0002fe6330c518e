"""One compiled specialisation per kernel: inputs reach numba as read-only arrays.

numba compiles a kernel once per argument type, and an array's type includes whether it is
writeable. Cached tables (quadratures, Legendre coefficients) are read-only on purpose, the
tokens handed out by :class:`solvers.attention.Attention` are too, while arrays computed on
the fly are not; without care a kernel is compiled twice, or four times with two such
arguments (measured on a cold cache: the three sphere-basis entry points and their helper
took 28 s to compile as 12 specialisations, 14 s as the 4 they need). Passing every *input*
through :func:`read_only` gives one specialisation; outputs stay writeable.
"""

from __future__ import annotations

import numpy as np

__all__ = ["read_only"]


def read_only(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Read-only views of the arrays (no copies; the arrays themselves are left as they are)."""
    views = []
    for array in arrays:
        view = array.view()
        view.flags.writeable = False
        views.append(view)
    return tuple(views)
