"""Tables, summary and figures of ``drivers/train_mean_field.py`` (its report; no science).

:class:`TrainingSeries` is the time series of one training (one CSV row per training step,
the head law after every step for rho.png), written from the engine's loop
(:func:`train`: the training on the stepping interface, :class:`solvers.training.TrainingStepper`,
advanced by ``drivers.engine.advance`` to the times of its whole steps, its rows recorded by
the engine's :class:`~drivers.engine.Recorder`);
:func:`report` turns the three series into summary.json's numbers (monotone free energies, the
fitted rates of their decrements); :func:`plot_loss`, :func:`plot_free_energy` and
:func:`plot_rho` draw the pictures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers.engine import Recorder, advance, stop_on
from solvers.training import TrainingStepper, fit_exponential_rate

__all__ = [
    "COLUMNS",
    "PARTICLE_COLUMNS",
    "TrainingSeries",
    "plot_free_energy",
    "plot_loss",
    "plot_rho",
    "report",
    "train",
]

#: Columns of one_layer.csv and deep.csv (mean field), and of particles.csv.
COLUMNS = [
    *("s", "step", "readout", "regulariser", "loss", "entropy", "free_energy", "theta_mean"),
    *("theta_var", "gradient_norm", "max_cfl", "fp_iterations", "wall"),
]
PARTICLE_COLUMNS = [
    *("s", "step", "readout", "regulariser", "loss", "theta_mean", "theta_var"),
    *("gradient_norm", "wall"),
]


class TrainingSeries:
    """One CSV row per training state and the head law after every step, recorded by the
    engine's :class:`~drivers.engine.Recorder` (an experiment recorder without control
    volumes: its own columns, its own file; collective writes, rank 0 writes the file).

    Args:
        comm: the communicator.
        path: the CSV file.
        training: the training (its initial state is the first row).
        wall0: the start of the wall clock (the ``wall`` column).
        particles: whether the training is the particle model (its columns and its heads).
        steps: the training steps to record (a row after each: the grid of its
            :class:`~solvers.training.TrainingStepper`).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        path: Path,
        training: Any,
        wall0: float,
        particles: bool = False,
        steps: int = 0,
    ) -> None:
        self.comm, self.particles, self.wall0, self.training = comm, particles, wall0, training
        self.stepper = TrainingStepper(training)
        times = self.stepper.grid(max(steps, 0))
        self.recorder = Recorder.experiment(
            path.parent, None, times, self._written, comm=comm, table=path.name
        )
        columns = PARTICLE_COLUMNS if particles else COLUMNS
        self.recorder.add_columns(columns, self._row)
        self.history: list[np.ndarray] = []
        #: seconds in the training loop without the rows (set by :func:`train`)
        self.seconds = 0.0
        #: seconds spent on rows (their evaluation and the write), and the current row's start
        self.writing, self._row_start = 0.0, 0.0
        #: called with each row written after a step (a log line)
        self.on_row: Callable[[dict[str, Any]], None] | None = None
        self.recorder.start(self.stepper)

    @property
    def rows(self) -> list[dict[str, float]]:
        """The rows written so far."""
        return self.recorder.rows

    def _row(self, stepper: TrainingStepper) -> dict[str, Any]:
        """The row of the training's current state; keeps its head law."""
        self._row_start = time.perf_counter()
        st = self.training.state
        row = {
            "s": st.s,
            "step": st.step,
            "readout": st.readout,
            "regulariser": st.regulariser,
            "loss": st.loss,
            "theta_mean": float(st.mean[0]),
            "theta_var": float(st.cov[0, 0]),
            "gradient_norm": st.gradient_norm,
            "wall": time.perf_counter() - self.wall0,
        }
        if not self.particles:
            row.update(
                entropy=st.entropy,
                free_energy=st.free_energy,
                max_cfl=st.max_cfl,
                fp_iterations=st.fp_iterations,
            )
        self.history.append(st.theta[:, 0].copy() if self.particles else self.training.density)
        return {name: row[name] for name in (PARTICLE_COLUMNS if self.particles else COLUMNS)}

    def _written(self, row: dict[str, Any]) -> None:
        self.writing += time.perf_counter() - self._row_start
        if self.on_row is not None:
            self.on_row(row)

    def close(self) -> None:
        """Close the file (collective)."""
        self.recorder.close()


