"""Parameter sweeps: ``transformer-pde sweep CONFIG --grid KEY=v1,v2 [--grid ...] --out DIR``.

One run per point of the product of the grids, each in its own folder under DIR named from
its parameters (``DIR/beta=2``, ``DIR/beta=2,sign=-1``), then ``DIR/sweep.csv`` (the
parameters, status and final metrics of every run) and ``DIR/sweep.png`` (metrics against t,
one line per run; :mod:`drivers.engine._sweep_table`).

Grid keys are dotted config keys: ``section.key`` (``attention.beta``, ``time.scheme``), and
inside a list of tables ``section.key.N.field`` or ``section.key[N].field``
(``attention.heads.0.V``, as the validator names it). The values are a comma-separated TOML
list (``1,2.5,4``, ``"fv","jko"``, ``"identity",[[1,0,0],[0,2,0],[0,0,1]]``); where that is not
TOML, each comma-separated piece is read as a TOML value or else as a bare string
(``fv,jko``). Every point is validated before any run starts (the config validator, the
density expression, the memory estimate): an invalid value in any point stops the sweep with
one line (exit 2) and nothing runs.

Each run folder gets ``config.toml``, the point's resolved configuration (``transformer-pde
run DIR/NAME/config.toml --out ...`` repeats that run). A sweep started again resumes: a run
whose summary.json says it ended (status "ok" or "failed") with the same configuration is
skipped (one line says so); an unfinished one (status "running" or "interrupted", or a
changed ``time.t_end``) continues from its newest checkpoint (``--restart``) or, without a
usable checkpoint, runs again from t = 0. A folder holding a run of another configuration
stops the sweep before any work (exit 2).

Runs go one after the other in this process (under ``mpiexec`` on all its ranks), or with
``--jobs K`` (serial launches only) K at once as single-rank subprocesses
(``python -m drivers run``), the cores shared among them (``NUMBA_NUM_THREADS``); a
subprocess's output is in ``DIR/NAME/run.log``. Pictures of the runs are off unless
``--pictures``.

Exit codes: 0 every run ended "ok"; 2 invalid input (before any run); 3 a run failed (the
others still ran); 130/143 interrupted (SIGINT/SIGTERM: the running runs checkpoint; start the
sweep again to resume it).
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.engine._config import (
    DEFAULTS,
    RESTART_KEYS,
    ConfigError,
    dimension,
    read_toml,
    validate,
)
from drivers.engine._folder import config_hash, describe, read_summary
from drivers.engine._sweep_table import (
    sweep_figure,
    sweep_rows,
    toml_text,
    toml_value,
    value_text,
    write_sweep_csv,
)

__all__ = ["Grid", "Point", "parse_grid", "plan_sweep", "run_from_args", "run_sweep", "toml_text"]

#: a value that can be part of a folder name as it is
_SAFE = re.compile(r"^[A-Za-z0-9._+-]{1,40}$")
#: statuses of a run that ended: skipped when the sweep is started again
DONE = ("ok", "failed")
#: keys left out when the configuration of a finished run is compared with its point's
_IGNORED = (("output", "pictures"), ("output", "progress"))


@dataclass(frozen=True)
class Grid:
    """One ``--grid KEY=v1,v2,...``.

    Attributes:
        key: the key as given (``attention.heads[0].V``).
        path: its parts, list indices as integers (``("attention", "heads", 0, "V")``).
        values: the values (TOML).
        label: the key in folder names (its last name when no other grid has it).
    """

    key: str
    path: tuple[str | int, ...]
    values: tuple[Any, ...]
    label: str = ""


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its folder name, parameters (grid key -> value), resolved config
    and results folder."""

    name: str
    params: dict[str, Any]
    cfg: dict[str, Any]
    out: Path


# ------------------------------------------------------------------------------ grids
def _key_path(key: str) -> tuple[str | int, ...]:
    """``attention.heads[0].V`` or ``attention.heads.0.V`` -> ("attention", "heads", 0, "V").

    Raises:
        ConfigError: not ``section.key`` followed by ``.name`` / ``.N`` / ``[N]`` parts.
    """
    text = re.sub(r"\[(\d+)\]", r".\1", key.strip())
    parts = text.split(".")
    if len(parts) < 2 or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|\d+", p) for p in parts):
        raise ConfigError(
            "--grid",
            f"expected KEY=v1,v2,... with KEY a dotted config key such as attention.beta or "
            f"attention.heads.0.V, got {key!r}",
        )
    if parts[0].isdigit() or parts[1].isdigit():
        raise ConfigError("--grid", f"{key!r}: the key starts with section.key")
    return tuple(int(p) if p.isdigit() else p for p in parts)


