r"""[P3] with a ReLU feed-forward layer: how fast does the token measure leave the Gaussians?

Issue 18, item 5. In the Gaussian transformer of [P3] (docs/model.md, M3) tokens in R^d move
with self-attention plus a feed-forward layer,

    X[mu](x) = V ybar_mu(x) + F(x),
    ybar_mu(x) = int y e^{<Bx, y>} dmu(y) / int e^{<Bx, y>} dmu(y),

and with the affine layer F(x) = A x + b a Gaussian mu_0 stays Gaussian (the moment ODE of M3).
Here F(x) = max(A x + b, 0) componentwise (``[feedforward] activation = "relu"``; the particle
system ``GaussianParticles(..., activation="relu")``): the field is no longer affine on
Gaussians and mu_t leaves the Gaussian family.

The Gaussian moment flow G_t = N(m_t, S_t): the moment equations closed by taking mu_t
Gaussian (Stein's lemma E[(x - m) F^T] = S E[DF]^T),

    m' = V (m + S B m) + E_G[F],   S' = M S + S M^T,   M = V S B + E_G[DF],
    E_G[F_k] = mu_k Phi(mu_k / s_k) + s_k phi(mu_k / s_k),   E_G[DF] = diag(Phi(mu / s)) A,

with mu = A m + b, s_k^2 = (A S A^T)_kk; for the affine layer it is M3's moment ODE. G_t is
the flow of the statistically linearised layer A_t x + b_t, whose map at t = 0 is the
L2(mu_0)-projection Pi F of F onto affine maps.

Estimate (derived here: the full text of [P3] was not available to the project; its abstract
states Gaussian invariance for affine layers only). The flow map is T_t = id + t X_0 + O(t^2),
and the attention part of X_0 is affine on the Gaussian mu_0, so

    W2(mu_t, G_t) <= ||T_t - T_t^G||_{L2(mu_0)} = c1 t + O(t^2),
    c1 = ||F - Pi F||_{L2(mu_0)} = (sum_k Var F_k - tr(E[DF] S_0 E[DF]^T))^{1/2},

with equality in d = 1 (flow maps of the line are monotone, and W2 between two pushforwards
of mu_0 by monotone maps is the L2(mu_0) distance of the maps). The moment-matched Gaussian
N(mean mu_t, cov mu_t) has the moments of G_t up to O(t^2) (the first derivatives of the
moments agree at t = 0, where mu_0 = G_0), so the same holds for the distance D_mm to it:
the predicted orders are k = 1 for both distances (leading constant c1) and k = 2 for the
moment deviation |mean mu_t - m_t| + |cov mu_t - S_t|.

Setup (d = 1): mu_0 = N(0.2, 0.7^2), attention V = -0.5, B = 1 (Q = B, K = 1), F(x) =
max(x, 0), so c1 = 0.2046129. Measured three ways: (1) Lagrangian particles (GaussianParticles,
RK4, dt <= 0.005) at the nodes z_i of the trapezoidal rule for N(0, 1) on [-12, 12], x_i(0) =
m0 + s0 z_i, weights phi(z_i) normalised: since T_t is monotone, W2(mu_t, N(m, s^2))^2 =
sum_i w_i (x_i(t) - m - s z_i)^2 is the quadrature of the exact W2 (no sampling floor); (2) the
same particles with the affine layer (control: distance 0, moments = M3's ODE); (3) the
finite-volume solver of the CLI on a box [-5, 5] (``[feedforward] activation = "relu"``, MUSCL
+ SSP-RK3), W2 from the quantile function of the piecewise-constant density. Orders are
least-squares slopes of log D against log t over t <= 0.02 (t >= 1e-3).

Measured (defaults, N = 2401 particles, 1024 cells, 11 s): D_mm / t = 0.204640 at t = 1e-3
against c1 = 0.204613 (the straight line through D_mm / t extrapolates to 0.2046123); order
1.0007 (particles) and 1.0006 (mesh) over [1e-3, 0.02], the excess being the O(t^2) term;
moment deviation order 2.005 (|dm| + |dS| = 0.103 t^2 at t = 1e-3); affine control:
D_mm < 4e-15, moments within 1e-12 of M3's ODE; mesh and particles at t = 0.4: D_mm 0.084588
and 0.084591.

Source: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026): Gaussian invariance for affine feed-forward
layers, and practical networks staying near moment-matched Gaussians in early layers.

Run (defaults: about 15 s on one core; --tiny: seconds):

    mpiexec -n 4 python drivers/relu_feedforward.py
    python drivers/relu_feedforward.py
    python drivers/relu_feedforward.py --tiny --out results/relu_feedforward_tiny

Outputs in --out (default results/relu_feedforward): distances.csv (one row per time and
source: D_mm, D_flow, the moment deviations, the moments, c1 t), summary.json (c1, the fitted
orders, D/t at the smallest t, the affine control, mesh against particles), relu_feedforward.png
(distances against t on log-log axes with c1 t and C t^2; the final densities), final.npz
(the mesh density at t_end: points, weights, density, t).

Things to try:

- ``--bias 1.5``: the kink of the ReLU moves into the left tail of mu_0, F is nearly affine on
  the mass and c1 drops to 0.0267; the order stays 1 (measured 0.9993).
- ``--bias -1.5``: F vanishes on most of the mass; c1 = 0.0609 (order 0.9983).
- ``--n 401`` or ``--refinement 4`` (256 cells): the quadrature and the mesh are coarser;
  D / t still approaches c1 (the mesh floor W2(mu_0^h, mu_0) = O(h^2) shows at small t).
- In d = 2 (GaussianParticles with a 2 x 2 A) the map distance ||T_t - T_t^G|| is still
  c1 t + O(t^2), but it only bounds W2 from above.
"""

