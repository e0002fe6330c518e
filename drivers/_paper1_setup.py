"""The parameters of the two [P1] section 6 experiments and the record of one run.

- :class:`Setup`, :func:`parse_setup`: the parameters and the command line of
  drivers/paper1_ou_s2.py and drivers/paper1_oscillating_s2.py; :func:`paths_for`: the Monte
  Carlo paths of a head count;
- :class:`Run`: one trajectory (metrics rows, snapshots, final state, wall time).

The runs are made in drivers/_paper1.py and reported by drivers/_paper1_report.py and
drivers/_paper1_figures.py; both import from here, so that no import circle joins them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drivers._experiment import Experiment

__all__ = ["Run", "Setup", "parse_setup", "paths_for"]


# %% Parameters
# -------------
@dataclass
class Setup:
    """Everything a run needs (filled from the command line)."""

    name: str
    dynamics: str
    out: Path
    n_tokens: int = 200
    noise: float = 0.05
    particle_kappa: float | None = None  # particles drawn from the mesh's caps (None: octahedron)
    particle_antipodal: bool = False  # n/2 tokens and their antipodes (the mesh's symmetry)
    heads: Sequence[int] = (1, 10, 100)
    paths: Sequence[int] = (3,)  # Monte Carlo paths: one value for every H, or one per H
    t_end: float = 20.0
    dt: float = 5e-3
    beta: float = 1.0
    sign: int = -1
    sigma: float = math.sqrt(2.0)
    integrator: str = "rk4"
    record_every: int = 4
    seed: int = 0
    first_path: int = 0  # every run takes paths first_path, first_path + 1, ...
    mesh_level: int = 3
    mesh_heads: Sequence[int] = (1, 3, 10)
    mesh_paths: int = 1  # Monte Carlo paths of every mesh run
    mesh_t_end: float = 10.0
    kappa: float = 10.0
    cfl: float = 0.4
    backend: str | None = None  # kernel backend: None (compiled) or "numpy" (tiny runs)
    phases: str = "equispaced"  # oscillating heads: "equispaced" (2 pi h / H) or "random"

    def _phases(self) -> str:
        return f" ({self.phases} phases)" if self.dynamics == "oscillating" else ""

    def _particle_start(self) -> str:
        pairs = " in antipodal pairs" if self.particle_antipodal else ""
        if self.particle_kappa is None:
            return pairs
        return f" from caps kappa = {self.particle_kappa:g}{pairs}"

    def _first_path(self) -> str:
        return f" from path {self.first_path}" if self.first_path else ""

    def describe(self) -> str:
        """One line: the weights, the particle runs and the mesh runs."""
        return (
            f"{self.dynamics} weights{self._phases()}, particles{self._particle_start()}: "
            f"n = {self.n_tokens}, H = {list(self.heads)}, "
            f"paths {list(self.paths)}{self._first_path()}, T = {self.t_end:g}, "
            f"dt = {self.dt:g} ({self.integrator}); "
            f"mesh: level {self.mesh_level}, H = {list(self.mesh_heads)}, "
            f"{self.mesh_paths} path(s){self._first_path()}, "
            f"T = {self.mesh_t_end:g}, kappa = {self.kappa:g} -> {self.out}"
        )


def parse_setup(
    experiment: Experiment, dynamics: str, paths: Sequence[int], argv: Sequence[str] | None
) -> Setup:
    """The command line of both scripts; --tiny shrinks everything to a few seconds.

    On return the threads are configured and the output folder exists
    (:meth:`Experiment.prepare`).

    Args:
        experiment: the script (its name, description and communicator).
        dynamics: "ou" or "oscillating".
        paths: the default Monte Carlo paths, one value or one per default head count.
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        The setup.

    Raises:
        SystemExit: on a malformed command line, or --paths that match no head count.
    """
    p = experiment.parser()
    p.add_argument("--heads", type=int, nargs="*", help="particle head counts (1 10 100)")
    p.add_argument(
        "--paths",
        type=int,
        nargs="+",
        help=f"Monte Carlo paths: one value, or one per --heads (default {list(paths)})",
    )
    p.add_argument("--t-end", type=float, help="particle final time (default 20)")
    p.add_argument("--n-tokens", type=int, help="number of tokens (default 200)")
    p.add_argument("--integrator", choices=("rk4", "euler"), default="rk4")
    p.add_argument(
        "--particle-kappa",
        type=float,
        help="draw the particles i.i.d. from the six-cap density of the mesh runs with this "
        "kappa (default: octahedron vertices + N(0, 0.05^2) noise)",
    )
    p.add_argument(
        "--particle-antipodal",
        action="store_true",
        help="the first n/2 tokens and their antipodes -x: the symmetry x -> -x of the mesh "
        "runs' density, which the flow keeps (n even)",
    )
    p.add_argument("--record-every", type=int, help="steps between budget records (4)")
    p.add_argument("--mesh-heads", type=int, nargs="*", help="mesh head counts (1 3 10)")
    p.add_argument("--mesh-paths", type=int, help="Monte Carlo paths of every mesh H (1)")
    p.add_argument(
        "--first-path",
        type=int,
        help="first Monte Carlo path of every particle and mesh run (0): one path per process",
    )
    p.add_argument("--mesh-level", type=int, help="icosphere level of the mesh run (3)")
    p.add_argument("--mesh-t-end", type=float, help="mesh final time (default 10)")
    p.add_argument("--kappa", type=float, help="cap concentration of the mesh density (10)")
    p.add_argument("--seed", type=int, default=0)
    if dynamics == "oscillating":
        p.add_argument(
            "--phases",
            choices=("equispaced", "random"),
            default="equispaced",
            help="phases of the heads: 2 pi h / H, or uniform on [0, 2 pi) (seeded per path)",
        )
    a = p.parse_args(argv)
    s = Setup(name=experiment.name, dynamics=dynamics, out=a.out, paths=tuple(paths), seed=a.seed)
    s.phases = getattr(a, "phases", "equispaced")
    if a.tiny:
        s.n_tokens, s.heads, s.t_end, s.record_every = 24, (1, 2), 0.1, 2
        s.paths = (min(paths[0], 2),)
        s.mesh_level, s.mesh_heads, s.mesh_t_end, s.backend = 1, (1, 2), 0.05, "numpy"
    overrides = ("heads", "paths", "t_end", "n_tokens", "record_every", "mesh_heads")
    mesh_keys = ("first_path", "mesh_paths", "mesh_level")
    for key in (*overrides, *mesh_keys, "mesh_t_end", "kappa", "particle_kappa"):
        if getattr(a, key) is not None:
            setattr(s, key, getattr(a, key))
    s.integrator = a.integrator
    if a.paths is None and len(s.paths) != len(s.heads):
        s.paths = (s.paths[0],)  # other head counts than the defaults: the first default
    if len(s.paths) not in (1, len(s.heads)) or min(s.paths) < 1:
        p.error(f"--paths: one value >= 1, or one per head count {list(s.heads)}")
    if s.mesh_paths < 1:
        p.error(f"--mesh-paths: must be >= 1, got {s.mesh_paths}")
    if s.first_path < 0:
        p.error(f"--first-path: must be >= 0, got {s.first_path}")
    s.particle_antipodal = a.particle_antipodal
    if s.particle_antipodal and s.n_tokens % 2:
        p.error(f"--particle-antipodal: needs an even number of tokens, got {s.n_tokens}")
    if s.particle_kappa is not None and not s.particle_kappa >= 0.0:
        p.error(f"--particle-kappa: must be >= 0, got {s.particle_kappa}")
    experiment.prepare(s.out)
    return s


def paths_for(setup: Setup, H: int) -> int:
    """Number of Monte Carlo paths of the particle runs with H heads."""
    if len(setup.paths) == 1:
        return setup.paths[0]
    return setup.paths[list(setup.heads).index(H)]


# %% The record of a run
# ----------------------
@dataclass
class Run:
    """One trajectory: metrics rows (rank 0 gets all), snapshots (rank 0), wall time."""

    scheme: str
    H: int
    path: int
    rows: list[dict[str, float]]
    snapshots: dict[float, np.ndarray]
    final: np.ndarray | None
    wall: float
