r"""[P1] on S^2: stability of the multi-head attention flow in its input data and its weights.

Tokens x in S^2 under constant heads (I, D_h, D_h) (docs/model.md, M1; the heads of
drivers/paper1_ou_s2.py at t = 0: D_h = Z + Z^T, ``random_symmetric(H, 3, [seed, H, 0])``),
beta = 1, s = -1 (also s = +1 below), head weights w_h = 1/H:

    X[mu](x) = s sum_h w_h P_x V_h ybar_h(x),   ybar_h(x) = int y e^{beta <x, A_h y>} dmu(y) / Z_h(x),

A_h = Q_h^T K_h, P_x = I - x x^T. With a_h = ||A_h||_2, v_h = ||V_h||_2 and chordal distances
(solvers/diagnostics/_stability.py and docs/model.md derive them):

    L_x = sum_h w_h v_h (1 + beta a_h)          Lipschitz constant of x -> X[mu](x), any mu,
    L   = 2 sum_h w_h v_h (1 + beta a_h)        d/dt max_i |x_i - y_i| <= L max_i |x_i - y_i|,
    L_W1 = L_x + sum_h w_h v_h e^{2 beta a_h} (1 + 2 beta a_h)   W1 of general measures.

(a) Input perturbation. Particles (RK4, dt = 0.01, T = 6): n = 200 tokens at the octahedron
vertices with N(0, 0.05^2) noise (as [P1]); a copy moved by a random unit tangent step delta in
{1e-2, 1e-3, 1e-4} per token; H in {1, 3}, s in {-1, +1}. Recorded every 0.1: max_i and mean_i
|x_i - y_i|, the assignment W1, beside the bound e^{L t} d(0) (L ~ 40-90 here). Measured
exponents: max_t log(d(t)/d(0))/t, the largest log-slope between records, the least-squares
slope. Mesh (MUSCL + SSP-RK3, fixed step 0.005 so that both runs take the same steps; level 3,
1,280 cells, T = 3): the six caps exp(10 x.(+-e_k)) of [P1]'s mesh runs, and the same density
plus delta phi, phi = (g - rho)/||g - rho||_1, delta in {1e-2, 1e-3}, for an odd tilt
g ~ e^{2 x_3} (breaks the symmetry x -> -x of the caps, the kernel and the mesh) and an even
one g ~ e^{2 x_3^2}; recorded: L1(t) every 0.1 and the W1 of the cell measures every 0.5. The
e^{Lt} bound is proved for W1 through the coupling (and W_infinity), not for L1: the L1 rate of
a nonlocal continuity equation also involves ||grad rho||_1, so L1 is reported, not bounded.

(b) Weight perturbation and weight decay. The same tokens, s = -1, T = 15 (G^2 < 1e-20 at
T: settled), heads D_h + eps B_h (B_h random symmetric, ||B_h||_2 = ||D_h||_2) and
D_h / (1 + lambda), eps = lambda in {0.1, 0.03, 0.01, 0.003}: W1(mu_T^eps, mu_T^0) and
|E_eps(mu_T^eps) - E_0(mu_T^0)|, E(mu) = (1/(2 beta H)) sum_h int int e^{beta <x, D_h y>},
against eps, fitted rates; and the rest point predicted for a single cluster (delta_x at rest
iff x is an eigenvector of Vbar = mean_h V_h; x: the smallest eigenvalue for s = -1).

Measured (drivers/README.md): every distance stays far below e^{Lt} d(0) (for t > 0,
d(t) e^{-Lt} / d(0) <= 0.02); the largest measured exponents (per record interval 0.1) are
1.6-14 for the particles and 3.0-5.2 for the L1 distance of the odd mesh perturbation, 6-26
times below L. The odd mesh perturbation grows to O(1) (L1 up to 2, W1 up to 1.2 at T = 3):
the caps, the kernel and the mesh are symmetric under x -> -x and the unperturbed density keeps
that unstable symmetry; the even one stays O(delta). (b) Every long-time state is one cluster
at the predicted rest point (to 1e-12); W1 and the energy gap fall like eps^1.04-1.09 (local
slopes 1.01-1.02 between the two smallest eps); weight decay does not move the state
(W1 < 2e-13: Vbar / (1 + lambda) has the same eigenvectors) and moves the energy like
lambda^1.01-1.05. For H = 3 the rest point is not a minimiser of E (a single cluster
elsewhere has 11 % less energy): the flow is not the gradient flow of E for several heads.

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026).

Run (defaults: about 3 minutes of one core, measured with NUMBA_NUM_THREADS=1):

    mpiexec -n 4 python drivers/paper1_stability_s2.py
    mpiexec -n 2 python drivers/paper1_stability_s2.py
    python drivers/paper1_stability_s2.py --tiny                 # seconds
    python drivers/paper1_stability_s2.py --mesh-heads --eps 0.1 0.01 0.001

Outputs in ``--out`` (default results/paper1_stability_s2): input_perturbation.png (log of
d(t)/d(0) for every run beside L t), weight_perturbation.png (W1 and the energy gap against
eps, log-log, with the predicted rest points), input_particles.csv and input_mesh.csv (one row
per record), exponents.csv (one row per input run), weights.csv (one row per long run),
rates.csv (the fitted rates), summary.json and final.npz (the unperturbed mesh density at T:
points, weights, density, t; the unperturbed long-time tokens of the last H: particle_points,
particle_masses, particle_t).

Things to try:

- ``--signs 1`` (input runs only; the weight study keeps s = -1): tokens ascend the energy.
  Which eigenvector of Vbar do they settle at, and how large is the early growth?
- ``--beta 0.3``: L falls with beta a_h; do the measured exponents follow it?
- ``--eps 0.3 1 3``: large weight perturbations. The rate 1 of (b) rests on a simple smallest
  eigenvalue of Vbar_eps (the rest point moves like eps / gap); watch the rate where two
  eigenvalues come close (a perturbation B aligned to close the gap shows it best).
- ``--mesh-level 4 --mesh-dt 0.0025``: does the growth rate of the odd perturbation of the
  symmetric caps, and the damping of the even one, depend on the mesh?
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._paper1 import caps_expression, octahedron_tokens
from drivers._stability import (
    plot_input,
    plot_weights,
    rates,
    write_final_state,
    write_tables,
)
from drivers.engine import GatheredCells, Lockstep, run_to
from meshes import ControlVolumes, control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, Head, gather_measure, measure_diagnostics
from solvers.diagnostics import (
    LipschitzBound,
    decayed_heads,
    dirac_energy,
    distances,
    lipschitz_bound,
    min_dirac_energy,
    perturbed_heads,
    rest_point,
    sampled_lipschitz,
    tangent_perturbation,
    transport_w1,
    two_point_measure,
)
from solvers.transport import ParticleSystem, TransportSolver, initial_density
from solvers.weights import FrozenWeights, random_symmetric

TITLE = "[P1] stability on S^2"
#: The tilts g of the mesh perturbation: odd (breaks x -> -x) and even.
TILTS = {"odd": "exp(2 * x[2])", "even": "exp(2 * x[2] * x[2])"}


def heads_of(D: np.ndarray) -> list[Head]:
    """Heads (I, D_h, D_h)."""
    return [Head(np.eye(D.shape[1]), Dh, Dh) for Dh in D]


def input_particles(
    args: argparse.Namespace,
    attention: Attention,
    heads: list[Head],
    x0: np.ndarray,
    bound: LipschitzBound,
) -> list[dict]:
    """The unperturbed tokens and one copy per delta, stepped together; distances per record.

    Args:
        args: the command line (deltas, t_end, dt, record_dt, seed).
        attention: beta, the sign and the kernel backend.
        heads: the constant heads.
        x0: the (n, 3) unperturbed tokens (the same on every rank; split over the ranks).
        bound: the Lipschitz constants of the heads (L gives the bound column).

    Returns:
        Rows (H, sign, delta, t, d_max, d_mean, w1, log_bound) on rank 0, [] elsewhere.
    """
    comm = MPI.COMM_WORLD
    n = len(x0)
    mine = np.array_split(np.arange(n), comm.size)[comm.rank]
    starts = [x0] + [tangent_perturbation(x0, delta, [args.seed, 11]) for delta in args.deltas]
    weights, masses = FrozenWeights(heads), np.full(n, 1.0 / n)
    systems = [
        ParticleSystem(attention, weights, x[mine], masses[mine], comm=comm, dt=args.dt)
        for x in starts
    ]
    n_steps, every = round(args.t_end / args.dt), max(1, round(args.record_dt / args.dt))
    rows: list[dict] = []
    d0: dict[float, float] = {}

    def record(t: float) -> None:
        points = [gather_measure(comm, s.points, s.masses)[0] for s in systems]
        if comm.rank != 0:
            return
        for delta, p in zip(args.deltas, points[1:], strict=True):
            dist = distances(p, points[0])
            d0.setdefault(delta, dist["d_max"])
            log_bound = math.log(d0[delta]) + bound.L * t
            row = {"H": len(heads), "sign": attention.sign, "delta": delta, "t": t, **dist}
            rows.append({**row, "log_bound": log_bound})

    # all copies on the grid k dt (Lockstep), stopping every few steps and at the last
    ks = [k for k in range(1, n_steps + 1) if k % every == 0 or k == n_steps]
    record(0.0)
    if ks:
        times = [k * args.dt for k in ks]
        run_to(Lockstep(systems), times[-1], comm, times, lambda s, r: record(s.t))
    return rows


def input_mesh(
    args: argparse.Namespace,
    cv: ControlVolumes,
    gathered: GatheredCells,
    attention: Attention,
    heads: list[Head],
    bound: LipschitzBound,
) -> tuple[list[dict], np.ndarray | None, bool]:
    """The six caps and their odd/even perturbations on the mesh, with the same fixed steps.

    Args:
        args: the command line (kappa, mesh_deltas, mesh_t_end, mesh_dt, cfl, record_dt,
            w1_every).
        cv: the control volumes of the icosphere.
        gathered: its cells on rank 0.
        attention: beta, the sign and the kernel backend.
        heads: the constant heads.
        bound: the Lipschitz constants of the heads (L_W1 gives the W1 bound column).

    Returns:
        Rows (H, kind, delta, t, l1, w1, log_bound_w1) and the unperturbed final density on
        rank 0 ([] and None elsewhere), and whether every run took the same steps.
    """
    n = cv.n_owned
    measures = cv.measures[:n]
    rho = initial_density(cv, caps_expression(args.kappa))
    starts, labels = [rho], [("", 0.0)]
    for kind, expression in TILTS.items():
        phi = initial_density(cv, expression) - rho
        phi /= cv.comm.allreduce(float(np.sum(np.abs(phi) * measures)))
        for delta in args.mesh_deltas:
            if cv.comm.allreduce(bool(np.any(rho + delta * phi < 0.0)), op=MPI.LOR):
                raise ValueError(f"rho + {delta:g} phi ({kind}) is negative somewhere")
            starts.append(rho + delta * phi)
            labels.append((kind, delta))
    weights = FrozenWeights(heads)
    solvers = [
        TransportSolver(cv, attention, weights, s, cfl=args.cfl, dt_max=args.mesh_dt)
        for s in starts
    ]
    n_records = max(1, round(args.mesh_t_end / args.record_dt))
    w1_every = max(1, round(args.w1_every / args.record_dt))
    times = [r * args.mesh_t_end / n_records for r in range(n_records + 1)]
    rows: list[dict] = []
    w1_0: dict[tuple[str, float], float] = {}
    centres = gathered.points
    recorded: list[float] = []

    def record(*_: object) -> None:  # at times[r], r = the records so far
        r, t_record = len(recorded), times[len(recorded)]
        recorded.append(t_record)
        dens = [gathered.gather(s.density) for s in solvers]
        if cv.comm.rank != 0:
            return
        ref = dens[0] * gathered.weights
        for label, rho_k in zip(labels[1:], dens[1:], strict=True):
            mass = rho_k * gathered.weights
            l1 = math.fsum(np.abs(mass - ref))
            w1 = (
                transport_w1(centres, mass, ref)
                if r % w1_every == 0 or r == n_records
                else math.nan
            )
            w1_0.setdefault(label, w1)
            log_bound = math.log(max(w1_0[label], 1e-300)) + bound.L_w1 * t_record
            row = {"H": len(heads), "kind": label[0], "delta": label[1], "t": t_record, "l1": l1}
            rows.append({**row, "w1": w1, "log_bound_w1": log_bound})

    # every run reaches a record time in turn (Lockstep), then the record
    record()
    run_to(Lockstep(solvers), times[-1], cv.comm, times[1:], record)
    same_steps = len({s.steps for s in solvers}) == 1
    final = gathered.gather(solvers[0].density)
    return rows, final, same_steps


def long_run(
    args: argparse.Namespace, attention: Attention, heads: list[Head], x0: np.ndarray
) -> dict:
    """The tokens from x0 to t_long under frozen heads: final points (gathered), E and G^2.

    Args:
        args: the command line (t_long, dt).
        attention: beta, the sign and the kernel backend.
        heads: the constant heads.
        x0: the (n, 3) initial tokens (split over the ranks).

    Returns:
        {"points": the (n, 3) final tokens on every rank, "energy": E, "G2": G^2} at t_long.
    """
    comm = MPI.COMM_WORLD
    n = len(x0)
    mine = np.array_split(np.arange(n), comm.size)[comm.rank]
    masses = np.full(n, 1.0 / n)
    weights = FrozenWeights(heads)
    system = ParticleSystem(attention, weights, x0[mine], masses[mine], comm=comm, dt=args.dt)
    n_steps = round(args.t_long / args.dt)
    if n_steps > 0:
        run_to(system, n_steps * args.dt, comm)  # the grid k dt
    diag = measure_diagnostics(attention, heads, system.points, system.masses, comm)
    points = gather_measure(comm, system.points, system.masses)[0]
    return {"points": points, "energy": diag.energy, "G2": diag.G2}


def weight_study(
    args: argparse.Namespace,
    attention: Attention,
    D: np.ndarray,
    x0: np.ndarray,
    log: Callable[[str], None],
) -> tuple[list[dict], np.ndarray]:
    """Long runs with heads D_h + eps B_h and D_h / (1 + eps) against the unperturbed one.

    Args:
        args: the command line (eps, t_long, dt, seed).
        attention: beta, the sign and the kernel backend.
        D: the (H, 3, 3) symmetric matrices of the unperturbed heads (I, D_h, D_h).
        x0: the (n, 3) initial tokens.
        log: prints on rank 0.

    Returns:
        Rows (H, kind, eps, w1, d_max, dE, energy, G2, spread, w1_predicted, dE_predicted,
        off_rest_point; the unperturbed run is the row of kind "none", eps 0) and the
        unperturbed final tokens (every rank: the rows are computed everywhere).
    """
    H = len(D)
    beta = attention.beta
    base = long_run(args, attention, heads_of(D), x0)
    centre = base["points"].mean(axis=0)
    x_star0 = rest_point(heads_of(D), attention.sign, centre)
    e_star0 = dirac_energy(heads_of(D), beta, x_star0)
    rows: list[dict] = []

    def row(kind: str, eps: float, heads: list[Head], run: dict) -> dict:
        p, p0 = run["points"], base["points"]
        x_star = rest_point(heads, attention.sign, x_star0)
        spectrum = np.linalg.eigvalsh(np.mean([h.V for h in heads], axis=0))
        return {
            "H": H,
            "kind": kind,
            "eps": eps,
            **{k: v for k, v in distances(p, p0).items() if k != "d_mean"},
            "dE": abs(run["energy"] - base["energy"]),
            "energy": run["energy"],
            "G2": run["G2"],
            "spread": float(np.max(np.linalg.norm(p - p.mean(axis=0), axis=1))),
            "w1_predicted": float(np.linalg.norm(x_star - x_star0)),
            "dE_predicted": abs(dirac_energy(heads, beta, x_star) - e_star0),
            "off_rest_point": float(np.max(np.linalg.norm(p - x_star, axis=1))),
            "gap": float(np.diff(spectrum)[0 if attention.sign < 0 else -1]),
            "rest_point_energy": dirac_energy(heads, beta, x_star),
            "min_dirac_energy": min_dirac_energy(heads, beta, 100_000, args.seed),
        }

    rows.append(row("none", 0.0, heads_of(D), base))
    log(
        f"long run H = {H}: E = {base['energy']:.6g}, G2 = {base['G2']:.2e}, spread "
        f"{rows[0]['spread']:.1e}, max |x_i - x*| = {rows[0]['off_rest_point']:.1e}, "
        f"eigenvalue gap of Vbar at x* {rows[0]['gap']:.3f}; E(delta_x*) = "
        f"{rows[0]['rest_point_energy']:.6g}, min over sampled single clusters "
        f"{rows[0]['min_dirac_energy']:.6g}"
    )
    for kind in ("perturb", "decay"):
        for eps in args.eps:
            if kind == "perturb":
                heads = perturbed_heads(D, eps, [args.seed, H, 7])
            else:
                heads = decayed_heads(D, eps)
            rows.append(row(kind, eps, heads, long_run(args, attention, heads, x0)))
            r = rows[-1]
            log(
                f"  {kind:7s} eps = {eps:<6g} W1 = {r['w1']:.3e} (rest points "
                f"{r['w1_predicted']:.3e}), |dE| = {r['dE']:.3e} ({r['dE_predicted']:.3e}), "
                f"G2 = {r['G2']:.1e}"
            )
    return rows, base["points"]


def parse(argv: list[str] | None) -> tuple[Experiment, argparse.Namespace, str]:
    """The command line; ``--tiny`` shrinks every study to seconds (numpy kernels).

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        The experiment, its arguments and the kernel backend ("numba", "numpy" for --tiny).
    """
    experiment = Experiment(__file__, __doc__)
    p = experiment.parser()
    p.add_argument("--heads", type=int, nargs="*", default=[1, 3], help="head counts (1 3)")
    p.add_argument("--signs", type=int, nargs="+", default=[-1, 1], choices=(-1, 1))
    p.add_argument("--deltas", type=float, nargs="+", default=[1e-2, 1e-3, 1e-4])
    p.add_argument("--n-tokens", type=int, default=200)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--t-end", type=float, default=6.0, help="time of the particle runs (a)")
    p.add_argument("--dt", type=float, default=0.01, help="RK4 step of the particles")
    p.add_argument("--record-dt", type=float, default=0.1)
    p.add_argument("--mesh-heads", type=int, nargs="*", default=[1, 3])
    p.add_argument("--mesh-level", type=int, default=3)
    p.add_argument("--mesh-deltas", type=float, nargs="+", default=[1e-2, 1e-3])
    p.add_argument("--mesh-t-end", type=float, default=3.0)
    p.add_argument("--mesh-dt", type=float, default=0.005, help="fixed finite-volume step")
    p.add_argument("--w1-every", type=float, default=0.5, help="time between mesh W1 records")
    p.add_argument("--kappa", type=float, default=10.0)
    p.add_argument("--cfl", type=float, default=0.4)
    p.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.03, 0.01, 0.003])
    p.add_argument("--t-long", type=float, default=15.0, help="time of the long runs (b)")
    p.add_argument("--seed", type=int, default=0)
    args = experiment.start(p, argv)
    backend = "numba"
    if args.tiny:  # seconds: 24 tokens, short runs, an 80-cell mesh, the numpy kernels
        args.n_tokens, args.heads, args.signs, args.deltas = 24, [1, 2], [-1], [1e-2, 1e-3]
        args.t_end, args.record_dt, args.t_long, args.eps = 0.2, 0.05, 0.2, [0.1, 0.03, 0.01]
        args.mesh_level, args.mesh_heads, args.mesh_deltas = 1, [1], [1e-2]
        args.mesh_t_end, args.w1_every, backend = 0.1, 0.05, "numpy"
        experiment.arguments.update({k: v for k, v in vars(args).items() if k != "out"})
    return experiment, args, backend


def lipschitz_checks(
    args: argparse.Namespace, D: dict[int, np.ndarray], x0: np.ndarray, log: Callable[[str], None]
) -> tuple[dict[int, LipschitzBound], dict[int, dict]]:
    """The Lipschitz constants of the heads of every H, and a sampled check of L_x.

    Args:
        args: the command line (beta, seed).
        D: H -> the (H, 3, 3) symmetric matrices of the heads (I, D_h, D_h).
        x0: the (n, 3) initial tokens.
        log: prints on rank 0.

    Returns:
        H -> :class:`LipschitzBound`, and H -> the sampled Lip_x / L_x on the initial tokens
        ("tokens") and on the two-point measure that nearly attains it ("two_point").
    """
    bounds = {H: lipschitz_bound(heads_of(DH), args.beta) for H, DH in D.items()}
    checks = {}
    for H, DH in D.items():
        numpy_attention = Attention(args.beta, -1, backend="numpy")
        m0 = np.full(len(x0), 1.0 / len(x0))
        sampled = sampled_lipschitz(numpy_attention, heads_of(DH), x0, m0, 2000, args.seed)
        y2, m2 = two_point_measure(DH[0])
        worst = sampled_lipschitz(numpy_attention, heads_of(DH), y2, m2, 2000, args.seed)
        checks[H] = {"tokens": sampled / bounds[H].L_x, "two_point": worst / bounds[H].L_x}
        b = bounds[H]
        log(
            f"H = {H}: a_h = {np.round(b.a, 3).tolist()}, L_x = {b.L_x:.4g}, L = {b.L:.4g}, "
            f"L_W1 = {b.L_w1:.4g}; sampled Lip_x / L_x: tokens {checks[H]['tokens']:.3f}, "
            f"two-point measure {checks[H]['two_point']:.3f}"
        )
    return bounds, checks


def mesh_studies(
    args: argparse.Namespace,
    backend: str,
    D: dict[int, np.ndarray],
    bounds: dict[int, LipschitzBound],
    log: Callable[[str], None],
) -> tuple[list[dict], GatheredCells | None, np.ndarray | None, bool]:
    """(a) on the mesh for every mesh H (:func:`input_mesh`), on one icosphere.

    Args:
        args: the command line (mesh_heads, mesh_level, beta and those of input_mesh).
        backend: the kernel backend.
        D: H -> the symmetric matrices of the heads.
        bounds: H -> the Lipschitz constants.
        log: prints on rank 0.

    Returns:
        The rows of every mesh run, the gathered cells (None without mesh runs), the
        unperturbed final density of the first H on rank 0 (None elsewhere or without mesh
        runs) and whether every run took the same steps.
    """
    if not args.mesh_heads:
        return [], None, None, True
    # The icosphere of [P1]'s mesh runs (level 3: 1,280 cells).
    cv = control_volumes(icosphere(MPI.COMM_WORLD, args.mesh_level))
    gathered = GatheredCells(cv)
    q = mesh_quality(cv)
    log(f"icosphere level {args.mesh_level}: {q.n_cells} cells, h = {q.h:.3g}")
    rows: list[dict] = []
    finals, same_steps = [], True
    for H in args.mesh_heads:
        t1 = time.perf_counter()
        attention = Attention(args.beta, -1, backend=backend)
        mine, final, same = input_mesh(args, cv, gathered, attention, heads_of(D[H]), bounds[H])
        rows += mine
        finals.append(final)
        same_steps &= same
        log(f"(a) mesh H = {H}: same steps in every run: {same}; {time.perf_counter() - t1:.1f} s")
    return rows, gathered, finals[0], same_steps


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    # n = 200 tokens, beta = 1; (a) H in {1, 3}, s in {-1, +1}, delta in {1e-2, 1e-3, 1e-4},
    # T = 6, dt = 0.01; mesh level 3, H in {1, 3}, delta in {1e-2, 1e-3}, T = 3, step 0.005;
    # (b) s = -1, T = 15, eps in {0.1, 0.03, 0.01, 0.003} (parse).
    experiment, args, backend = parse(argv)
    log = experiment.log
    wall0 = time.perf_counter()

    # %% Initial condition
    # --------------------
    # [P1]'s tokens: random octahedron vertices +-e_k, N(0, 0.05^2) noise, normalised (the
    # same on every rank); the mesh densities are built in input_mesh.
    x0 = octahedron_tokens(args.n_tokens, 0.05, args.seed)

    # %% Problem
    # ----------
    # Constant heads (I, D_h, D_h), D_h = Z + Z^T as drivers/paper1_ou_s2.py at t = 0; the
    # Lipschitz constants (solvers.diagnostics.lipschitz_bound), and a sampled check of L_x (on
    # the initial tokens and on the two-point measure that nearly attains it).
    all_H = sorted(set(args.heads) | set(args.mesh_heads))
    D = {H: random_symmetric(H, 3, [args.seed, H, 0]) for H in all_H}
    bounds, checks = lipschitz_checks(args, D, x0, log)

    # %% Main loop
    # ------------
    # (a) particles for every (H, s), (a) mesh for every mesh H (mesh_studies: the icosphere
    # of level 3, 1,280 cells), (b) long runs for every H.
    particle_rows: list[dict] = []
    for H in args.heads:
        for sign in args.signs:
            t1 = time.perf_counter()
            attention = Attention(args.beta, sign, backend=backend)
            particle_rows += input_particles(args, attention, heads_of(D[H]), x0, bounds[H])
            log(f"(a) particles H = {H}, s = {sign:+d}: {time.perf_counter() - t1:.1f} s")
    mesh_rows, gathered, final_density, same_steps = mesh_studies(args, backend, D, bounds, log)
    weight_rows: list[dict] = []
    base_points = None
    for H in args.heads:
        t1 = time.perf_counter()
        attention = Attention(args.beta, -1, backend=backend)
        rows, base_points = weight_study(args, attention, D[H], x0, log)
        weight_rows += rows
        log(f"(b) H = {H}: {time.perf_counter() - t1:.1f} s")

    # %% Summary
    # ----------
    # Exponents of every input run beside L; the rates of (b) in eps; the tables, summary.json,
    # final.npz and the two figures (rank 0; drivers/_stability.py).
    wall = time.perf_counter() - wall0
    if experiment.comm.rank == 0:
        exponents, fits = rates(args, particle_rows, mesh_rows, weight_rows, bounds, log)
        tables = {"input_particles": particle_rows, "input_mesh": mesh_rows}
        tables |= {"exponents": exponents, "weights": weight_rows}
        write_tables(args.out, tables, fits)
        write_final_state(args, gathered, final_density, base_points)
        summary = {"bounds": {str(H): b.as_dict() for H, b in bounds.items()}}
        summary["lipschitz_check"] = {str(H): c for H, c in checks.items()}
        summary |= {"exponents": exponents, "mesh_same_steps": same_steps}
        summary |= {"weights": [dict(r) for r in weight_rows], "rates": fits, "wall_time_s": wall}
        experiment.write_summary(args.out, summary)

        # %% Pictures
        # -----------
        plot_input(args.out / "input_perturbation.png", particle_rows, mesh_rows, bounds, TITLE)
        moved = [r for r in weight_rows if r["eps"] > 0]
        plot_weights(args.out / "weight_perturbation.png", moved, fits, TITLE)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
