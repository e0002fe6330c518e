r"""Poincare and log-Sobolev constants of a 1-D Gibbs measure on a box (issue 18, [P2] sec. 8).

The mean-field Langevin training (:class:`solvers.training.MeanFieldTraining`) relaxes the head
law :math:`\rho` towards the proximal Gibbs measure
:math:`\pi_\rho \propto e^{-U/\kappa}`, :math:`U = \delta L/\delta\rho[\rho]`. For a convex
loss, if every :math:`\pi_\rho` on the flow satisfies the log-Sobolev inequality

.. math::
    \mathrm{Ent}_\pi(f^2) \le 2 C_{LS} \int |f'|^2\, d\pi

then :math:`\mathcal{F}(\rho_s) - \mathcal{F}^* \le e^{-2\kappa s / C_{LS}}
(\mathcal{F}(\rho_0) - \mathcal{F}^*)` (Nitanda-Wu-Suzuki 2022, Chizat 2022). The Poincare
constant :math:`C_P` (:math:`\mathrm{Var}_\pi f \le C_P \int |f'|^2 d\pi`) is never larger:
:math:`C_P \le C_{LS}`, and for a fixed potential the asymptotic rate of
:math:`\mathcal{F} - \mathcal{F}^*` is :math:`2\gamma`, :math:`\gamma = \kappa / C_P` the
spectral gap of the Fokker-Planck operator. Known cases: the Gaussian
:math:`N(0, \sigma^2)` has :math:`C_P = C_{LS} = \sigma^2` (Gross); the uniform law on an
interval of length :math:`\ell` has :math:`C_P = C_{LS} = \ell^2/\pi^2` (Neumann spectral
gap; the interval is the even part of the circle, where Weissler's LSI constant equals the
gap).

Discretisation. The measure and the Dirichlet form are those of the Scharfetter-Gummel
scheme of the solver: cells with centres :math:`\theta_i` (sorted), volumes :math:`|K_i|`,
masses :math:`m_i = |K_i| \pi_i`, and the edge weights :math:`c_i = a_i \pi_i`,
:math:`a_i = \kappa B(-Pe_i)/d_i`, :math:`Pe_i = -(U_{i+1} - U_i)/\kappa` (detailed balance
:math:`a_i \pi_i = b_i \pi_{i+1}`), so that the step of the solver is
:math:`M \dot f = -K f` for :math:`\rho = \pi f`, with K the graph Laplacian of c, and

.. math::
    \mathcal{E}(f) = \frac1\kappa \sum_i c_i (f_{i+1} - f_i)^2, \qquad
    C_P = \sup \frac{\mathrm{Var}_m f}{\mathcal{E}(f)} = \frac{\kappa}{\gamma}, \qquad
    C_{LS} = \sup \frac{\mathrm{Ent}_m(f^2)}{2\mathcal{E}(f)}.

:math:`\gamma` is the second eigenvalue of the symmetric tridiagonal
:math:`M^{-1/2} K M^{-1/2}` (assembled without forming :math:`\pi`, stable for tiny
:math:`\kappa`). :math:`C_{LS}` is estimated from below by maximising the ratio over
:math:`f = e^u` (L-BFGS from several amplitudes along the Poincare eigenfunction); the
limit of small amplitude is :math:`C_P`, so the estimate is at least :math:`C_P`. Two
classical upper bounds are reported alongside: Holley-Stroock
:math:`C_{LS} \le (\ell^2/\pi^2) e^{\mathrm{osc}\,U/\kappa}` (perturbation of the uniform law
on the box of length :math:`\ell`) and Bakry-Emery :math:`C_{LS} \le \kappa/\min U''` where
U is strictly convex (None otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.linalg import eigh_tridiagonal
from scipy.optimize import minimize

__all__ = [
    "GibbsConstants",
    "gibbs_constants",
    "gibbs_free_energy",
    "loss_hessian",
    "linearised_rate",
    "lsi_rate",
    "spectral_rate",
]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GibbsConstants:
    r"""Functional-inequality constants of the discrete Gibbs measure :math:`e^{-U/\kappa}/Z`.

    Attributes:
        gap: :math:`\gamma`, the spectral gap of the Fokker-Planck operator (rate of rho).
        poincare: :math:`C_P = \kappa/\gamma`.
        lsi: the estimate of :math:`C_{LS}` (a lower bound, the best ratio found; >= C_P).
        lsi_ratio: lsi / poincare (1 for Gaussians and the uniform law).
        holley_stroock_log10: :math:`\log_{10}` of the Holley-Stroock upper bound.
        bakry_emery: the Bakry-Emery upper bound, None where U is not strictly convex.
        eigenfunction: (n,) the Poincare eigenfunction f_1 (input order, max |f_1| = 1 on the
            cells of non-negligible mass).
        optimiser: (n,) the maximiser f of the LSI ratio found (input order, mean-square 1).
    """

    gap: float
    poincare: float
    lsi: float
    lsi_ratio: float
    holley_stroock_log10: float
    bakry_emery: float | None
    eigenfunction: Array
    optimiser: Array


def _bernoulli(z: Array) -> Array:
    """B(z) = z / (e^z - 1), B(0) = 1, without overflow (as solvers.weights.bernoulli)."""
    out = np.ones_like(z)
    nz = z != 0.0
    with np.errstate(over="ignore"):
        out[nz] = z[nz] / np.expm1(z[nz])
    return out


def _lsi_ratio(u: Array, m: Array, c: Array) -> tuple[float, Array]:
    """-Ent_m(f^2) / (2 E(f)) for f = exp(u - max u), and its gradient in u."""
    f = np.exp(u - u.max())
    f2 = f * f
    S = float(m @ f2)
    logf2 = 2.0 * (u - u.max())
    ent = float(m @ (f2 * logf2)) - S * math.log(S)
    df = np.diff(f)
    E = float(c @ (df * df))
    if E <= 0.0:
        return 0.0, np.zeros_like(u)
    gE = np.zeros_like(f)
    gE[:-1] -= 2.0 * c * df
    gE[1:] += 2.0 * c * df
    gEnt = 2.0 * m * f * (logf2 - math.log(S))
    g = -(gEnt * E - ent * gE) / (2.0 * E * E) * f  # chain rule df/du = f
    return -ent / (2.0 * E), g - g.mean()  # the ratio is invariant under u -> u + const


def gibbs_constants(
    theta: Array,
    U: Array,
    kappa: float,
    volumes: Array,
    *,
    amplitudes: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0),
) -> GibbsConstants:
    r"""Poincare and log-Sobolev constants of :math:`e^{-U/\kappa}` on 1-D cells (module doc).

    Args:
        theta: (n,) or (n, 1) cell centres (any order; distinct).
        U: (n,) the potential at the cells.
        kappa: the temperature :math:`\kappa > 0`.
        volumes: (n,) cell lengths (the box length is their sum).
        amplitudes: starting amplitudes a (both signs) of u = a f_1 for the LSI search.

    Returns:
        The :class:`GibbsConstants`.

    Raises:
        ValueError: on inconsistent shapes, non-finite values or kappa <= 0.
    """
    theta = np.asarray(theta, dtype=np.float64).reshape(len(theta), -1)
    U, vol = np.asarray(U, dtype=np.float64), np.asarray(volumes, dtype=np.float64)
    n = len(theta)
    if theta.shape[1] != 1 or U.shape != (n,) or vol.shape != (n,) or n < 3:
        raise ValueError("need n >= 3 one-dimensional cells with n potentials and volumes")
    if not (math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"kappa must be finite and > 0, got {kappa}")
    if not (np.all(np.isfinite(U)) and np.all(np.isfinite(theta)) and np.all(vol > 0)):
        raise ValueError("theta, U must be finite and the volumes > 0")
    order = np.argsort(theta[:, 0])
    x, Uo, vo = theta[order, 0], U[order], vol[order]
    d = np.diff(x)
    if np.any(d <= 0):
        raise ValueError("the cell centres must be distinct")
    pe = -np.diff(Uo) / kappa
    a = kappa / d * _bernoulli(-pe)  # flux a rho_i - b rho_(i+1), b = kappa / d B(pe)
    b = kappa / d * _bernoulli(pe)
    # M^(-1/2) K M^(-1/2): off-diagonal -c_i / sqrt(m_i m_(i+1)) = -a_i e^(-pe_i/2) / sqrt(v v')
    half = 0.5 * pe
    with np.errstate(over="ignore", invalid="ignore"):
        sym = np.where(half != 0, half / np.sinh(half), 1.0)
    off = -(kappa / d) * sym / np.sqrt(vo[:-1] * vo[1:])
    diag = np.zeros(n)
    diag[:-1] += a / vo[:-1]
    diag[1:] += b / vo[1:]
    w, v = eigh_tridiagonal(diag, off, select="i", select_range=(0, 1))
    gap = float(w[1])
    poincare = kappa / gap
    # the Gibbs masses (normalised) and the Dirichlet weights c_i / kappa
    logpi = -(Uo - Uo.min()) / kappa
    m = vo * np.exp(logpi)
    Z = float(m.sum())
    m /= Z
    c = a * np.exp(logpi[:-1]) / Z / kappa
    heavy = m > 1e-12 * m.max()
    f1 = v[:, 1] / np.sqrt(np.maximum(m, 1e-300))
    f1 = np.clip(f1 / np.abs(f1[heavy]).max(), -1.0, 1.0)
    best, best_u = poincare, f1 * 1e-3
    for amp in amplitudes:
        for sign in (1.0, -1.0):
            res = minimize(
                _lsi_ratio,
                sign * amp * f1,
                args=(m, c),
                jac=True,
                method="L-BFGS-B",
                options={"maxiter": 300},
            )
            if np.isfinite(res.fun) and -res.fun > best:
                best, best_u = float(-res.fun), res.x
    fopt = np.exp(best_u - best_u.max())
    fopt /= math.sqrt(float(m @ fopt**2))
    U2 = np.diff(Uo[1:] - Uo[:-1]) / (0.5 * (d[1:] + d[:-1])) / (0.5 * (d[1:] + d[:-1]))
    ell = float(vo.sum())
    inv = np.empty(n, dtype=np.intp)
    inv[order] = np.arange(n)
    return GibbsConstants(
        gap=gap,
        poincare=poincare,
        lsi=best,
        lsi_ratio=best / poincare,
        holley_stroock_log10=2 * math.log10(ell / math.pi)
        + float(np.ptp(Uo)) / kappa / math.log(10.0),
        bakry_emery=kappa / float(U2.min()) if U2.min() > 0 else None,
        eigenfunction=f1[inv],
        optimiser=fopt[inv],
    )


def lsi_rate(constant: float, kappa: float, ds: float | None = None) -> float:
    r"""The rate :math:`2\kappa/C` of :math:`\mathcal{F} - \mathcal{F}^*` guaranteed by an LSI
    (or, with ``constant = C_P``, the asymptotic rate of a fixed potential).

    Args:
        constant: C_LS (or C_P).
        kappa: the entropy weight.
        ds: the implicit step; then :math:`\log(1 + 2\kappa\,ds/C)/ds`, the rate of the
            one-step contraction :math:`(1 + 2\kappa\,ds/C)^{-1}` of an implicit (JKO-type)
            step under the LSI.

    Returns:
        The rate per unit training time.
    """
    r = 2.0 * kappa / constant
    return r if ds is None else math.log1p(r * ds) / ds


def spectral_rate(gap: float, ds: float | None = None) -> float:
    r"""The asymptotic rate :math:`2\gamma` of :math:`\mathcal{F} - \mathcal{F}^*` for a
    fixed potential, :math:`2\log(1 + \gamma\,ds)/ds` with implicit Euler steps ds.

    Args:
        gap: the spectral gap :math:`\gamma`.
        ds: the implicit step (None: continuous time).

    Returns:
        The rate per unit training time.
    """
    return 2.0 * gap if ds is None else 2.0 * math.log1p(gap * ds) / ds


def _fp_matrix(x: Array, U: Array, kappa: float, vol: Array) -> Array:
    """A with dw/ds = -A w for the masses w_i = |K_i| rho_i (sorted 1-D cells, SG fluxes)."""
    d = np.diff(x)
    pe = -np.diff(U) / kappa
    a, b = kappa / d * _bernoulli(-pe), kappa / d * _bernoulli(pe)
    n = len(x)
    i = np.arange(n - 1)
    A = np.zeros((n, n))  # J_i = a_i w_i / v_i - b_i w_(i+1) / v_(i+1) leaves i, enters i+1
    A[i, i] += a / vol[i]
    A[i, i + 1] -= b / vol[i + 1]
    A[i + 1, i] -= a / vol[i]
    A[i + 1, i + 1] += b / vol[i + 1]
    return A


def linearised_rate(
    theta: Array, U: Array, kappa: float, volumes: Array, hessian: Array, ds: float
) -> float:
    r"""Asymptotic rate of :math:`\mathcal{F} - \mathcal{F}^*` of the linearly implicit step
    at its fixed point, for a potential that depends on rho (nonlinear loss).

    The step is :math:`w^{j+1} = (I + \Delta s A(U_j))^{-1} w^j`, :math:`U_j = U(w^j)`; at the
    Gibbs fixed point :math:`w^*` of :math:`U^*` its Jacobian on mass-zero perturbations is
    :math:`T = (I + \Delta s A^*)^{-1} (I - \Delta s\, \partial_U(A w^*)\, H)`, H the Hessian
    :math:`\partial U / \partial w` (the second variation of L; 0 for a linear loss, where the
    result is :func:`spectral_rate`). Returns :math:`-2 \log \max|\mathrm{eig}\, T| / \Delta s`.

    Args:
        theta: (n,) or (n, 1) cell centres (any order).
        U: (n,) the potential at the fixed point.
        kappa: the entropy weight.
        volumes: (n,) cell lengths.
        hessian: (n, n) :math:`\partial U_i / \partial w_j` (same order as theta).
        ds: the training step.

    Returns:
        The rate per unit training time.
    """
    theta = np.asarray(theta, dtype=np.float64).reshape(len(theta), -1)
    o = np.argsort(theta[:, 0])
    x, Uo, vo = theta[o, 0], np.asarray(U, float)[o], np.asarray(volumes, float)[o]
    H = np.asarray(hessian, dtype=np.float64)[np.ix_(o, o)]
    n = len(x)
    A = _fp_matrix(x, Uo, kappa, vo)
    w = vo * np.exp(-(Uo - Uo.min()) / kappa)
    w /= w.sum()
    eps = 1e-6 * kappa
    B = np.empty((n, n))
    for j in range(n):  # d(A(U) w*)/dU_j, central differences (A is smooth in U)
        e = np.zeros(n)
        e[j] = eps
        B[:, j] = (_fp_matrix(x, Uo + e, kappa, vo) - _fp_matrix(x, Uo - e, kappa, vo)) @ w
    B /= 2 * eps
    T = np.linalg.solve(np.eye(n) + ds * A, np.eye(n) - ds * B @ H)
    Q = np.linalg.qr(np.eye(n)[:, :-1] - np.eye(n)[:, 1:])[0]  # basis of sum-zero vectors
    lam = np.abs(np.linalg.eigvals(Q.T @ T @ Q)).max()
    return -2.0 * math.log(lam) / ds


def loss_hessian(training: Any, eps: float = 1e-6) -> Array:
    r"""The Hessian :math:`\partial U_i / \partial w_j` of L in the head weights (collective).

    Central differences of the adjoint gradient U of
    :class:`solvers.training.MeanFieldTraining` (its ``model.gradient``) in each weight,
    symmetrised; the ``hessian`` of :func:`linearised_rate`.

    Args:
        training: the training at (near) its fixed point.
        eps: the difference step in the weights.

    Returns:
        The (n, n) Hessian (input order of the cells).
    """
    w = training.weights
    n = len(w)
    H = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = eps
        gp = training.model.gradient(w + e, training.loss).gradient
        gm = training.model.gradient(w - e, training.loss).gradient
        H[:, j] = (gp - gm) / (2 * eps)
    return 0.5 * (H + H.T)


def gibbs_free_energy(training: Any) -> float:
    r"""The free energy :math:`\mathcal{F}^*` of the discrete Gibbs law of a loss that is
    linear in the head law (a :class:`solvers.training.PotentialLoss` readout in one layer).

    Then :math:`L(w) = c + w \cdot U` with U the training's current potential, and the
    minimiser of :math:`\mathcal{F}_h = L + \kappa \sum_k |K_k| \rho_k \log\rho_k` over
    the cell laws is :math:`g \propto e^{-U/\kappa}` (normalised in the cell volumes), so
    :math:`\mathcal{F}^* = c + \sum_k |K_k| g_k U_k + \kappa \sum_k |K_k| g_k \log g_k`,
    with :math:`c = L - w \cdot U` at the current state. For a loss that depends on rho
    nonlinearly this is the free energy of the current proximal Gibbs law only.

    Args:
        training: a :class:`solvers.training.MeanFieldTraining`.

    Returns:
        :math:`\mathcal{F}^*`.
    """
    U, kappa, vol = training.state.potential, training.kappa, training.volumes
    g = np.exp(-(U - U.min()) / kappa)
    g /= g @ vol
    const = training.state.loss - training.weights @ U
    return const + vol @ (g * U) + kappa * vol @ (g * np.log(g))