def train(
    training: Any,
    steps: int,
    series: TrainingSeries,
    log: Callable[[str], None],
    name: str,
) -> float:
    """``steps`` training steps through the engine's loop, a row after every step (collective).

    Args:
        training: the training (:class:`solvers.training.MeanFieldTraining` or
            :class:`solvers.training.ParticleTraining`), the one of ``series``.
        steps: the number of steps (none if <= 0), those ``series`` was made for.
        series: where the rows go.
        log: the rank-0 logger (a line every tenth of the steps).
        name: the model's name in the log.

    Returns:
        The seconds spent in the loop without the rows (the steps' time, as summary.json
        reports it).

    Raises:
        SolverError: a step failed (the rows so far are written).
    """
    stepper = series.stepper
    every = max(1, steps // 10)

    def line(r: dict[str, Any]) -> None:
        if r["step"] % every == 0 or r["step"] == steps:
            energy = "" if series.particles else f"F = {r['free_energy']:.8f}, "
            log(
                f"{name} step {r['step']:3d}: {energy}L = {r['loss']:.6f}, "
                f"mean theta {r['theta_mean']:+.3f}"
            )

    series.on_row, series.writing = line, 0.0
    start = time.perf_counter()
    try:
        if steps > 0:
            stop_on(advance(stepper, series.recorder, stepper.grid(steps)[-1]))
    finally:
        series.seconds = time.perf_counter() - start - series.writing
    return series.seconds


def report(series: dict[str, TrainingSeries]) -> dict[str, Any]:
    """Monotone decrease of the mean-field free energies and the exponential rate of their
    decrements, fitted where 1e-13 < F_k - F_(k+1) < 1e-5 (NaN with fewer than 3 points).

    Args:
        series: "one_layer" and "deep" -> their series.

    Returns:
        ``F``, ``s`` (model -> arrays), ``monotone`` and ``rates`` (model -> value).
    """
    F = {n: np.array([r["free_energy"] for r in w.rows]) for n, w in series.items()}
    s_of = {n: np.array([r["s"] for r in w.rows]) for n, w in series.items()}
    monotone = {n: bool(np.all(np.diff(f) <= 1e-14 * np.abs(f).max())) for n, f in F.items()}
    rates = {}
    for name, f in F.items():
        dec = -np.diff(f)
        window = (dec > 1e-13) & (dec < 1e-5)
        rates[name] = (
            fit_exponential_rate(s_of[name][1:][window], dec[window])[0]
            if window.sum() >= 3
            else float("nan")
        )
    return {"F": F, "s": s_of, "monotone": monotone, "rates": rates}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(path: Path, series: dict[str, TrainingSeries], label: str) -> None:
    """The loss L over the training time, mean field and particles (rank 0).

    Args:
        path: the PNG file.
        series: "one_layer", "deep" and "particles" -> their series.
        label: the legend of the particle model.
    """
    plt = _pyplot()
    prows = series["particles"].rows
    sp = np.array([r["s"] for r in prows])
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("one_layer", "deep"):
        rows = series[name].rows
        ax.plot([r["s"] for r in rows], [r["loss"] for r in rows], label=f"{name} (mean field)")
    ax.plot(sp, [r["loss"] for r in prows], ".", label=label)
    ax.set_xlabel("training time s")
    ax.set_ylabel("L = readout + weight decay")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_free_energy(
    path: Path, s_of: dict[str, np.ndarray], F: dict[str, np.ndarray], rates: dict[str, float]
) -> None:
    """The free-energy decrement per step, log scale, with the fitted rates (rank 0).

    Args:
        path: the PNG file.
        s_of: model -> the training times of its rows.
        F: model -> its free energies.
        rates: model -> the fitted exponential rate.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in F.items():
        dec = np.maximum(-np.diff(values), 1e-18)
        label = f"{name}: F_k - F_(k+1), rate {rates[name]:.3g}"
        ax.semilogy(s_of[name][1:], dec, "o-", ms=3, label=label)
    ax.set_xlabel("training time s")
    ax.set_ylabel("free-energy decrement per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rho(
    path: Path,
    series: dict[str, TrainingSeries],
    s_of: dict[str, np.ndarray],
    theta: np.ndarray,
    density: np.ndarray,
    bins: int,
) -> None:
    """rho_s(theta) over the training time (both models) and the final laws (rank 0).

    Args:
        path: the PNG file.
        series: "one_layer", "deep" and "particles" -> their series (the head laws).
        s_of: model -> the training times of its rows.
        theta: the parameter cell centres (1D).
        density: the final density of the deep model.
        bins: the number of histogram bins of the particle heads.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, name in zip(axes[:2], ("one_layer", "deep"), strict=True):
        img = np.array(series[name].history)
        ax.imshow(
            img.T, aspect="auto", origin="lower", extent=[0, s_of[name][-1], theta[0], theta[-1]]
        )
        ax.set_title(f"rho_s(theta), {name}")
        ax.set_xlabel("s")
        ax.set_ylabel("theta")
    ax = axes[2]
    particle_theta = series["particles"].history[-1]
    ax.plot(theta, density, "k-", label="mean field (deep), final")
    ax.hist(
        particle_theta,
        bins=bins,
        range=(-1, 1),
        density=True,
        alpha=0.5,
        label=f"{len(particle_theta)} particle heads, final",
    )
    ax.set_xlabel("theta")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