def _values(text: str, key: str) -> tuple[Any, ...]:
    """The values of a grid: a TOML list without its brackets, or comma-separated TOML values
    and bare strings."""
    try:
        values = tomllib.loads(f"v = [{text}]")["v"]
    except tomllib.TOMLDecodeError:
        values = []
        for piece in text.split(","):
            piece = piece.strip()
            try:
                values.append(tomllib.loads(f"v = {piece}")["v"])
            except tomllib.TOMLDecodeError:
                values.append(piece)
    if not values or any(v == "" for v in values):
        raise ConfigError("--grid", f"{key}: no value (expected {key}=v1,v2,...), got {text!r}")
    seen: list[Any] = []
    for v in values:
        if any(v == s and type(v) is type(s) for s in seen):
            raise ConfigError("--grid", f"{key}: the value {v!r} is given twice")
        seen.append(v)
    return tuple(values)


def parse_grid(item: str) -> Grid:
    """One ``--grid KEY=v1,v2,...`` (module docstring).

    Raises:
        ConfigError: ``--grid``, with one line.
    """
    if "=" not in item:
        raise ConfigError("--grid", f"expected KEY=v1,v2,..., got {item!r}")
    key, text = item.split("=", 1)
    key = key.strip()
    return Grid(key, _key_path(key), _values(text, key))


def _labelled(grids: list[Grid]) -> list[Grid]:
    """The grids with their labels in folder names: the last name of the key when no other
    grid ends with it, else the whole key."""
    seen: dict[tuple[str | int, ...], str] = {}
    for g in grids:
        if g.path in seen:
            raise ConfigError("--grid", f"{g.key} is given twice (as {seen[g.path]} before)")
        seen[g.path] = g.key
    last = [next(str(p) for p in reversed(g.path) if isinstance(p, str)) for g in grids]
    out = []
    for g, name in zip(grids, last, strict=True):
        label = name if last.count(name) == 1 else ".".join(str(p) for p in g.path)
        out.append(Grid(g.key, g.path, g.values, label))
    return out


def _set(raw: dict[str, Any], grid: Grid, value: Any) -> None:
    """Set the grid's key to ``value`` in a raw config (in place; lists of tables copied from
    the config or the defaults first).

    Raises:
        ConfigError: the key leads through a value that is not a table or list, or to an
            index past the end of a list.
    """
    section, name, *rest = grid.path
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        raise ConfigError(str(section), "must be a table")
    if not rest:
        table[name] = value
        return
    if name not in table:
        if name not in DEFAULTS.get(str(section), {}):
            raise ConfigError(grid.key, f"unknown key {section}.{name}")
        table[name] = copy.deepcopy(DEFAULTS[str(section)][name])
    node: Any = table
    steps: list[str | int] = [name, *rest]
    for k, part in enumerate(steps):
        last = k == len(steps) - 1
        where = ".".join(str(p) for p in (section, *steps[: k + 1]))
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ConfigError(grid.key, f"{where}: {where.rsplit('.', 1)[0]} is not a list")
            if part >= len(node):
                raise ConfigError(
                    grid.key, f"no element {part}: the list has {len(node)} (from 0 to "
                    f"{len(node) - 1})"
                )  # fmt: skip
        elif not isinstance(node, dict):
            raise ConfigError(grid.key, f"{where}: {where.rsplit('.', 1)[0]} is not a table")
        if last:
            node[part] = value
        else:
            node = node[part]


def _name(grids: list[Grid], index: tuple[int, ...]) -> str:
    """The folder name of a point: ``label=value`` joined by commas (a value that is not a
    plain word: ``label=#k``, its place in the grid from 1)."""
    parts = []
    for g, i in zip(grids, index, strict=True):
        text = value_text(g.values[i])
        parts.append(f"{g.label}={text if _SAFE.match(text) else f'#{i + 1}'}")
    return ",".join(parts)


