r"""The dense block of the JKO Newton system: the Hessian of the interaction energy.

For the energy of docs/model.md, M1 with kernel rows :math:`A_r` (the :math:`A_h`, and their
transposes when not symmetric) and coefficient :math:`c`,

.. math::
    \frac{\delta E}{\delta \mu}(x_K) = c \sum_r \sum_L e^{x_K^T A_r x_L} m_L
    =: (\mathcal{K} m)_K

is linear in the cell masses :math:`m`, so the Hessian is the dense operator
:math:`\mathcal{K}`. Two ways to apply it to a signed mass increment :math:`\delta m`, neither
forming an :math:`N \times N` array:

* :class:`KernelHessian` - kernel sums of the distributed masses
  (:meth:`solvers.attention.DistributedSources.kernel_sums`, never gathered; they need masses
  :math:`\ge 0`): :math:`\mathcal{K}\delta m = \mathcal{K}(\delta m + \gamma |\cdot|)
  - \gamma \mathcal{K}|\cdot|` with :math:`|\cdot|` the cell measures and
  :math:`\gamma = \max(0, \max_L -\delta m_L / |L|)`; :math:`\mathcal{K}|\cdot|` is computed
  once per set of heads. One kernel sum (:math:`O(N^2)`) per product.
* :class:`ExpansionHessian` - a truncated expansion in the orthonormal basis
  :math:`(Y_a)` of the polynomials of degree :math:`\le p` on the sphere of
  :mod:`solvers.attention.sphere_basis` (real spherical harmonics on :math:`S^2`, Fourier modes on
  :math:`S^1`): :math:`k(x, y) \approx \sum_{a, b} Y_a(x) C_{ab} Y_b(y)` with
  :math:`C = \Phi_Q^T W K_{QQ} W \Phi_Q` (its product quadrature :math:`(q, w)`, exact to
  degree :math:`2p`; :math:`K_{QQ}` the kernel at the nodes; computed by factorised
  projections).
  The degree-:math:`l` part of :math:`e^{x^T A y}` decays like
  :math:`(\|A\|/2)^l / l!`, so the truncation error is below the tolerance for modest
  :math:`p` (:math:`p = 18` for :math:`\|A\| = 3, 4`, 22 for 6, 24 for 8); the error is
  *measured* on a set of sample pairs, :math:`p` increased by 2 until it is below ``tol``
  times the largest kernel value. The basis values :math:`\Phi = (Y_a(x_K))` of the owned
  cells are stored, :math:`R \times n_{owned}`, :math:`R = (p + 1)^2`, and a product
  :math:`\Phi^T C \Phi\, \delta m` is two BLAS matrix-vector products (``dgemv``, one
  thread per rank: :mod:`solvers.threads`) and one allreduce of :math:`R` numbers:
  :math:`O(N R)`, bound by the memory traffic of reading :math:`\Phi` twice (measured
  2.5-3x faster than the compiled loops over the stored basis that it replaced, levels
  5-7, one thread; ``benchmarks/jko.py --products``).

The operator applies the Jacobian's dense block. With the expansion, ``_scheme`` also
evaluates residuals as :math:`\delta E(\rho^k) + \mathcal{K}_p (m - m^k)` (exact kernel sum at
:math:`\rho^k` only): the solution then differs from the exact-kernel one by at most the
checked relative error (1e-12) times :math:`|m - m^k|_1 = O(\tau)`, far below the Newton
tolerance (``tests/test_jko.py`` compares the two to 1e-9). The basis matrix is
:math:`R \times n_{owned}` (237 MB at 81,920 cells, p = 18, one rank); when the basis of the
whole mesh (:math:`R \times N` doubles) exceeds ``MAX_BASIS_BYTES`` (4 GiB), or the degree
``MAX_DEGREE``, "auto" falls back to kernel sums. The choice depends on the global size only,
so every rank count solves the same discrete problem. With BLAS products the stored basis
beats the kernel sums (the attention's backend, which re-evaluates the basis or the
transforms every time) where it fits: level 8 (1,310,720 cells, p = 18: 3.8 GB for the whole
mesh) on 2 ranks, 2.0-2.4x less time in the dense block and 1.4x a step, at 4.7 instead of
2.9 GB per rank (measured, ``benchmarks/jko.py --levels 8 --max-basis-gb 4``), hence the
limit of 4 GiB (it was 1 GiB).
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.special

from meshes.control_volumes import ControlVolumes
from solvers.attention import DistributedSources, sphere_basis

__all__ = ["ExpansionHessian", "KernelHessian", "make_hessian"]

Array = npt.NDArray[np.float64]

#: Largest expansion degree tried, and the largest basis matrix kept per rank (bytes).
MAX_DEGREE = 40
MAX_BASIS_BYTES = 4 * 2**30


class KernelHessian:
    """Exact matrix-free products with the dense kernel block (one kernel sum each)."""

    kind = "kernel"

    def __init__(
        self,
        cv: ControlVolumes,
        points: Array,
        sources: DistributedSources,
        A: Array,
        coef: float,
        backend: str,
    ) -> None:
        self._targets = points[: cv.n_owned]
        self._sources, self._A, self._coef, self._backend = sources, A, coef, backend
        self._comm = cv.comm
        self._meas = np.array(cv.measures[: cv.n_owned], dtype=np.float64)
        self._ref = self._sum(self._meas)
        self.products = 0

    def _sum(self, masses_owned: Array) -> Array:
        out = self._sources.kernel_sums(self._targets, masses_owned, self._A, self._backend)
        return self._coef * np.exp(out.log_Z).sum(axis=0)

    def apply(self, dm_owned: Array) -> Array:
        """(K dm) at the owned centres for owned signed mass increments (collective; the
        sums never gather the measure: a shift by gamma times the cell measures makes the
        masses >= 0)."""
        self.products += 1
        dm = np.asarray(dm_owned, dtype=np.float64)
        local = np.array(
            [max(0.0, float(np.max(-dm / self._meas, initial=0.0))), np.abs(dm).max(initial=0.0)]
        )
        self._comm.Allreduce(MPI.IN_PLACE, local, op=MPI.MAX)
        gamma, size = float(local[0]), float(local[1])
        if size == 0.0:
            return np.zeros(len(self._targets))
        if gamma == 0.0:
            return self._sum(dm)
        return self._sum(dm + gamma * self._meas) - gamma * self._ref


def _kernel(x: Array, y: Array, A: Array, coef: float) -> Array:
    return coef * sum(np.exp((x @ A_r) @ y.T) for A_r in A)


class ExpansionHessian:
    """Products with the kernel block through a checked low-rank harmonic expansion."""

    kind = "expansion"

    def __init__(
        self,
        cv: ControlVolumes,
        points: Array,
        A: Array,
        C: Array,
        degree: int,
        error: float,
        basis: Array | None = None,
    ) -> None:
        """C: the checked coefficients of :func:`checked_expansion` for these A and degree."""
        self.degree, self.error, self._comm = degree, error, cv.comm
        C = 0.5 * (C + C.T) if np.array_equal(A, A.swapaxes(1, 2)) else C
        self._C = np.ascontiguousarray(C)
        if basis is None:
            basis = sphere_basis.basis_values(points[: cv.n_owned], degree)
        self.basis = np.ascontiguousarray(basis)  # (R, n_owned), rows contiguous
        self.basis.flags.writeable = False
        self.products = 0

    @property
    def rank(self) -> int:
        return self._C.shape[0]

    def apply(self, dm_owned: Array) -> Array:
        r"""(K dm) at the owned centres (collective: one allreduce of R numbers).

        Two matrix-vector products with the stored basis (BLAS ``dgemv``, one thread per
        rank: :mod:`solvers.threads`): the moments :math:`\Phi\, \delta m` and the values
        :math:`\Phi^T (C \mu)`."""
        self.products += 1
        dm = np.ascontiguousarray(dm_owned, dtype=np.float64)
        moments = self.basis @ dm
        if self._comm.size > 1:
            moments = self._comm.allreduce(moments, op=MPI.SUM)
        return (self._C @ moments) @ self.basis


def _coefficients(d: int, A: Array, coef: float, degree: int) -> Array:
    """C = Phi_Q^T W K_QQ W Phi_Q, the (R, R) expansion coefficients (module docstring), by
    the factorised projections of :func:`solvers.attention.sphere_basis.project`."""
    nodes, _ = sphere_basis.quadrature(d, degree)
    projected = sphere_basis.project(_kernel(nodes, nodes, A, coef), degree, d)  # in y
    return np.ascontiguousarray(sphere_basis.project(projected.T, degree, d).T)  # then in x


def checked_expansion(
    d: int, A: Array, coef: float, degree: int, n_sample: int = 200
) -> tuple[float, Array]:
    """The coefficients C and their error max |k - k_p| / max |k| over fixed sample pairs
    (identical on every rank)."""
    rng = np.random.default_rng(12345)
    x = rng.normal(size=(n_sample, d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    C = _coefficients(d, A, coef, degree)
    Y = sphere_basis.basis_values(x, degree)
    exact = _kernel(x, x, A, coef)
    return float(np.max(np.abs(Y.T @ C @ Y - exact)) / np.max(np.abs(exact))), C


def _lower_estimate(sigma: float, degree: int) -> float:
    """2 e^{-sigma} I_{p+1}(sigma): the first omitted Chebyshev coefficient of e^{sigma t} on
    [-1, 1] relative to its maximum, a pre-filter for the degree. The measured error of the
    expansion of e^{x^T A y}, ||A|| = sigma, was 4-8x above it (sigma = 3 .. 32, p = 14 .. 40;
    e.g. sigma = 32: 2e-3 .. 5e-12 for p = 18 .. 40, so no degree <= MAX_DEGREE is tried at
    beta = 32 instead of 17 checks costing 20 s). A wrong skip only means kernel sums."""
    return 2.0 * float(scipy.special.ive(degree + 1, sigma))


def make_hessian(
    kind: str,
    cv: ControlVolumes,
    points: Array,
    sources: DistributedSources,
    A: Array,
    coef: float,
    backend: str,
    tol: float = 1e-12,
    previous: KernelHessian | ExpansionHessian | None = None,
) -> KernelHessian | ExpansionHessian:
    """Build the Hessian operator: kind "kernel", "expansion" or "auto" (module docstring).

    "expansion" raises ValueError if no degree <= MAX_DEGREE (its basis for the whole mesh within MAX_BASIS_BYTES)
    reaches ``tol``; "auto" then falls back to "kernel". With time-dependent heads the
    ``previous`` expansion's degree is tried first and its basis reused. Collective.
    """
    if kind not in ("kernel", "expansion", "auto"):
        raise ValueError(f"hessian must be 'kernel', 'expansion' or 'auto', got {kind!r}")
    if kind == "kernel":
        return KernelHessian(cv, points, sources, A, coef, backend)
    if isinstance(previous, ExpansionHessian):
        error, C = checked_expansion(cv.d, A, coef, previous.degree)
        if error <= tol:
            return ExpansionHessian(cv, points, A, C, previous.degree, error, previous.basis)
    # the method depends on the global size only (never on the number of ranks): the stored
    # basis of the whole mesh within MAX_BASIS_BYTES, else kernel sums (which the attention's
    # backend evaluates by the distributed low-rank expansion where its bound allows)
    n_total = cv.n_global
    error, degree = math.inf, 0
    sigma = max(float(np.linalg.norm(A_r, 2)) for A_r in A)
    for degree in range(8, MAX_DEGREE + 1, 2):
        if n_total * sphere_basis.basis_size(cv.d, degree) * 8 > MAX_BASIS_BYTES:
            break
        if _lower_estimate(sigma, degree) > tol:
            continue  # not worth the check (its cost grows like degree^4)
        error, C = checked_expansion(cv.d, A, coef, degree)
        if error <= tol:
            return ExpansionHessian(cv, points, A, C, degree, error)
    if kind == "auto":
        return KernelHessian(cv, points, sources, A, coef, backend)
    raise ValueError(
        f"no harmonic expansion of degree <= {degree} reaches the tolerance {tol:.1e} "
        f"(error {error:.2e}): use hessian='kernel'"
    )