from __future__ import annotations

import sys
import time
from itertools import pairwise
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np
from scipy.integrate import solve_ivp
from scipy.special import ndtr, ndtri

from drivers._experiment import Experiment
from drivers._relu_feedforward_report import write_outputs
from drivers.engine import GatheredCells, Lockstep, build_problem, run_to, validate
from solvers.gaussian import Controls, GaussianParticles, solve_moments

comm = MPI.COMM_WORLD

#: mu_0 = N(M0, VAR0)
M0 = 0.2
VAR0 = 0.49
#: attention: value V, kernel e^{<B x, y>}
ATT_V = -0.5
ATT_B = 1.0
#: feed-forward: F(x) = max(FF_A x + bias, 0) (bias from --bias)
FF_A = 1.0
#: the box [-BOX, BOX] of the mesh solver
BOX = 5.0
#: the trapezoidal rule for N(0, 1) on [-Z_MAX, Z_MAX]
Z_MAX = 12.0
#: the largest RK4 step of the particles
DT_MAX = 0.005
#: the smallest output time and the end of the fit window
T_MIN = 1e-3
T_FIT = 0.02


def relu_expectations(
    A: np.ndarray, b: np.ndarray, m: np.ndarray, S: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E[F], E[F^2] (componentwise) and E[DF] of F(x) = max(A x + b, 0) under N(m, S).

    Args:
        A: (d, d) the matrix of the layer.
        b: (d,) its bias.
        m: (d,) the mean.
        S: (d, d) the covariance (positive semidefinite).

    Returns:
        ``(EF, EF2, EDF)``: (d,), (d,) and (d, d). A component with zero variance
        (s_k = 0) is deterministic: E[F_k] = max(mu_k, 0), E[DF_k] = 1{mu_k > 0} A_k.
    """
    mu = A @ m + b
    s = np.sqrt(np.maximum(np.einsum("ki,ij,kj->k", A, S, A), 0.0))
    pos = s > 0
    r = np.where(pos, mu / np.where(pos, s, 1.0), np.sign(mu) * np.inf)
    cdf = np.where(pos, ndtr(r), (mu > 0).astype(float))
    pdf = np.where(pos, np.exp(-0.5 * np.where(pos, r, 0.0) ** 2) / np.sqrt(2 * np.pi), 0.0)
    EF = mu * cdf + s * pdf
    EF2 = (mu**2 + s**2) * cdf + mu * s * pdf
    return EF, EF2, cdf[:, None] * A


def first_order_constant(A: np.ndarray, b: np.ndarray, m0: np.ndarray, S0: np.ndarray) -> float:
    """c1 = ||F - Pi F||_{L2(N(m0, S0))}: the L2 distance of the ReLU layer from affine maps.

    Pi F(x) = E F + E[DF] (x - m0) (Stein's lemma), so c1^2 = sum_k Var F_k - tr(E[DF] S0
    E[DF]^T); W2(mu_t, G_t) = c1 t + O(t^2) in d = 1 (module docstring).
    """
    EF, EF2, EDF = relu_expectations(A, b, m0, S0)
    return float(np.sqrt(max(np.sum(EF2 - EF**2) - np.trace(EDF @ S0 @ EDF.T), 0.0)))


def gaussian_moment_flow(
    A: np.ndarray,
    b: np.ndarray,
    V: np.ndarray,
    B: np.ndarray,
    m0: np.ndarray,
    S0: np.ndarray,
    times: np.ndarray,
    activation: str = "relu",
) -> tuple[np.ndarray, np.ndarray]:
    """The Gaussian moment flow G_t = N(m_t, S_t) at ``times`` (module docstring).

    Args:
        A, b: the feed-forward layer max(A x + b, 0) ("relu") or A x + b ("affine").
        V, B: the attention value matrix and the kernel matrix of e^{<B x, y>}.
        m0, S0: the initial mean (d,) and covariance (d, d).
        times: increasing output times from 0.
        activation: "relu" or "affine" (then it is M3's moment ODE).

    Returns:
        ``(m, S)`` of shapes (len(times), d) and (len(times), d, d).
    """
    d = len(m0)

    def rhs(t: float, y: np.ndarray) -> np.ndarray:
        m, S = y[:d], y[d:].reshape(d, d)
        S = 0.5 * (S + S.T)
        if activation == "relu":
            EF, _, EDF = relu_expectations(A, b, m, S)
        else:
            EF, EDF = A @ m + b, A
        M = V @ S @ B + EDF
        dm = V @ (m + S @ B @ m) + EF
        return np.concatenate([dm, (M @ S + S @ M.T).ravel()])

    y0 = np.concatenate([m0, S0.ravel()])
    sol = solve_ivp(
        rhs, (0.0, times[-1]), y0, t_eval=times, method="DOP853", rtol=1e-13, atol=1e-15
    )
    if not sol.success:
        raise RuntimeError(f"the Gaussian moment flow failed: {sol.message}")
    return sol.y[:d].T, sol.y[d:].T.reshape(-1, d, d)


def normal_rule(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The trapezoidal rule for N(0, 1) on [-Z_MAX, Z_MAX]: nodes z (n,), weights (n,), sum 1.

    Exact to rounding for the moments of a Gaussian (spectral accuracy of the trapezoidal
    rule for Gaussian-weighted analytic integrands); O(h^2) where the integrand has a kink.
    """
    z = np.linspace(-Z_MAX, Z_MAX, n)
    w = np.exp(-0.5 * z**2)
    return z, w / w.sum()


def particle_w2(x: np.ndarray, w: np.ndarray, z: np.ndarray, m: float, s: float) -> float:
    """W2(mu_t, N(m, s^2)) in d = 1 from Lagrangian particles x_i(t) = T_t(m0 + s0 z_i).

    T_t is monotone, so the quantile of mu_t at Phi(z_i) is x_i(t) and
    W2^2 = int (T_t(x) - m - s (x - m0) / s0)^2 dmu_0 = sum_i w_i (x_i - m - s z_i)^2.
    """
    return float(np.sqrt(w @ (x - m - s * z) ** 2))


def particle_distances(
    gp: GaussianParticles,
    z: np.ndarray,
    w: np.ndarray,
    ref: tuple[float, float],
    comm: MPI.Comm | None = None,
) -> tuple[float, float, float, float]:
    """Moments and distances of the particles of :func:`normal_rule` (d = 1; collective).

    Args:
        gp: particles started at m0 + s0 z (this rank's block, in order).
        z, w: the nodes and weights of all particles.
        ref: (mean, variance) of the reference Gaussian G_t.
        comm: the communicator of ``gp`` (None: serial).

    Returns:
        ``(m, S, D_mm, D_flow)``: mean, variance, W2 to the moment-matched Gaussian and W2
        to N(ref).
    """
    x = gp.points[:, 0]
    x = x if comm is None else np.concatenate(comm.allgather(x))
    mean, cov = gp.moments()
    m, S = float(mean[0]), float(cov[0, 0])
    D_mm = particle_w2(x, w, z, m, float(np.sqrt(S)))
    return m, S, D_mm, particle_w2(x, w, z, ref[0], float(np.sqrt(ref[1])))


def cell_moments(centres: np.ndarray, masses: np.ndarray, h: float) -> tuple[float, float]:
    """Mean and variance of the piecewise-constant density with cell ``masses`` (d = 1)."""
    p = masses / masses.sum()
    mean = float(p @ centres)
    return mean, float(p @ (centres - mean) ** 2 + h * h / 12.0)


def cell_w2(centres: np.ndarray, masses: np.ndarray, h: float, m: float, s: float) -> float:
    """W2 between the piecewise-constant density (cells of width h) and N(m, s^2), d = 1.

    W2^2 = int_0^1 (Q_h(u) - m - s Phi^-1(u))^2 du, Q_h the quantile function (linear in u
    on each cell); 8 Gauss-Legendre points per cell.
    """
    order = np.argsort(centres)
    c, p = centres[order], masses[order] / masses.sum()
    keep = p > 0
    lo = np.concatenate([[0.0], np.cumsum(p)])[:-1][keep]
    c, p = c[keep], p[keep]
    g, gw = np.polynomial.legendre.leggauss(8)
    u = lo[:, None] + p[:, None] * (g[None] + 1.0) / 2.0
    Q = (c - h / 2.0)[:, None] + (u - lo[:, None]) * h / p[:, None]
    f = (Q - m - s * ndtri(np.clip(u, 1e-300, 1.0 - 1e-16))) ** 2
    return float(np.sqrt(np.sum(p[:, None] / 2.0 * gw[None] * f)))


def fit_order(t: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of log(values) against log(t)."""
    return float(np.polyfit(np.log(t), np.log(values), 1)[0])


def mesh_config(refinement: int, bias: float, t_end: float) -> dict:
    """The run config of the mesh solver: R1 box, the head (B, 1, V), the ReLU layer."""
    return validate(
        {
            "mesh": {"manifold": "R1", "refinement": refinement, "lower": -BOX, "upper": BOX},
            "attention": {
                "beta": 1.0,
                "sign": 1,
                "backend": "brute",
                "heads": [{"Q": [[ATT_B]], "K": [[1.0]], "V": [[ATT_V]]}],
            },
            "feedforward": {"A": [[FF_A]], "b": bias, "activation": "relu"},
            "initial": {"density": f"exp(-0.5 * (x[0] - {M0!r}) ** 2 / {VAR0!r})"},
            "time": {"t_end": t_end, "scheme": "fv", "cfl": 0.4},
        }
    )


def summarise(
    rows: list[dict], times: np.ndarray, c1: float, bias: float, sizes: dict, outflow: float
) -> dict:
    """The content of summary.json: the setup (``bias``, ``sizes``: n_particles and cells),
    the fitted orders in t of the distances (over [T_MIN, T_FIT]) against the predicted
    ones, D/t against c1, the affine control, mesh against particles at t_end and the
    mesh's ``outflow``."""

    def series(source: str, key: str, t_max: float = T_FIT) -> tuple[np.ndarray, np.ndarray]:
        sel = [r for r in rows if r["source"] == source and 0 < r["t"] <= t_max * (1 + 1e-12)]
        return np.array([r["t"] for r in sel]), np.array([r[key] for r in sel])

    fits = {}
    for source in ("particles", "mesh"):
        fits[source] = {key: fit_order(*series(source, key)) for key in ("D_mm", "D_flow")}
    fits["particles"]["d_moments"] = fit_order(*series("particles", "d_moments"))
    t1, D1 = series("particles", "D_mm")
    tm, Dm = series("mesh", "D_mm")
    _, dmom = series("particles", "d_moments")
    last = {r["source"]: r for r in rows if r["t"] == times[-1]}
    summary = {
        "setup": {"m0": M0, "S0": VAR0, "V": ATT_V, "B": ATT_B, "A": FF_A, "bias": bias},
        **sizes,
        "times": times,
        "c1_predicted": c1,
        "predicted_order": {"D_mm": 1, "D_flow": 1, "d_moments": 2},
        "fit_window": [T_MIN, T_FIT],
        "order": fits,
        "D_mm_over_t_at_t_min": {"particles": D1[0] / t1[0], "mesh": Dm[0] / tm[0]},
        "D_mm_over_t_relative_to_c1": D1[0] / t1[0] / c1 - 1.0,
        # D/t = c1 + c2 t + ...: the intercept of a straight line through D/t over the window
        "D_mm_over_t_extrapolated_to_0": float(np.polyfit(t1, D1 / t1, 1)[1]),
        "d_moments_over_t2_at_t_min": dmom[0] / t1[0] ** 2,
        "affine_control": {
            "max_D_mm": max(r["D_mm"] for r in rows if r["source"] == "particles_affine"),
            "max_d_moments_vs_M3_ode": max(
                r["d_moments"] for r in rows if r["source"] == "particles_affine"
            ),
        },
        "mesh_vs_particles_t_end": {
            "D_mm": [last["mesh"]["D_mm"], last["particles"]["D_mm"]],
            "mean": [last["mesh"]["mean"], last["particles"]["mean"]],
            "var": [last["mesh"]["var"], last["particles"]["var"]],
        },
        "mesh_floor_D_mm_t0": rows[2]["D_mm"],
        "mesh_outflow": outflow,
    }
    return summary


def arguments(experiment: Experiment, argv: list[str] | None) -> Any:
    """The command line: --n, --refinement, --bias, --t-end (and --tiny, --out).

    Args:
        experiment: the experiment.
        argv: the command line.

    Returns:
        The parsed arguments.
    """
    parser = experiment.parser()
    parser.add_argument("--n", type=int, default=None, help="particles (default 2401; tiny 201)")
    parser.add_argument(
        "--refinement", type=int, default=None, help="mesh: 16 * 2^r cells (default 6; tiny 2)"
    )
    parser.add_argument("--bias", type=float, default=0.0, help="the bias b of max(A x + b, 0)")
    parser.add_argument("--t-end", type=float, default=None, help="final time (default 0.4)")
    return experiment.start(parser, argv)


def distance_row(t: float, source: str, m: float, S: float, D: Any, ref: tuple, c1: float) -> dict:
    """One row of distances.csv: distances ``D`` = (D_mm, D_flow), the moments (m, S) and
    their distance to the reference ``ref`` = (mean, variance)."""
    return {
        "t": t,
        "source": source,
        "D_mm": D[0],
        "D_flow": D[1],
        "d_mean": abs(m - ref[0]),
        "d_var": abs(S - ref[1]),
        "d_moments": abs(m - ref[0]) + abs(S - ref[1]),
        "mean": m,
        "var": S,
        "c1_t": c1 * t,
    }


def rows_at(
    t: float,
    mesh: Any,
    particles: dict[str, GaussianParticles],
    refs: dict[str, tuple],
    rule: tuple[np.ndarray, np.ndarray, float],
    c1: float,
) -> list[dict]:
    """The rows of distances.csv at the time t: each particle system, then the mesh solution
    (collective).

    Args:
        t: the time.
        mesh: the mesh scheme.
        particles: source -> particles at t.
        refs: source (and "mesh") -> the reference (mean, variance) at t.
        rule: the nodes z and weights w of the particles, the cell width h of the mesh.
        c1: the predicted first-order constant.

    Returns:
        One row per particle system, then the mesh's.
    """
    z, w, h = rule
    rows = []
    for source, gp in particles.items():
        m, S, *D = particle_distances(gp, z, w, refs[source], comm)
        rows.append(distance_row(t, source, m, S, D, refs[source], c1))
    pts, mass = mesh.measure()
    centres = np.concatenate(comm.allgather(pts[:, 0]))
    masses = np.concatenate(comm.allgather(mass))
    m, S = cell_moments(centres, masses, h)
    ref = refs["mesh"]
    sd = float(np.sqrt(ref[1]))
    D = (cell_w2(centres, masses, h, m, np.sqrt(S)), cell_w2(centres, masses, h, ref[0], sd))
    rows.append(distance_row(t, "mesh", m, S, D, ref, c1))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    args = arguments(experiment, argv)
    log = experiment.log
    n = args.n if args.n is not None else (201 if args.tiny else 2401)
    refinement = args.refinement if args.refinement is not None else (2 if args.tiny else 6)
    t_end = args.t_end if args.t_end is not None else (0.1 if args.tiny else 0.4)
    k_out = 7 if args.tiny else 14
    times = np.concatenate([[0.0], np.geomspace(T_MIN, t_end, k_out)])
    A, b = np.array([[FF_A]]), np.array([args.bias])
    V, B = np.array([[ATT_V]]), np.array([[ATT_B]])
    m0, S0 = np.array([M0]), np.array([[VAR0]])
    s0 = float(np.sqrt(S0[0, 0]))
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # The finite-volume solver of `transformer-pde run` on [-BOX, BOX] with the ReLU layer;
    # particles at m0 + s0 z_i (trapezoidal nodes of N(0, 1), each rank its block) with the
    # ReLU layer and (control) the affine one, RK4 steps of at most DT_MAX between outputs;
    # the predicted constant, the Gaussian moment flow (closure) and M3's ODE (control).
    problem = build_problem(mesh_config(refinement, args.bias, t_end), comm)
    scheme, cv = problem.scheme, problem.cv
    h = 2 * BOX / (16 * 2**refinement)
    cells = GatheredCells(cv)
    z, w = normal_rule(n)
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    x0 = (m0[0] + s0 * z[lo:hi])[:, None]
    c1 = first_order_constant(A, b, m0, S0)
    mG, SG = gaussian_moment_flow(A, b, V, B, m0, S0, times)
    controls = Controls.constant(A, B, V, b)
    ode = solve_moments(controls, m0, S0, t_end, t_eval=times)
    log(f"c1 = ||F - Pi F||_L2(mu_0) = {c1:.7f}; predicted W2(mu_t, G_t) = c1 t + O(t^2)")
    particles = {
        source: GaussianParticles(controls, x0, w[lo:hi], comm=comm, activation=activation)
        for source, activation in (("particles", "relu"), ("particles_affine", "affine"))
    }
    counts = [max(1, int(np.ceil((t1 - t0) / DT_MAX))) for t0, t1 in pairwise(times)]
    for gp in particles.values():
        gp.plan_steps(times, counts)

    # %% Main loop
    # ------------
    # The mesh solution and the particles to every output time (the engine's loop, steps
    # landing on them); there the rows: the affine control is compared with M3's ODE, the
    # rest with the closure G_t.
    rows: list[dict] = []

    def output(s: Any, result: object = None) -> None:
        k = len(rows) // 3  # three rows per output time
        closure = (mG[k, 0], SG[k, 0, 0])
        refs = {"particles": closure, "particles_affine": (ode.m[k, 0], ode.S[k, 0, 0])}
        rows.extend(rows_at(times[k], scheme, particles, {**refs, "mesh": closure}, (z, w, h), c1))
        if k:
            r, t = rows[-3], times[k]
            log(
                f"t = {t:.4g}: D_mm/t = {r['D_mm'] / t:.6f} (particles), "
                f"{rows[-1]['D_mm'] / t:.6f} (mesh); |dm|+|dS| / t^2 = {r['d_moments'] / t**2:.5f}"
            )

    output(scheme)
    run_to(Lockstep([scheme, *particles.values()]), times[-1], comm, times[1:], output)

    # %% Summary
    # ----------
    sizes = {"n_particles": n, "cells": cv.n_global}
    summary = summarise(rows, times, c1, args.bias, sizes, scheme.outflow)
    summary["wall_s"] = time.perf_counter() - wall0
    fits = summary["order"]
    log(
        f"order of D_mm: {fits['particles']['D_mm']:.4f} (particles), {fits['mesh']['D_mm']:.4f} "
        f"(mesh); of the moments: {fits['particles']['d_moments']:.3f}; "
        f"D/t at t = {T_MIN:g}: {summary['D_mm_over_t_at_t_min']['particles']:.6f} vs "
        f"c1 = {c1:.6f}"
    )
    density = cells.gather(scheme.density)
    if comm.rank == 0:
        closure, kink = (mG[-1, 0], SG[-1, 0, 0]), -args.bias / FF_A
        write_outputs(experiment, args.out, rows, summary, cells, density, closure, c1, kink)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
