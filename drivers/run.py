"""One configured run: config -> mesh -> initial measure -> time loop -> diagnostics -> writers.

Used by the CLI (``transformer-pde run``) and by the drivers. Collective over ``comm``.
Outputs in ``out`` (DESIGN section 4): density.xdmf/.h5, metrics.csv, final.npz,
summary.json, density.png, plus metrics.png and, with ``[output] edi`` (default), edi.png.

metrics.csv columns: :data:`METRIC_COLUMNS`, then the energy-dissipation budget
:data:`solvers.edi.EDI_COLUMNS` (cumulative from t = 0: dE, int_dtE and its split
int_dtE_drift + ito_correction + martingale + dtE_remainder, int_G2, int_dissipation,
edi_residual = dE - int_dtE - int_dissipation; the maths in :mod:`solvers.edi`), then the
moments of a weight measure (fokker-planck weights). The budget records the measure (cell
centres and masses; particles) every ``edi_every`` steps and at every output and checkpoint
step; a checkpoint holds the budget's sums (:meth:`~solvers.edi.EnergyBudget.checkpoint_state`)
and a restart recomputes the latest record from the restored state, so that a restarted run
writes the same bits as an uninterrupted one on the same number of ranks.

Everything written so far survives a failure:
metrics rows and XDMF steps are flushed when written, and on a detected failure (NaN, blow-up)
the last good state is written to final.npz and the summary says what happened.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import dolfinx
import numpy as np

from drivers.config import ConfigError, dimension, head_matrices
from meshes import ControlVolumes, circle, control_volumes, from_file, icosphere, mesh_quality
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from meshes.quality import flat_quality
from solvers.attention import Attention, Head, gather_measure, measure_diagnostics
from solvers.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint
from solvers.deposit import deposit_to_cells
from solvers.edi import EDI_COLUMNS, EnergyBudget
from solvers.errors import BlowUpError, SolverError
from solvers.initial import initial_density
from solvers.io import (
    DensityWriter,
    GatheredCells,
    MetricsWriter,
    plot_budget,
    plot_metrics,
    render_density,
    write_final,
    write_json,
)
from solvers.particles import ParticleSystem
from solvers.transport import TransportSolver
from solvers.weights import WeightDynamics, make_weights

__all__ = ["RunResult", "build_mesh", "build_model", "run", "METRIC_COLUMNS"]

#: a particle step below this (from the CFL number) is a collapse, as TransportSolver's dt_min
DT_MIN = 1e-12

METRIC_COLUMNS = [
    "t",
    "step",
    "dt",
    "mass",
    "energy",
    "min_density",
    "max_density",
    "G2",
    "dissipation",
    "outflow",
    "newton_its",
    "ksp_its",
    "halvings",
]


@dataclass
class RunResult:
    """What a run did: status "ok" or "failed", the message, steps, final time, metrics."""

    status: str
    message: str
    steps: int
    t: float
    metrics: list[dict[str, float]] = field(default_factory=list)
    exit_code: int = 0


def build_mesh(cfg: dict[str, Any], comm: MPI.Comm) -> ControlVolumes:
    m = cfg["mesh"]
    if m["manifold"] in ("R1", "R2"):
        d = dimension(cfg)
        n = [16 * 2 ** m["refinement"]] * d
        return flat_control_volumes(box(comm, n, m["lower"], m["upper"]))
    if m["file"]:
        mesh = from_file(comm, m["file"], m["manifold"])
    elif m["manifold"] == "S2":
        mesh = icosphere(comm, m["refinement"])
    else:
        mesh = circle(comm, m["refinement"])
    return control_volumes(mesh)


def build_model(cfg: dict[str, Any]) -> tuple[Attention, WeightDynamics]:
    a, w = cfg["attention"], cfg["weights"]
    heads = [Head(Q, K, V) for Q, K, V in head_matrices(cfg)]
    curved = cfg["mesh"]["manifold"] in ("S1", "S2")
    attention = Attention(
        a["beta"],
        a["sign"],
        manifold=curved,
        backend=a["backend"],
        tolerance=a["tolerance"],
        frozen_heads=w["dynamics"] == "frozen",
    )
    if w["dynamics"] == "fokker-planck":
        return attention, _weight_measure(w, heads)
    weights = make_weights(
        w["dynamics"], heads, init=w["init"], seed=w["seed"], sigma=w["sigma"], dt=w["dt"]
    )
    return attention, weights


def _weight_measure(w: dict[str, Any], heads: list[Head]) -> WeightDynamics:
    """Theta_t by the Fokker-Planck solver on a box of R^p (on every rank, COMM_SELF: the
    parameter mesh is small and every rank needs all its heads)."""
    from solvers.fokker_planck import FokkerPlanckSolver, gaussian_density, ou_drift
    from solvers.weight_measure import FokkerPlanckWeights, ParameterisedHeads

    p = w["p"]
    mesh = box(MPI.COMM_SELF, w["cells"], w["lower"], w["upper"])
    fp = FokkerPlanckSolver(
        mesh, ou_drift(1.0, np.array(w["centre"])), w["sigma"],
        density=lambda c: np.ones(len(c)), petsc_options_prefix="theta_",
    )  # fmt: skip
    fp.set_density(gaussian_density(fp.cv, w["mean0"], w["std0"] ** 2 * np.eye(p)))
    return FokkerPlanckWeights(fp, ParameterisedHeads(heads[0].V, np.array(w["B"])), dt=w["dt"])


class _ParticleScheme:
    """Weighted particles started at the cell centres with the cell masses; densities by deposit."""

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        weights: WeightDynamics,
        density: np.ndarray,
        cfg: dict[str, Any],
    ) -> None:
        n = cv.n_owned
        self.cv = cv
        self.system = ParticleSystem(
            attention,
            weights,
            cv.centres[:n],
            density * cv.measures[:n],
            comm=cv.comm,
            integrator=cfg["time"]["rk"],
        )
        self.t = 0.0
        self.steps = 0
        self.dt_fixed = cfg["time"]["dt"]
        self.cfl = cfg["time"]["cfl"]
        h = mesh_quality(cv).h_min
        self.h = h

    def step(self, t_stop: float) -> tuple[float, float]:
        if self.dt_fixed > 0:
            dt = self.dt_fixed
        else:
            v = self.system.velocity(self.t, self.system.points)
            vmax = self.cv.comm.allreduce(float(np.abs(v).max(initial=0.0)), op=MPI.MAX)
            if not math.isfinite(vmax):
                raise SolverError(f"non-finite particle velocity at t = {self.t:.6g}", t=self.t)
            dt = self.cfl * self.h / vmax if vmax > 0 else t_stop - self.t
            if dt < DT_MIN and dt < t_stop - self.t:  # as TransportSolver's dt_min
                raise BlowUpError(
                    f"time step collapsed to {dt:.3e} at t = {self.t:.6g} (max |X| = {vmax:.3e}, "
                    f"cfl {self.cfl:g}): the velocity blew up (or the cfl is too small)",
                    t=self.t,
                )
        dt = _no_sliver(self.t, dt, t_stop)
        self.system.step(self.t, dt)
        if not np.all(np.isfinite(self.system.points)):
            raise SolverError(f"non-finite particle positions at t = {self.t + dt:.6g}", t=self.t)
        self.t = t_stop if dt == t_stop - self.t else self.t + dt
        self.steps += 1
        return self.t, dt

    @property
    def density(self) -> np.ndarray:
        pts, ms = gather_measure(self.cv.comm, self.system.points, self.system.masses)
        return deposit_to_cells(self.cv, pts, ms)

    def diagnostics(self):
        return self.system.diagnostics(self.t)

    def budget_measure(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of mu_t for the energy budget: the particles and their masses."""
        return self.system.points, self.system.masses

    def owned_state(self) -> dict[str, np.ndarray]:
        """Particle positions and masses, row i = the particle started in owned cell i."""
        return {"points": self.system.points.copy(), "masses": self.system.masses.copy()}

    def restore(self, t: float, steps: int, state: dict[str, np.ndarray]) -> None:
        s = self.system
        self.system = ParticleSystem(
            s.attention,
            s.weights,
            state["points"],
            state["masses"],
            comm=self.cv.comm,
            integrator=s.integrator,
        )
        # the constructor retracts onto the sphere; keep the saved bits exactly
        exact = np.array(state["points"], dtype=np.float64)
        exact.flags.writeable = False
        self.system._points = exact
        self.t, self.steps = float(t), int(steps)