def plan_sweep(
    config: str | Path,
    grids: list[str],
    out: str | Path,
    overrides: list[str] | None = None,
    pictures: bool = False,
    comm: Any = None,
) -> list[Point]:
    """Every point of the sweep, validated (module docstring); nothing is written.

    Args:
        config: the TOML file the points start from.
        grids: the ``KEY=v1,v2,...`` items.
        out: the sweep's folder.
        overrides: ``--set section.key=value`` items applied to every point first.
        pictures: ``[output] pictures`` of every run.
        comm: the communicator (for the memory estimate; None: no memory check).

    Raises:
        ConfigError: a grid or an override is malformed, or a point is invalid (the message
            names the point).
    """
    from itertools import product

    from solvers.transport import DensityError, density_function

    if not grids:
        raise ConfigError("--grid", "a sweep needs at least one --grid KEY=v1,v2,...")
    parsed = _labelled([parse_grid(g) for g in grids])
    base = read_toml(config, overrides)
    points: list[Point] = []
    names: dict[str, str] = {}
    for index in product(*(range(len(g.values)) for g in parsed)):
        name = _name(parsed, index)
        params = {g.key: g.values[i] for g, i in zip(parsed, index, strict=True)}
        where = ", ".join(f"{k}={value_text(v)}" for k, v in params.items())
        if name in names:
            raise ConfigError("--grid", f"the points {names[name]} and {where} share the "
                              f"folder {name}")  # fmt: skip
        names[name] = where
        raw = copy.deepcopy(base)
        try:
            for g, i in zip(parsed, index, strict=True):
                _set(raw, g, g.values[i])
            raw.setdefault("output", {})
            if isinstance(raw["output"], dict):
                raw["output"]["pictures"] = pictures
            cfg = validate(raw)
            try:
                density_function(cfg["initial"]["density"], dimension(cfg))
            except DensityError as exc:
                raise ConfigError("initial.density", str(exc)) from None
            if comm is not None:
                from drivers.engine._resources import check_memory

                check_memory(cfg, comm)
        except ConfigError as exc:
            message = str(exc).split(": ", 1)[-1]
            raise ConfigError(exc.key, f"{message} (sweep point {where})") from None
        points.append(Point(name, params, cfg, Path(out) / name))
    return points


# ------------------------------------------------------------------------------ resuming
def _plain(cfg: dict[str, Any]) -> dict[str, Any]:
    """The configuration as summary.json stores it, without :data:`_IGNORED`."""
    plain = json.loads(json.dumps(cfg))
    for section, key in _IGNORED:
        plain.get(section, {}).pop(key, None)
    return plain


def _state(point: Point) -> tuple[str, str]:
    """What to do with a point's folder (rank 0): ("new" | "done" | "restart" | "rerun" |
    "other", why)."""
    out = point.out
    summary = read_summary(out)
    checkpoints = sorted((out / "checkpoint").glob("ckpt_*.npz")) if out.is_dir() else []
    if summary is None:
        if checkpoints or (out / "metrics.csv").exists():
            return "rerun", "no summary.json"
        return "new", ""
    status = summary.get("status", "unknown")
    if summary.get("config_hash") != config_hash(point.cfg):
        return "other", (
            f"{out} holds a run of another configuration (config hash "
            f"{str(summary.get('config_hash'))[:12]}, the point's {config_hash(point.cfg)[:12]}): "
            "remove it or sweep into another --out"
        )
    same = _plain(summary.get("config") or {}) == _plain(point.cfg)
    if status in DONE and same:
        return "done", status
    why = f"status {status}" if status not in DONE else "time.t_end or an output cadence changed"
    return ("restart" if checkpoints else "rerun"), why


# ------------------------------------------------------------------------------ running
class _Say:
    """Sweep lines on rank 0 (stdout; ``quiet``: only those said ``always``)."""

    def __init__(self, comm: Any, quiet: bool) -> None:
        self.rank, self.quiet = comm.rank, quiet

    def __call__(self, message: str, always: bool = False) -> None:
        if self.rank == 0 and (always or not self.quiet):
            print(f"[transformer-pde sweep] {message}", flush=True)


def _write_config(point: Point, command: str) -> None:
    """DIR/NAME/config.toml: the point's resolved configuration (rank 0)."""
    point.out.mkdir(parents=True, exist_ok=True)
    header = (
        f"sweep point {point.name} (written by {command})\n"
        "the resolved configuration of this run: transformer-pde run config.toml repeats it"
    )
    path = point.out / "config.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(toml_text(point.cfg, header))
    tmp.replace(path)


