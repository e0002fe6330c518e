"""The command line ``transformer-pde`` (also ``python -m drivers``).

- ``transformer-pde run CONFIG.toml [--out DIR] [--set section.key=value ...]``;
- ``transformer-pde gaussian CONFIG.toml``: the moment ODE alone;
- ``transformer-pde view DIR``: an animation of a results folder's density.

Exit codes (DESIGN section 4): 0 success; 2 invalid input, with one line naming the key or
file (no traceback); 3 the run stopped on a detected failure (NaN, blow-up), after writing
everything computed so far. Works serially and under ``mpiexec -n N``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own code)
        self.exit(2, f"transformer-pde: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="transformer-pde",
        description="Mean-field PDEs of multi-head Transformers: run an experiment, solve the "
        "Gaussian moment ODE, or animate a results folder.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an experiment from a TOML config")
    r.add_argument("config", help="TOML configuration file")
    r.add_argument("--out", default=None, help="output folder (default results/<config name>)")
    r.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (TOML syntax)",
    )
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument(
        "--restart",
        metavar="DIR",
        default=None,
        help="continue the run in DIR from its newest valid checkpoint (same or "
        "another number of ranks), appending to its outputs",
    )
    g = sub.add_parser("gaussian", help="the Gaussian moment ODE of DESIGN M3 alone")
    g.add_argument("config", help="TOML file with a [gaussian] table")
    g.add_argument("--out", default=None, help="output folder (default results/<config name>)")
    g.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="gaussian.KEY=VALUE",
        help="override a config value",
    )
    g.add_argument("--quiet", action="store_true")
    from drivers.engine._view import add_arguments as view_arguments

    v = sub.add_parser("view", help="render the density of a results folder as a GIF/MP4")
    view_arguments(v)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, petsc_args = parser.parse_known_args(argv)
    if args.command == "view":  # no MPI, no PETSc: rank 0 of a launcher renders, others return
        if petsc_args:
            parser.error(f"unrecognized arguments: {' '.join(petsc_args)}")
        from drivers.engine._view import run_from_args

        return run_from_args(args)
    stray = [a for a in petsc_args if not a.startswith("-")]
    if petsc_args and (stray and stray[0] == petsc_args[0]):
        parser.error(f"unrecognized arguments: {' '.join(petsc_args)}")
    # Heavy imports after argument parsing so that --help is fast. Remaining options starting
    # with "-" go to PETSc (e.g. -jko_snes_monitor -jko_ksp_rtol 1e-10 for the JKO solver).
    import dolfinx_solver  # noqa: F401
    import petsc4py

    petsc4py.init([sys.argv[0], *petsc_args])
    from mpi4py import MPI

    import numpy as np

    from solvers.threads import configure_threads

    configure_threads()

    from drivers.engine._config import ConfigError, load_config
    from drivers.engine._run import run
    from meshes.sphere import MeshError
    from solvers.transport import DensityError

    comm = MPI.COMM_WORLD
    if args.command == "gaussian":
        return _gaussian(args, comm)
    if args.restart:
        out = Path(args.restart)
    else:
        out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
    try:
        # Floating-point trouble is detected and reported by the solvers (non-finite values,
        # collapsing steps: exit 3 with one line), not by numpy warnings on stderr.
        with np.errstate(all="ignore"):
            cfg = load_config(args.config, args.overrides)
            result = run(cfg, out, comm, verbose=not args.quiet, restart=bool(args.restart))
    except (ConfigError, MeshError, DensityError) as exc:
        key = getattr(exc, "key", None)
        prefix = (
            "" if key else ("mesh.file: " if isinstance(exc, MeshError) else "initial.density: ")
        )
        if comm.rank == 0:
            print(
                f"transformer-pde: error: {prefix}{exc}".replace("\n", " "),
                file=sys.stderr,
                flush=True,
            )
        return 2
    if result.exit_code and comm.rank == 0:  # a detected failure: one line on stderr
        print(
            f"transformer-pde: error: {result.message}".replace("\n", " "),
            file=sys.stderr,
            flush=True,
        )
    return result.exit_code


def _gaussian(args: argparse.Namespace, comm) -> int:
    """The moment ODE is small: rank 0 solves and writes; the exit code is broadcast."""
    from drivers.engine._config import ConfigError
    from drivers.engine._gaussian_command import load_gaussian_config, run_gaussian

    code = 0
    if comm.rank == 0:
        out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
        try:
            code = run_gaussian(
                load_gaussian_config(args.config, args.overrides), out, verbose=not args.quiet
            )
        except ConfigError as exc:
            print(f"transformer-pde: error: {exc}", file=sys.stderr, flush=True)
            code = 2
    return comm.bcast(code, root=0)


if __name__ == "__main__":
    sys.exit(main())
