"""The command line ``transformer-pde`` (also ``python -m drivers``).

- ``transformer-pde run CONFIG.toml [--out DIR] [--set section.key=value ...]``;
- ``transformer-pde sweep CONFIG.toml --grid KEY=v1,v2 [--grid ...] --out DIR [--jobs K]``:
  one run per point of the grid, ``DIR/sweep.csv`` and ``DIR/sweep.png``
  (:mod:`drivers.engine._sweep`);
- ``transformer-pde gaussian CONFIG.toml``: the moment ODE alone;
- ``transformer-pde view DIR``: an animation of a results folder's density;
- ``transformer-pde paraview DIR``: the same series rendered by ParaView (``pvbatch``), with
  the script written to DIR for the GUI (docs/paraview.md);
- ``transformer-pde keys``: the configuration reference (every key, type, default, meaning).

Exit codes (docs/interface.md): 0 success; 2 invalid input (a config key, a file, an option,
an output folder that cannot be used), with one line naming it (no traceback); 3 the run
stopped on a detected failure (NaN, a non-finite metric, blow-up, a write that failed), after
writing everything it could; 130/143 interrupted. Works serially and under ``mpiexec -n N``.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

from drivers.engine._provenance import package_version

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --ou is not --out: options are spelt out
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own code)
        self.exit(2, f"transformer-pde: error: {message}\n")


RUN_EPILOG = """\
config keys: `transformer-pde keys` prints every key with its type, default, allowed values
and meaning (the same text as docs/config.md); examples for every scheme are in configs/.
outputs in DIR: density.xdmf + density.h5 (ParaView), metrics.csv, final.npz, summary.json,
density.png, density_map.png (S2), metrics.png, edi.png (not with --no-pictures or
[output] pictures = false), checkpoint/ (every output.checkpoint_minutes of wall time,
default 10, every output.checkpoint_every steps, and on SIGINT/SIGTERM).
one run per folder: DIR must be writable with room for the first outputs; a DIR holding
another run's results is refused unless --overwrite (which removes the files the project
writes, and only those) or --restart; a lock file keeps two runs out of one folder.
exit codes: 0 completed; 2 invalid input or an unusable DIR (one line naming the key, file,
option or folder); 3 a detected failure (NaN, a non-finite metric, blow-up, no convergence, a
write that failed such as a full disk); 130/143 interrupted by SIGINT/SIGTERM (after a
checkpoint); everything computed is written in every case.
PETSc options: single-dash options go to PETSc, e.g. -jko_snes_monitor -jko_ksp_rtol 1e-10
(JKO, prefix jko_) or -theta_ksp_monitor (weight law, prefix theta_); options of these
prefixes that no solver of the run reads are reported at start-up (--strict-petsc: exit 2);
an unknown --option is an error. On --restart the run's own configuration (stored in its
checkpoints) is used, and --set may change only time.t_end and
output.every/progress/checkpoint_every/checkpoint_minutes/edi_every."""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="transformer-pde",
        description="Mean-field PDEs of multi-head Transformers: run an experiment, solve the "
        "Gaussian moment ODE, or animate a results folder.",
    )
    p.add_argument("--version", action="version", version=f"transformer-pde {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser(
        "run",
        help="run an experiment from a TOML config",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("config", nargs="?", help="TOML configuration file (not read on --restart)")
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
        "--no-pictures",
        action="store_true",
        help="draw no density.png, metrics.png, edi.png (as [output] pictures = false; the "
        "data files are the same)",
    )
    r.add_argument(
        "--restart",
        metavar="DIR",
        default=None,
        help="continue the run in DIR from its newest valid checkpoint (same or "
        "another number of ranks), appending to its outputs",
    )
    r.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of another run in the output folder (removes only the "
        "files transformer-pde writes)",
    )
    r.add_argument(
        "--strict-petsc",
        action="store_true",
        help="a PETSc option of the prefixes jko_/theta_ that no solver reads is an error",
    )
    sw = sub.add_parser(
        "sweep",
        help="run a config over a grid of parameters (one folder per run, sweep.csv, sweep.png)",
        epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _sweep_arguments(sw)
    g = sub.add_parser("gaussian", help="the Gaussian moment ODE of docs/model.md, M3 alone")
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
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of another run in the output folder",
    )
    from drivers.engine.io import view_arguments

    v = sub.add_parser("view", help="render the density of a results folder as a GIF/MP4")
    view_arguments(v)
    from drivers.engine.io import paraview_arguments

    pv = sub.add_parser(
        "paraview", help="render the density of a results folder with ParaView (pvbatch)"
    )
    paraview_arguments(pv)
    sub.add_parser(
        "keys",
        help="print the configuration reference (Markdown, as docs/config.md)",
        description="Every key of a run config and of a gaussian config: type, default, "
        "allowed values, meaning.",
    )
    return p


SWEEP_EPILOG = """\
grid keys: dotted config keys, section.key (attention.beta, time.scheme) or inside a list of
tables section.key.N.field (attention.heads.0.V, also written attention.heads[0].V); values:
a comma-separated TOML list (1,2.5,4 or "fv","jko"; bare words are strings: fv,jko). Every
point is validated before any run starts (exit 2, one line naming the key and the point).
outputs in DIR: one results folder per point, named from its parameters (DIR/beta=2,
DIR/beta=2,sign=-1; a value that is not a plain word as #k, its place in the grid), each with
config.toml (its resolved configuration); DIR/sweep.csv (parameters, status, steps, wall
time and final metrics of every run) and DIR/sweep.png (metrics against t, one line per run).
resuming: the same command again skips the runs that ended (status ok or failed, same
configuration), continues unfinished ones from their newest checkpoint (else from t = 0).
exit codes: 0 every run ok; 2 invalid input; 3 a run failed (the others still ran);
130/143 interrupted (the running runs checkpoint)."""


def _sweep_arguments(s: argparse.ArgumentParser) -> None:
    """The options of ``transformer-pde sweep`` (module ``_sweep`` runs it)."""
    s.add_argument("config", help="TOML configuration file every run starts from")
    s.add_argument(
        "--grid",
        dest="grids",
        action="append",
        default=[],
        metavar="KEY=v1,v2,...",
        help="a config key and its values (repeat for a product of grids)",
    )
    s.add_argument("--out", required=True, help="the sweep's folder (one sub-folder per run)")
    s.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value of every run (TOML syntax)",
    )
    s.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="K runs at once as single-rank subprocesses sharing the cores (serial launches "
        "only; under mpiexec the runs go one after the other on all ranks); default 1",
    )
    s.add_argument(
        "--pictures",
        action="store_true",
        help="draw each run's density.png, metrics.png, edi.png (default: off in sweeps)",
    )
    s.add_argument("--quiet", action="store_true", help="no progress lines")


def _petsc_arguments(parser: argparse.ArgumentParser, rest: list[str]) -> list[str]:
    """The arguments argparse did not know, checked: single-dash options (and their values)
    go to PETSc; an unknown ``--option`` or a stray value is an error (exit 2)."""
    for k, arg in enumerate(rest):
        if arg.startswith("--"):
            parser.error(f"unrecognized option {arg.split('=', 1)[0]!r} (see --help)")
        if not arg.startswith("-") and (k == 0 or not rest[k - 1].startswith("-")):
            parser.error(f"unrecognized argument {arg!r} (see --help)")
    return rest


def _error(comm: Any, message: str) -> None:
    if comm.rank == 0:
        print(f"transformer-pde: {message}".replace("\n", " "), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "keys":  # no MPI, no PETSc
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from drivers.engine._schema import reference

        sys.stdout.write(reference())
        return 0
    if args.command == "view":  # no MPI, no PETSc: rank 0 of a launcher renders, others return
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from drivers.engine.io import run_view

        return run_view(args)
    if args.command == "paraview":  # no MPI, no PETSc: rank 0 of a launcher runs pvbatch
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from drivers.engine.io import run_paraview as paraview_run

        return paraview_run(args)
    petsc_args = _petsc_arguments(parser, rest)
    if args.command == "run" and not args.restart and args.config is None:
        parser.error("the following arguments are required: config")
    if args.command == "run" and args.restart and args.overwrite:
        parser.error("--overwrite and --restart exclude each other (a restart continues the run)")
    # Heavy imports after argument parsing so that --help is fast. Signals are handled by the
    # run loop (drivers.engine._run), not by PETSc's crash handler.
    import dolfinx_solver  # noqa: F401
    import petsc4py

    petsc4py.init([sys.argv[0], "-no_signal_handler", *petsc_args])
    from mpi4py import MPI

    from solvers.threads import configure_threads

    configure_threads()
    comm = MPI.COMM_WORLD
    command_line = ["transformer-pde", *argv]
    if args.command == "gaussian":
        return _gaussian(args, comm, command_line)
    if args.command == "sweep":
        from drivers.engine._sweep import run_from_args as sweep_run

        return sweep_run(args, comm, command_line, _error)
    return _run(args, comm, command_line)


def _run(args: argparse.Namespace, comm: Any, command_line: list[str]) -> int:
    import numpy as np

    from drivers.engine._config import ConfigError, load_config, restart_config
    from drivers.engine._run import run
    from meshes.sphere import MeshError
    from solvers.transport import DensityError

    try:
        # Floating-point trouble is detected and reported by the solvers (non-finite values,
        # collapsing steps: exit 3 with one line), not by numpy warnings on stderr.
        with np.errstate(all="ignore"):
            if args.restart:
                out = Path(args.restart)
                stored = _stored_config(out, comm)
                if stored is None:  # a checkpoint of an older version: the config as given
                    cfg = load_config(args.config, args.overrides)
                else:
                    cfg = restart_config(stored, args.overrides)
                    if args.config is not None and comm.rank == 0:
                        print(f"[transformer-pde] notice: {_config_notice(args.config, cfg)}",
                              file=sys.stderr, flush=True)  # fmt: skip
            else:
                out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
                cfg = load_config(args.config, args.overrides)
            result = run(
                cfg,
                out,
                comm,
                not args.quiet,
                bool(args.restart),
                command_line,
                overwrite=args.overwrite,
                strict_petsc=args.strict_petsc,
                pictures=False if args.no_pictures else None,
                keep_final=False,  # the command line does not use RunResult.final: O(N) a rank
            )
    except (ConfigError, MeshError, DensityError) as exc:
        key = getattr(exc, "key", None)
        prefix = (
            "" if key else ("mesh.file: " if isinstance(exc, MeshError) else "initial.density: ")
        )
        failed = (2, f"error: {prefix}{exc}")
    except KeyboardInterrupt:  # Ctrl-C before the time loop (building the mesh)
        failed = (130, "interrupted by SIGINT before the run started; nothing to continue")
    else:
        failed = None
    if failed is not None:
        # What the failed build left (a mesh, held by reference cycles through the traceback)
        # is destroyed now on every rank at once: its destructors are collective, and a
        # collection at another moment on one rank only would pair the wrong collectives.
        gc.collect()
        _error(comm, failed[1])
        return failed[0]
    if result.exit_code:  # a detected failure or an interruption: one line on stderr
        label = "" if result.status == "interrupted" else "error: "
        _error(comm, f"{label}{result.message}")
    return result.exit_code


def _config_notice(path: str, cfg: dict[str, Any]) -> str:
    """The notice when CONFIG is given with --restart: it is not read; where it differs
    from the run's own configuration (the keys a restart may change left out)."""
    from drivers.engine._config import RESTART_KEYS, ConfigError, load_config

    text = f"{path} is not read on --restart: the run continues with its own configuration"
    try:
        given = load_config(path)
    except ConfigError as exc:
        return f"{text} ({path} is not a valid run config: {exc})"
    differ = [
        f"{section}.{key} (file {given[section][key]!r}, run {value!r})"
        for section, table in cfg.items()
        for key, value in table.items()
        if (section, key) not in RESTART_KEYS and given[section][key] != value
    ]
    if not differ:
        return f"{text} (the same, apart from the keys a restart may change)"
    more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    return f"{text}, which differs from the file in {', '.join(differ[:3])}{more}"


def _stored_config(out: Path, comm: Any) -> dict[str, Any] | None:
    """The configuration saved in the newest checkpoint of ``out`` (rank 0 reads, all get it;
    a damaged checkpoint is reported once, when the run loads it).

    Raises:
        ConfigError: no such folder, or no usable checkpoint in it.
    """
    from drivers.engine._checkpoint import CheckpointError, stored_config
    from drivers.engine._config import ConfigError

    cfg, error = None, None
    if comm.rank == 0:
        try:
            if out.exists() and not out.is_dir():
                error = f"{out} is a file, not a results folder"
            elif not out.is_dir():
                error = f"no such folder: {out}"
            else:
                cfg, _ = stored_config(out, on_damaged=lambda message: None)
        except CheckpointError as exc:  # no checkpoint
            error = (
                f"{exc}: the run wrote none (a checkpoint is written every "
                "output.checkpoint_minutes, every output.checkpoint_every steps and on "
                "SIGINT/SIGTERM)"
            )
        except ValueError as exc:  # a damaged config
            error = str(exc)
    error = comm.bcast(error, root=0)
    if error is not None:
        raise ConfigError("--restart", error)
    return comm.bcast(cfg, root=0)


def _gaussian(args: argparse.Namespace, comm: Any, command_line: list[str]) -> int:
    """The moment ODE is small: rank 0 solves and writes; the exit code is broadcast."""
    import uuid

    from drivers.engine._config import ConfigError
    from drivers.engine._folder import claim_folder, describe
    from drivers.engine._gaussian_command import load_gaussian_config, run_gaussian

    code = 0
    if comm.rank == 0:
        out = Path(args.out) if args.out else Path("results") / Path(args.config).stem
        folder = None
        try:
            cfg = load_gaussian_config(args.config, args.overrides)
            folder = claim_folder(out, None, uuid.uuid4().hex, overwrite=args.overwrite)
            code = run_gaussian(cfg, out, verbose=not args.quiet, argv=command_line)
        except ConfigError as exc:
            print(f"transformer-pde: error: {exc}", file=sys.stderr, flush=True)
            code = 2
        except OSError as exc:  # a write failed (a full disk): what was written is kept
            where = f" {exc.filename}" if exc.filename else ""
            print(f"transformer-pde: error: cannot write{where}: {describe(exc)}",
                  file=sys.stderr, flush=True)  # fmt: skip
            code = 3
        finally:
            if folder is not None:
                folder.release()
    return comm.bcast(code, root=0)


if __name__ == "__main__":
    sys.exit(main())