def _agreed(comm: Any, error: str | None) -> str | None:
    """Rank 0's error (a failed write), on every rank."""
    return comm.bcast(error, root=0) if comm.size > 1 else error


def _finish(points: list[Point], out: Path, comm: Any, say: _Say) -> str | None:
    """sweep.csv and sweep.png of the runs that have a summary (rank 0 writes); the error of
    a failed write of sweep.csv, on every rank (None: written)."""
    error = None
    if comm.rank == 0:
        rows = sweep_rows(points)
        try:
            write_sweep_csv(out / "sweep.csv", rows, list(points[0].params))
        except OSError as exc:
            error = f"cannot write {out / 'sweep.csv'}: {describe(exc)}"
        try:
            sweep_figure(out / "sweep.png", points)
        except Exception as exc:  # a picture must never lose a sweep
            print(f"[transformer-pde] warning: could not draw sweep.png: {exc}", file=sys.stderr)
        done = sum(r["status"] in DONE for r in rows)
        say(f"{done} of {len(points)} runs in {out / 'sweep.csv'}, {out / 'sweep.png'}")
    return _agreed(comm, error)


def run_sweep(
    points: list[Point],
    out: str | Path,
    comm: Any,
    *,
    jobs: int = 1,
    quiet: bool = False,
    argv: list[str] | None = None,
) -> int:
    """Run (or resume) the points of :func:`plan_sweep`, then write sweep.csv and sweep.png.
    Collective; returns the exit code (module docstring).

    Raises:
        ConfigError: a folder holds a run of another configuration (before any run), or a
            run's folder cannot be used.
    """
    out = Path(out)
    say = _Say(comm, quiet)
    states = None
    if comm.rank == 0:
        states = [_state(p) for p in points]
    states = comm.bcast(states, root=0)
    other = next((why for state, why in states if state == "other"), None)
    if other is not None:
        raise ConfigError("--out", other)
    command = " ".join(argv or ["transformer-pde", "sweep"])
    error = None
    if comm.rank == 0:
        try:
            out.mkdir(parents=True, exist_ok=True)
            for p, (state, _) in zip(points, states, strict=True):
                if state != "done":
                    _write_config(p, command)
        except OSError as exc:
            where = f" {exc.filename}" if exc.filename else f" in {out}"
            error = f"cannot write{where}: {describe(exc)}"
    error = _agreed(comm, error)
    if error is not None:
        raise ConfigError("--out", error)
    todo = [(p, s) for p, s in zip(points, states, strict=True) if s[0] != "done"]
    for p, (state, why) in zip(points, states, strict=True):
        if state == "done":
            say(f"{p.name}: skipped, it ended before (status {why})", always=True)
    say(f"{len(points)} runs, {len(todo)} to do, in {out}")
    if jobs > 1 and comm.size > 1:
        say(f"--jobs {jobs} under mpiexec: the runs go one after the other on {comm.size} ranks")
    if jobs > 1 and comm.size == 1:
        code = _run_processes(todo, jobs, say)
    else:
        code = _run_here(todo, comm, say, quiet, argv)
    error = _finish(points, out, comm, say)
    if error is not None:
        if comm.rank == 0:
            print(f"transformer-pde: error: {error}", file=sys.stderr, flush=True)
        return code or 3
    return code


def _run_here(
    todo: list[tuple[Point, tuple[str, str]]], comm: Any, say: _Say, quiet: bool, argv: Any
) -> int:
    """The runs one after the other in this process, on all ranks of ``comm``."""
    from drivers.engine._run import run

    code = 0
    for k, (p, (state, why)) in enumerate(todo, start=1):
        restart = state == "restart"
        what = {"new": "", "restart": f" (continued: {why})", "rerun": f" (again: {why})"}
        say(f"run {k}/{len(todo)}: {p.name}{what[state]}")
        try:
            result = run(
                p.cfg,
                p.out,
                comm,
                not quiet,
                restart,
                argv,
                overwrite=state == "rerun",
                keep_final=False,
            )
        except ConfigError as exc:
            if not restart:
                raise
            say(f"{p.name}: cannot continue ({exc}); running it again from t = 0")
            result = run(
                p.cfg, p.out, comm, not quiet, False, argv, overwrite=True, keep_final=False
            )
        if result.exit_code in (130, 143):
            say(f"{p.name}: {result.status}; start the sweep again to resume it")
            return result.exit_code
        if result.exit_code:
            say(f"{p.name}: {result.status}: {result.message}")
            code = 3
    return code


