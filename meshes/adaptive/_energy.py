r"""An energy-conserving correction of the masses carried onto an adapted mesh.

The energy of a run is evaluated by cell-centre quadrature,
:math:`E_h = \frac{1}{2\beta H}\sum_h \sum_{i,j} m_i m_j k_h(x_i, x_j)`. Splitting a cell
spreads its mass over its children's centres; for an attractive kernel (``k`` largest at
coincident points) this lowers the quadrature by about :math:`\beta\, m^2 \sigma^2` per cell
(``sigma`` the spread of the children's centres), so every refinement of a cluster lowers
``E_h`` a little: a jump the energy budget has no term for (docs/adaptivity.md). The jump is
of the order of the quadrature error, :math:`O(h^2)`.

Merging the cells that a moving cluster empties puts their mass (skewed towards the cluster)
at the parent's centre and lowers ``E_h`` too.

The correction redistributes mass among the new cells of each changed patch (group ``g``:
a split leaf with its children, or a merged leaf with the leaves under its parent; the caller
chooses them), along the first variation :math:`\varphi = \delta E / \delta m` of the energy:

.. math::

    \delta_c = m_c\,\frac{\varphi_c - \bar\varphi_g}{D},\qquad
    \bar\varphi_g = \frac{\sum_{c \in g} m_c \varphi_c}{\sum_{c \in g} m_c},\qquad
    D = \max_c |\varphi_c - \bar\varphi_g|,

so :math:`\sum_{c\in g}\delta_c = 0` (every patch keeps its mass) and :math:`|\delta_c| \le
m_c`; the new masses are :math:`m + \alpha\delta` with :math:`|\alpha| \le` ``max_step`` < 1
(densities stay >= (1 - max_step) times the transferred ones, > 0 where those are).
:math:`E_h(m + \alpha\delta)` is a quadratic in :math:`\alpha` (the kernel sums are bilinear
in the masses), fitted exactly from its values at :math:`\alpha = 0, \pm` ``max_step``;
:math:`\alpha` is its root nearest 0 of :math:`E_h = E_{target}` (the energy before the
adaptation), or the point of ``[-max_step, max_step]`` nearest to it when there is none.
Moving mass by at most a cell diameter, the correction changes the measure by
:math:`O(|\alpha|\,\|\delta\|\,h)` in W1; since :math:`\alpha\,\|\delta\|` only needs to
offset an :math:`O(h^2)` jump with a first variation whose spread over a cell is
:math:`O(h)`, it is an :math:`O(h)` relative change of the cell masses inside each patch:
the order of the limited linear profile itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["EnergyCorrection", "energy_correction"]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class EnergyCorrection:
    """The result of :func:`energy_correction`.

    Attributes:
        masses: the corrected owned cell masses.
        alpha: the step along the direction (0: no correction).
        energy_before: the energy of the uncorrected masses.
        energy_after: the predicted energy of the corrected ones (the quadratic fit).
    """

    masses: Array
    alpha: float
    energy_before: float
    energy_after: float


def energy_correction(
    comm: MPI.Comm,
    masses: Array,
    group: IntArray,
    potential: Array,
    energy: Callable[[Array], float],
    target: float,
    max_step: float = 0.5,
) -> EnergyCorrection:
    """Masses of the patches moved along the first variation of the energy so that
    the energy equals ``target`` (module docstring). Collective.

    Args:
        comm: the communicator of the cells.
        masses: (n_owned,) cell masses after the transfer (>= 0).
        group: (n_owned,) per cell the index (>= 0, the same on every rank for one group)
            of the patch it belongs to; -1 for cells that may not change.
        potential: (n_owned,) the first variation of the energy at the cells (any positive
            multiple).
        energy: ``energy(masses)``, the energy of owned cell masses (collective).
        target: the energy to reach.
        max_step: the largest ``|alpha|``, in (0, 1).

    Returns:
        An :class:`EnergyCorrection`; every group keeps its mass (to round-off).

    Raises:
        ValueError: ``max_step`` outside (0, 1) or arrays of different lengths.
    """
    if not 0 < max_step < 1:
        raise ValueError(f"max_step must be in (0, 1), got {max_step}")
    m = np.asarray(masses, dtype=np.float64)
    g = np.asarray(group, dtype=np.int64)
    phi = np.asarray(potential, dtype=np.float64)
    if not (len(m) == len(g) == len(phi)):
        raise ValueError("masses, group and potential must have one value per owned cell")
    sel = g >= 0
    n_groups = comm.allreduce(int(g.max(initial=-1)) + 1, op=MPI.MAX)
    e0 = energy(m)
    if n_groups == 0:
        return EnergyCorrection(m, 0.0, e0, e0)
    sums = np.zeros((2, n_groups))
    sums[0] = np.bincount(g[sel], weights=m[sel] * phi[sel], minlength=n_groups)
    sums[1] = np.bincount(g[sel], weights=m[sel], minlength=n_groups)
    comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    mean = np.divide(sums[0], sums[1], out=np.zeros(n_groups), where=sums[1] > 0)
    d = np.zeros(len(m))
    d[sel] = phi[sel] - mean[g[sel]]
    D = comm.allreduce(float(np.abs(d).max(initial=0.0)), op=MPI.MAX)
    if not D > 0:
        return EnergyCorrection(m, 0.0, e0, e0)
    delta = m * d / D
    c = max_step
    e_plus, e_minus = energy(m + c * delta), energy(m - c * delta)
    a = (e_plus - e_minus) / (2 * c)
    b = (e_plus + e_minus - 2 * e0) / (2 * c * c)
    alpha = _nearest_root(e0 - target, a, b, c)
    return EnergyCorrection(m + alpha * delta, alpha, e0, e0 + a * alpha + b * alpha * alpha)


def _nearest_root(r: float, a: float, b: float, c: float) -> float:
    """The root of ``r + a x + b x^2`` nearest 0 in [-c, c], or the point of [-c, c] where
    ``|r + a x + b x^2|`` is smallest when there is none."""
    candidates: list[float] = []
    if abs(b) > 1e-300:
        disc = a * a - 4 * b * r
        if disc >= 0:
            s = math.sqrt(disc)
            q = -0.5 * (a + math.copysign(s, a)) if a != 0 else 0.5 * s
            roots = [q / b, r / q] if q != 0 else [0.0]
            candidates = [x for x in roots if abs(x) <= c]
    elif a != 0:
        candidates = [x for x in [-r / a] if abs(x) <= c]
    if candidates:
        return min(candidates, key=abs)
    points = [-c, c] + ([-a / (2 * b)] if abs(b) > 1e-300 and abs(a / (2 * b)) <= c else [])
    return min(points, key=lambda x: (abs(r + a * x + b * x * x), abs(x)))