def _no_sliver(t: float, dt: float, t_stop: float) -> float:
    """min(dt, t_stop - t), or t_stop - t when a step dt would stop short of t_stop by a
    rounding sliver (after k steps of a fixed dt, k dt may miss t_stop by 1 ulp)."""
    left = t_stop - t
    return left if dt >= left or left - dt <= 1e-9 * dt else dt


def feedforward(cfg: dict[str, Any]):
    """The affine layer v(x, t) = A x + b of DESIGN M3, or None when it is zero."""
    A = np.array(cfg["feedforward"]["A"], dtype=np.float64)
    b = np.array(cfg["feedforward"]["b"], dtype=np.float64)
    if not A.any() and not b.any():
        return None
    return lambda x, t: x @ A.T + b


class _FVScheme:
    def __init__(self, cv, attention, weights, density, cfg) -> None:
        self.solver = TransportSolver(
            cv,
            attention,
            weights,
            density,
            background=feedforward(cfg),
            reconstruction=cfg["transport"]["reconstruction"],
            rk=cfg["time"]["rk"],
            cfl=cfg["time"]["cfl"],
        )
        self.dt_cap = cfg["time"]["dt"] if cfg["time"]["dt"] > 0 else math.inf

    @property
    def t(self) -> float:
        return self.solver.t

    @property
    def steps(self) -> int:
        return self.solver.steps

    def step(self, t_stop: float) -> tuple[float, float]:
        t0 = self.solver.t
        dt = _no_sliver(t0, self.dt_cap, t_stop)
        target = t_stop if dt == t_stop - t0 else t0 + dt  # land exactly on t_stop
        result = self.solver.step(target)
        return result.t, result.dt

    @property
    def density(self) -> np.ndarray:
        return self.solver.density

    def diagnostics(self):
        return self.solver.diagnostics()

    def budget_measure(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of mu_t for the energy budget: owned cell centres and masses."""
        return self.solver.cv.centres[: self.solver.cv.n_owned], self.solver.masses

    @property
    def outflow(self) -> float:
        return self.solver.outflow

    def owned_state(self) -> dict[str, np.ndarray]:
        return {"masses": self.solver.masses.copy()}

    def restore(self, t: float, steps: int, state: dict[str, np.ndarray]) -> None:
        self.solver.set_state(t, state["masses"], steps)


class _JKOScheme:
    """Minimizing movement (solvers.jko) with tau = [time] dt; PETSc options prefix "jko_"."""

    def __init__(self, cv, attention, weights, density, cfg) -> None:
        from solvers.jko import JKOSolver

        self.cv = cv
        self.tau = cfg["time"]["dt"]
        self.solver = JKOSolver(
            cv, attention, weights, density, tau=self.tau, petsc_options_prefix="jko_"
        )
        self.last: dict[str, float] = {}

    @property
    def t(self) -> float:
        return self.solver.t

    @property
    def steps(self) -> int:
        return self.solver.steps

    def step(self, t_stop: float) -> tuple[float, float]:
        t0 = self.solver.t
        tau = min(self.tau, t_stop - t0)
        result = self.solver.step(tau)
        if abs(result.t - t_stop) <= 1e-12 * max(1.0, abs(t_stop)):
            self.solver.t = t_stop  # land exactly on the output time
        self.last = {
            "newton_its": result.newton_its, "ksp_its": result.ksp_its,
            "halvings": result.halvings,
        }  # fmt: skip
        return self.solver.t, result.tau

    @property
    def density(self) -> np.ndarray:
        return self.solver.density

    def diagnostics(self):
        n = self.cv.n_owned
        masses = self.solver.density * self.cv.measures[:n]
        heads = self.solver.weights.heads_at(self.t)
        return measure_diagnostics(
            self.solver.attention, heads, self.cv.centres[:n], masses, self.cv.comm
        )

    def budget_measure(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of mu_t for the energy budget: owned cell centres and masses."""
        n = self.cv.n_owned
        return self.cv.centres[:n], self.solver.density * self.cv.measures[:n]

    def owned_state(self) -> dict[str, np.ndarray]:
        return {"density": self.solver.density.copy()}

    def restore(self, t: float, steps: int, state: dict[str, np.ndarray]) -> None:
        self.solver.set_state(t, state["density"])
        self.solver.steps = int(steps)


def _theta_moments(weights: WeightDynamics, t: float) -> dict[str, float]:
    """Mass, mean and covariance of the weight measure Theta_t (fokker-planck weights only)."""
    if not hasattr(weights, "moments_at"):
        return {}
    mass, mean, cov = weights.moments_at(t)
    row = {"theta_mass": mass}
    row.update({f"theta_mean_{k}": v for k, v in enumerate(mean)})
    p = len(mean)
    row.update({f"theta_cov_{k}{l}": cov[k, l] for k in range(p) for l in range(k, p)})
    return row


def _resume_budget(budget, saved, scheme, weights, attention, comm) -> None:
    """Continue the energy budget from a checkpoint (taken at a record time: see run)."""
    if "edi_t" not in saved:
        raise ConfigError(
            "output.edi", "the checkpoint has no energy budget (written with output.edi = false)"
        )
    if float(saved["edi_t"]) != float(saved["t"]):
        raise ConfigError("--restart", "the checkpoint's energy budget is not at its time")
    points, masses = scheme.budget_measure()
    budget.resume(saved, points, masses, weights, attention, comm)


def _log(comm: MPI.Comm, msg: str) -> None:
    if comm.rank == 0:
        print(f"[transformer-pde {comm.rank}/{comm.size}] {msg}", flush=True)


def _load_restart(out: Path, comm: MPI.Comm, cfg: dict[str, Any]) -> dict[str, Any]:
    """The newest valid checkpoint of ``out`` (read on rank 0, broadcast)."""
    state, error, name = None, None, None
    if comm.rank == 0:
        try:
            state, path = load_latest_checkpoint(out)
            name = path.name
            if str(state["scheme"]) != cfg["time"]["scheme"]:
                error = (
                    f"checkpoint {name} is a {state['scheme']} run but the config says "
                    f"time.scheme = {cfg['time']['scheme']!r}"
                )
        except CheckpointError as exc:
            error = str(exc)
    error = comm.bcast(error, root=0)
    if error is not None:
        raise ConfigError("--restart", error)
    _log(comm, f"restarting from {comm.bcast(name, root=0)}")
    return comm.bcast(state, root=0)


def run(
    cfg: dict[str, Any],
    out: str | Path,
    comm: MPI.Comm = MPI.COMM_WORLD,
    verbose: bool = True,
    restart: bool = False,
) -> RunResult:
    """Run the configured experiment, writing outputs to ``out``. Collective.

    Raises ConfigError/MeshError/DensityError for invalid input (before anything is written
    except the output folder). A detected failure during the time loop returns a RunResult
    with status "failed" and exit code 3 after writing all outputs up to the failure.
    With ``restart``, the newest valid checkpoint in ``out`` is loaded (on any number of
    ranks) and the run continues, appending to the same outputs: metric rows and density
    steps written after that checkpoint are dropped and computed again.
    """
    wall0 = time.perf_counter()
    log = (lambda msg: _log(comm, msg)) if verbose else (lambda msg: None)
    out = Path(out)
    cv = build_mesh(cfg, comm)
    quality = mesh_quality(cv) if cv.curved else flat_quality(cv)
    attention, weights = build_model(cfg)
    rho0 = initial_density(cv, cfg["initial"]["density"])
    if comm.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    comm.barrier()
    log(
        f"{cfg['mesh']['manifold']} mesh: {quality.n_cells} cells, h = {quality.h:.4g}, "
        f"area ratio {quality.area_ratio:.3f}; scheme {cfg['time']['scheme']}, "
        f"{weights.n_heads} head(s), weights {cfg['weights']['dynamics']}, t_end = {cfg['time']['t_end']}"
    )
    scheme_cls = {"fv": _FVScheme, "particles": _ParticleScheme, "jko": _JKOScheme}
    try:
        scheme = scheme_cls[cfg["time"]["scheme"]](cv, attention, weights, rho0, cfg)
    except ValueError as exc:  # e.g. the JKO scheme needs rho > 0 everywhere
        raise ConfigError("time.scheme", f"{cfg['time']['scheme']}: {exc}") from None
    gathered = GatheredCells(cv)
    t_end = cfg["time"]["t_end"]
    every = cfg["output"]["every"]
    ckpt_every = cfg["output"]["checkpoint_every"]
    state = {"density": rho0, "t": 0.0, "dt": 0.0}
    n_owned = cv.n_owned
    theta_columns = list(_theta_moments(weights, 0.0))
    edi_every = cfg["output"]["edi_every"]
    budget = None
    if cfg["output"]["edi"]:
        budget = EnergyBudget("numpy" if cfg["attention"]["backend"] == "numpy" else None)
    columns = METRIC_COLUMNS + (list(EDI_COLUMNS) if budget else []) + theta_columns
    theta_writer = None
    if theta_columns and comm.rank == 0:  # the parameter density for ParaView (rank 0 writes)
        theta_cv = flat_control_volumes(weights.solver.cv.mesh) if weights.p <= 2 else None
        if theta_cv is not None:
            theta_writer = DensityWriter(theta_cv, out / "theta.xdmf", name="theta")
    if restart:
        saved = _load_restart(out, comm, cfg)
        mine = cv.original_index[:n_owned]
        scheme.restore(
            float(saved["t"]),
            int(saved["steps"]),
            {k[6:]: saved[k][mine] for k in saved if k.startswith("state_")},
        )
        if isinstance(scheme, _FVScheme):
            scheme.solver.outflow = float(saved["outflow"])
        if budget is not None:
            _resume_budget(budget, saved, scheme, weights, attention, comm)
        state["dt"] = float(saved["dt"])
        writer = DensityWriter(cv, out / "density.xdmf", keep=int(saved["n_outputs"]))
        metrics = MetricsWriter(comm, out / "metrics.csv", columns, keep=int(saved["n_rows"]))
        state["density"], state["t"] = scheme.density, scheme.t
    else:
        writer = DensityWriter(cv, out / "density.xdmf")
        metrics = MetricsWriter(comm, out / "metrics.csv", columns)

    def record_budget() -> None:
        """Add the current state to the energy budget (collective; once per time)."""
        if budget is not None and (budget.t is None or scheme.t > budget.t):
            points, masses = scheme.budget_measure()
            budget.record(scheme.t, points, masses, weights, attention, comm)

    def checkpoint() -> None:
        arrays = {f"state_{k}": gathered.gather(v) for k, v in scheme.owned_state().items()}
        if comm.rank == 0:
            save_checkpoint(
                out,
                scheme.steps,
                {
                    **arrays,
                    "t": np.float64(scheme.t),
                    "steps": np.int64(scheme.steps),
                    "dt": np.float64(state["dt"]),
                    "n_outputs": np.int64(len(writer.times)),
                    "n_rows": np.int64(len(metrics.rows)),
                    "outflow": np.float64(getattr(scheme, "outflow", 0.0)),
                    "scheme": np.array(cfg["time"]["scheme"]),
                    **(budget.checkpoint_state() if budget is not None else {}),
                },
            )
        comm.barrier()

    def output() -> None:
        density = scheme.density
        diag = scheme.diagnostics()
        rho_min = comm.allreduce(float(density.min(initial=np.inf)), op=MPI.MIN)
        rho_max = comm.allreduce(float(density.max(initial=-np.inf)), op=MPI.MAX)
        writer.write(scheme.t, density)
        if theta_writer is not None:
            theta_writer.write(scheme.t, weights.density_owned_at(scheme.t))
        metrics.write(
            {
                "t": scheme.t,
                "step": scheme.steps,
                "dt": state["dt"],
                "mass": diag.mass,
                "energy": diag.energy,
                "min_density": rho_min,
                "max_density": rho_max,
                "G2": diag.G2,
                "dissipation": diag.dissipation,
                "outflow": getattr(scheme, "outflow", 0.0),
                **{
                    k: getattr(scheme, "last", {}).get(k, 0)
                    for k in ("newton_its", "ksp_its", "halvings")
                },
                **(budget.columns() if budget is not None else {}),
                **_theta_moments(weights, scheme.t),
            }
        )
        state["density"], state["t"] = density, scheme.t

    status, message, code = "ok", "completed", 0
    last_progress = time.perf_counter()
    try:
        if not restart:
            record_budget()
            output()
        while scheme.t < t_end:
            t, dt = scheme.step(t_end)
            state["dt"] = dt
            write = scheme.steps % every == 0 or t >= t_end
            save = bool(ckpt_every) and scheme.steps % ckpt_every == 0 and t < t_end
            if write or save or scheme.steps % edi_every == 0:
                record_budget()  # at output and checkpoint steps too (restart: see above)
            if write:
                output()
            if save:
                checkpoint()
            if verbose and time.perf_counter() - last_progress > cfg["output"]["progress"]:
                last_progress = time.perf_counter()
                log(
                    f"t = {t:.4g} / {t_end:g} ({100 * t / t_end:.0f}%), step {scheme.steps}, dt = {dt:.3g}"
                )
    except SolverError as exc:
        status, code = "failed", 3
        message = f"run stopped at t = {scheme.t:.6g} (step {scheme.steps}): {exc}"
        log(message)

    final_density = gathered.gather(state["density"])
    wall = time.perf_counter() - wall0
    if comm.rank == 0:
        write_final(out / "final.npz", gathered.points, gathered.weights, final_density, state["t"])
        summary = {
            "status": status,
            "message": message,
            "config": cfg,
            "versions": _versions(),
            "ranks": comm.size,
            "wall_time_s": wall,
            "steps": scheme.steps,
            "t_final": state["t"],
            "final_metrics": metrics.rows[-1] if metrics.rows else {},
            "mesh": quality.as_dict(),
            "edi": (
                {"every": edi_every, "intervals": budget.n_intervals}
                if budget is not None
                else None
            ),
            "backend": attention.backend,
            "tolerance": cfg["attention"]["tolerance"],
            "head_choice": [
                {
                    k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in dataclasses.asdict(c).items()
                }
                for c in (attention.last_choice or ())
            ],
        }
        write_json(out / "summary.json", summary)
        try:
            render_density(
                out / "density.png",
                gathered.vertices,
                final_density,
                title=f"density t={state['t']:.3g}",
            )
            plot_metrics(out / "metrics.png", metrics.rows, ["mass", "energy", "G2", "min_density"])
            if budget is not None and metrics.rows:
                plot_budget(
                    out / "edi.png",
                    metrics.rows,
                    title=f"energy budget: {cfg['time']['scheme']}, "
                    f"{weights.n_heads} head(s), {cfg['weights']['dynamics']} weights",
                )
        except Exception as exc:  # a picture must never lose a finished run
            print(f"[transformer-pde] warning: could not render pictures: {exc}", file=sys.stderr)
    writer.close()
    metrics.close()
    if theta_writer is not None:
        theta_writer.close()
    log(f"{status}: {message}; {scheme.steps} steps, wall {wall:.1f} s, results in {out}")
    return RunResult(status, message, scheme.steps, state["t"], metrics.rows, code)


def _versions() -> dict[str, str]:
    import numba

    return {
        "python": platform.python_version(),
        "dolfinx": dolfinx.__version__,
        "petsc": ".".join(map(str, PETSc.Sys.getVersion())),
        "mpi4py": __import__("mpi4py").__version__,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0],
    }