def _child_command(p: Point, state: str) -> list[str]:
    """``python -m drivers run`` of a point: its config.toml, or on a restart its own stored
    configuration with the point's values of the keys a restart may change."""
    cmd = [sys.executable, "-m", "drivers", "run"]
    if state == "restart":
        keys = [f"{s}.{k}={toml_value(p.cfg[s][k])}" for s, k in RESTART_KEYS]
        return [*cmd, "--quiet", "--restart", str(p.out), *(a for k in keys for a in ("--set", k))]
    cmd += [str(p.out / "config.toml"), "--quiet", "--out", str(p.out)]
    return [*cmd, *(["--overwrite"] if state == "rerun" else [])]


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _run_processes(todo: list[tuple[Point, tuple[str, str]]], jobs: int, say: _Say) -> int:
    """The runs as single-rank subprocesses, ``jobs`` at once (serial launches only).

    SIGINT/SIGTERM: passed on to the running subprocesses (they checkpoint and stop), no new
    one starts. A subprocess that exits 2 (bad input) stops new launches too."""
    env = dict(os.environ)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env["NUMBA_NUM_THREADS"] = str(max(1, (cores or 1) // jobs))
    env.setdefault("OMP_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    waiting = list(todo)
    running: dict[subprocess.Popen[bytes], tuple[Point, Any]] = {}
    stop: list[int] = []
    code = 0

    def forward(signum: int, frame: Any) -> None:
        stop.append(signum)
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while waiting or running:
            while waiting and len(running) < jobs and not stop:
                p, (state, why) = waiting.pop(0)
                say(f"start {p.name}" + (f" ({state}: {why})" if state != "new" else ""))
                log = open(p.out / "run.log", "ab")  # noqa: SIM115 (closed when it ends)
                proc = subprocess.Popen(
                    _child_command(p, state), stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,
                )  # fmt: skip
                running[proc] = (p, log)
            time.sleep(0.1)
            for proc in [q for q in running if q.poll() is not None]:
                p, log = running.pop(proc)
                log.close()
                rc = proc.returncode
                line = _last_line(p.out / "run.log")
                say(f"{p.name}: exit {rc}" + (f" ({line})" if rc else ""))
                if rc == 2:
                    stop.append(0)
                    code = 2
                    if say.rank == 0:
                        print(f"transformer-pde: {line or f'{p.name}: exit 2'}", file=sys.stderr)
                elif rc in (130, 143) or rc < 0:
                    code = code or (128 + (-rc if rc < 0 else rc - 128))
                elif rc:
                    code = code or 3
            if stop and not running:
                break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    signum = next((s for s in stop if s), 0)
    if signum:
        say("interrupted; start the sweep again to resume it")
        return 128 + signum
    return code


# ------------------------------------------------------------------------------ command line
def run_from_args(args: Any, comm: Any, argv: list[str], error: Any) -> int:
    """``transformer-pde sweep`` (after the command line handed PETSc its options); returns
    the exit code. ``error(comm, line)`` prints one line on rank 0."""
    import gc

    import numpy as np

    from meshes.sphere import MeshError
    from solvers.transport import DensityError

    if args.jobs < 1:
        error(comm, f"error: --jobs: must be >= 1, got {args.jobs}")
        return 2
    try:
        with np.errstate(all="ignore"):
            points = plan_sweep(
                args.config, args.grids, args.out, args.overrides, args.pictures, comm
            )
            return run_sweep(points, args.out, comm, jobs=args.jobs, quiet=args.quiet, argv=argv)
    except (ConfigError, MeshError) as exc:
        failed = (2, f"error: {exc}")
    except DensityError as exc:  # found when a run builds its density
        failed = (2, f"error: initial.density: {exc}")
    except KeyboardInterrupt:  # between runs, or while a mesh is built
        failed = (130, "sweep interrupted by SIGINT; start it again to resume it")
    except OSError as exc:  # a run's folder
        where = f" {exc.filename}" if exc.filename else ""
        failed = (3, f"error: cannot write{where}: {describe(exc)}")
    gc.collect()  # collective destructors, on every rank at once
    error(comm, failed[1])
    return failed[0]
