"""ParaView pictures of a results folder: ``transformer-pde paraview DIR``.

Writes ``DIR/paraview_density.py``, a standalone script for ParaView's own Python (the file
:file:`drivers/engine/io/paraview_density.py`, which imports only ``paraview.simple`` and the
standard library), and runs it with ``pvbatch`` when ParaView is installed. The script opens
``DIR/density.xdmf`` with the ``Xdmf3ReaderT`` reader (VTK's legacy ``XDMF Reader`` segfaults
on DOLFINx function files, in ``vtkXdmfHeavyData::ReadTemporalCollection``),
colours the cell array ``density`` on one log scale for the whole series (``--linear``:
linear) and writes, into FOLDER (default ``DIR/paraview``):

- ``frame_0000.png``, ``frame_0001.png``, ...: one frame per output time;
- ``density.avi`` (ParaView's ``SaveAnimation``, when the ParaView build has FFMPEG, as
  Debian's 5.11 has) and ``density.gif`` (assembled here from the frames with Pillow);
- ``paraview_density.json``: the reader, times, cells per frame (the mesh of an adaptive run
  changes), frames, colour scale and range used.

Behaviour: without ``pvbatch`` on the PATH (or with ``--no-run``) the script is written and
one line says how to run it (``pvbatch DIR/paraview_density.py``, or in the ParaView GUI:
View > Python Shell > Run Script); exit 0. pvbatch needs an X display on Debian: when Xvfb
is installed (``xvfb`` package) a private ``Xvfb -displayfd`` server is started for the run,
else the run uses ``DISPLAY``.
Exit codes: 0 done; 2 invalid input (no folder, no density.xdmf/.h5 in it, a bad option),
one line on stderr; 3 ParaView failed (pvbatch's last error line on stderr, its whole output
in FOLDER/pvbatch.log). Serial: under ``mpiexec`` only rank 0 works.

Example::

    transformer-pde run configs/demo_s2.toml --out results/demo
    transformer-pde paraview results/demo          # -> results/demo/paraview/frame_*.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "SCRIPT",
    "XServerError",
    "X_FAILURES",
    "x_display",
    "pvbatch_env",
    "run_pvbatch",
    "write_script",
    "paraview",
    "add_arguments",
    "run_from_args",
]

#: the pvbatch script, copied into the results folder
SCRIPT = Path(__file__).with_name("paraview_density.py")
#: its name in the results folder, and the report it writes next to the frames
SCRIPT_NAME = "paraview_density.py"
REPORT_NAME = "paraview_density.json"
#: seconds Xvfb may take to accept connections, and how many fresh servers to try
XVFB_START_TIMEOUT = 30
X_ATTEMPTS = 3
#: pvbatch's messages when its X connection, not the data, is at fault
X_FAILURES = (
    "bad X server connection",
    "cannot open display",
    "Could not open display",
    "X connection to",  # "... broken (explicit kill or server shutdown)"
    # Debian's pvbatch (Open MPI singleton) failing to start next to a concurrent one (seen
    # once in a 2-worker test run, with a broken X connection): transient, retried
    "Unable to start a daemon on the local node",
)


class XServerError(RuntimeError):
    """The X display could not be set up (not a fault of the files rendered)."""


@contextlib.contextmanager
def x_display(log: Path) -> Iterator[str | None]:
    """An X display for one pvbatch run: a private Xvfb server, yields its DISPLAY.

    ``Xvfb -displayfd`` picks a display whose sockets it can bind itself and reports the number
    once it accepts connections. ``xvfb-run -a`` instead guesses a free number from the
    /tmp/.X*-lock files; on a CI machine (where :99 was locked) it handed pvbatch a display
    that pvbatch could not use ("bad X server connection. DISPLAY=:100", SIGABRT).
    Without ``-auth`` the server admits local clients only; ``-nolisten tcp`` closes TCP.
    Without Xvfb, yields the existing ``DISPLAY`` (None when there is none: an off-screen
    ParaView build needs none).

    Raises:
        XServerError: Xvfb did not start within XVFB_START_TIMEOUT seconds.
    """
    if shutil.which("Xvfb") is None:
        yield os.environ.get("DISPLAY")
        return
    read_end, write_end = os.pipe()
    with open(log, "ab") as err:
        server = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_end), "-screen", "0", "1024x768x24"]
            + ["-nolisten", "tcp"],
            pass_fds=(write_end,),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    os.close(write_end)
    try:
        number = b""
        deadline = time.monotonic() + XVFB_START_TIMEOUT
        while not number.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_end], [], [], max(left, 0.0))
            chunk = os.read(read_end, 16) if ready else b""
            if not chunk:  # timed out, or Xvfb exited before it was ready
                raise XServerError(f"Xvfb did not start (see {log})")
            number += chunk
        yield f":{int(number)}"
    finally:
        os.close(read_end)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def pvbatch_env(display: str | None) -> dict[str, str]:
    """The environment of pvbatch: ours without Python variables (pvbatch runs the system
    Python), with DISPLAY; our own Xvfb has no cookie, so XAUTHORITY goes with it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    if shutil.which("Xvfb"):
        env.pop("XAUTHORITY", None)
    if display is not None:
        env["DISPLAY"] = display
    return env


def run_pvbatch(
    pvbatch: str, args: Sequence[str], *, log_dir: Path, timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``pvbatch ARGS`` under a fresh X display; retry (X_ATTEMPTS) on X set-up failures.

    The output of the last try is in ``log_dir/pvbatch.log`` (Xvfb's in ``xvfb.log``).

    Raises:
        XServerError: no usable X display after X_ATTEMPTS tries.
        subprocess.TimeoutExpired: pvbatch ran longer than ``timeout`` seconds.
    """
    failures = []
    for _ in range(X_ATTEMPTS):  # a fresh server each time; only X set-up failures retry
        try:
            with x_display(log_dir / "xvfb.log") as display:
                proc = subprocess.run(
                    [pvbatch, *args],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env=pvbatch_env(display),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                )
        except XServerError as exc:
            failures.append(str(exc))
            continue
        (log_dir / "pvbatch.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 and any(m in proc.stdout + proc.stderr for m in X_FAILURES):
            failures.append(f"pvbatch could not use display {display}")
            if display is None or shutil.which("Xvfb") is None:
                break  # no server of ours to replace
            continue
        return proc
    raise XServerError(
        f"no usable X display for pvbatch ({'; '.join(failures)}); "
        "install xvfb (apt-get install xvfb) or set DISPLAY"
    )


def _n_steps(xdmf: Path) -> int:
    """The number of output times listed in a density.xdmf."""
    try:
        root = ET.parse(xdmf).getroot()
    except ET.ParseError as exc:
        raise ValueError(f"{xdmf}: not a valid XDMF file ({exc})") from None
    n = sum(1 for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "Time")
    if n == 0:
        raise ValueError(f"{xdmf}: the series has no time steps")
    return n


def write_script(out_dir: str | Path) -> Path:
    """Copy the pvbatch script into a results folder; returns its path.

    The copy knows the folder (``RESULTS``), for the GUI's Run Script, which may not set
    ``__file__``; pvbatch finds ``density.xdmf`` beside the script.
    """
    out_dir = Path(out_dir).resolve()
    text = SCRIPT.read_text()
    marker = "\nRESULTS = None\n"
    if marker not in text:
        raise RuntimeError(f"{SCRIPT}: no line 'RESULTS = None' to fill in")
    text = text.replace(marker, f"\nRESULTS = {str(out_dir)!r}\n", 1)
    path = out_dir / SCRIPT_NAME
    tmp = path.with_name(f".{SCRIPT_NAME}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _how_to_run(script: Path, argv: Sequence[str]) -> str:
    extra = "".join(f" {a}" for a in argv)
    return (
        f"run it with: pvbatch {script}{extra} (or in the ParaView GUI: "
        "View > Python Shell > Run Script)"
    )


#: colour codes of ParaView's log lines, and the lines of a native stack trace
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STACK_FRAME = re.compile(r"^\d+\s+0x[0-9a-fA-F]+\s")
#: what says why, most telling first: our script's error, a Python exception, ParaView's
#: error log, a C++ exception that ended the process
_WHY = (
    re.compile(r"paraview_density: error: (.*)"),
    re.compile(r"^(\w*(?:Error|Exception)\b.*)"),
    re.compile(r"\bERR\| (.*)"),
    re.compile(r"^(terminate called .*)"),
)


def _failure(proc: subprocess.CompletedProcess[str]) -> str:
    """One line on why pvbatch failed, from its exit status and output."""
    rc = proc.returncode
    try:
        what = f"crashed ({signal.Signals(-rc).name})" if rc < 0 else f"failed (exit {rc})"
    except ValueError:
        what = f"failed (exit {rc})"
    lines = [
        " ".join(_ANSI.sub("", line).split()) for line in (proc.stdout + proc.stderr).split("\n")
    ]
    lines = [line for line in lines if line and not _STACK_FRAME.match(line)]
    for pattern in _WHY:
        found = [m.group(1) for line in lines if (m := pattern.search(line))]
        if found:
            return f"pvbatch {what}: {found[-1]}"
    return f"pvbatch {what}: {lines[-1] if lines else 'no output'}"


def _write_gif(folder: Path, frames: Sequence[str], fps: float) -> Path | None:
    """density.gif from the PNG frames (Pillow); None when Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:
        return None
    from drivers.engine.io._pictures import write_gif

    images = []
    for name in frames:
        with Image.open(folder / name) as im:
            images.append(im.convert("RGB"))
    path = folder / "density.gif"
    tmp = folder / ".density.gif.tmp.gif"
    try:
        write_gif(tmp, images, fps)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class ParaViewError(RuntimeError):
    """pvbatch was found but did not render (exit code 3)."""


def paraview(
    out_dir: str | Path,
    folder: str | Path | None = None,
    fps: float = 8.0,
    linear: bool = False,
    run: bool = True,
) -> tuple[Path, dict | None]:
    """Write ``out_dir/paraview_density.py`` and, with pvbatch, render the frames.

    Args:
        out_dir: the results folder (with density.xdmf and density.h5).
        folder: where the frames go (default ``out_dir/paraview``).
        fps: frames per second of the animations.
        linear: a linear colour scale instead of the log one.
        run: False writes the script only.

    Returns:
        The script's path, and the script's report (``paraview_density.json``, with
        ``folder``, ``gif`` added) or None when pvbatch was not run.

    Raises:
        ValueError: one-line message: no results folder, no density series, bad options.
        ParaViewError: pvbatch failed (one line; its output in ``folder/pvbatch.log``).
    """
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps):
        raise ValueError(f"fps must be a number > 0, got {fps!r}")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps!r}")
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir}: no such folder")
    xdmf, h5 = out_dir / "density.xdmf", out_dir / "density.h5"
    if not xdmf.is_file() or not h5.is_file():
        raise ValueError(
            f"{out_dir}: no density.xdmf with density.h5 here (not a transformer-pde results folder?)"
        )
    n_steps = _n_steps(xdmf)
    folder = Path(folder) if folder is not None else out_dir / "paraview"
    if not folder.parent.is_dir():
        raise ValueError(f"{folder}: folder {folder.parent} does not exist")
    try:
        script = write_script(out_dir)
    except OSError as exc:
        raise ValueError(f"{out_dir}: cannot write {SCRIPT_NAME} ({exc.strerror})") from None
    argv = [str(xdmf.resolve()), "--out", str(folder.resolve()), "--fps", f"{fps:g}"]
    argv += ["--linear"] if linear else []
    pvbatch = shutil.which("pvbatch")
    if not run or pvbatch is None:
        return script, None
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{folder}: cannot create the folder ({exc.strerror})") from None
    report_path = folder / REPORT_NAME
    report_path.unlink(missing_ok=True)
    try:
        proc = run_pvbatch(
            pvbatch, [str(script), *argv], log_dir=folder, timeout=300 + 10 * n_steps
        )
    except XServerError as exc:
        raise ParaViewError(str(exc)) from None
    except subprocess.TimeoutExpired as exc:
        raise ParaViewError(f"pvbatch did not finish in {exc.timeout:g} s") from None
    log = folder / "pvbatch.log"
    if proc.returncode != 0 or not report_path.is_file():
        raise ParaViewError(f"{_failure(proc)} (see {log})")
    report = json.loads(report_path.read_text())
    missing = [f for f in report["frames"] if not (folder / f).is_file()]
    if missing or not report["frames"]:
        raise ParaViewError(f"pvbatch wrote no frame {missing[:1]} (see {log})")
    gif = _write_gif(folder, report["frames"], float(fps))
    report.update(folder=str(folder), gif=gif.name if gif else None)
    return script, report


# --------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``paraview`` (shared with the command line, ``_cli``)."""
    parser.add_argument("dir", help="results folder with density.xdmf/.h5")
    parser.add_argument(
        "--out", default=None, metavar="FOLDER", help="folder of the frames (default DIR/paraview)"
    )
    parser.add_argument("--fps", type=float, default=8.0, help="frames per second (default 8)")
    parser.add_argument(
        "--no-run",
        dest="run",
        action="store_false",
        help="only write DIR/paraview_density.py (do not run pvbatch)",
    )
    parser.add_argument(
        "--linear", action="store_true", help="linear colour scale (default: log over the series)"
    )


def _mpi_rank() -> int:
    """The rank from the launcher's environment (no MPI import; 0 when not under mpiexec)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _say(message: str, error: bool = False) -> None:
    line = " ".join(message.split())
    print(f"transformer-pde: {line}", file=sys.stderr if error else sys.stdout, flush=True)


def run_from_args(args: argparse.Namespace) -> int:
    """Exit code of ``paraview``: 0; 2 invalid input; 3 ParaView failed (one line each)."""
    if _mpi_rank() != 0:
        return 0
    try:
        script, report = paraview(args.dir, args.out, args.fps, args.linear, args.run)
    except ValueError as exc:
        _say(f"error: {exc}", error=True)
        return 2
    except ParaViewError as exc:
        _say(f"error: {exc}", error=True)
        return 3
    if report is None:
        why = "" if not args.run else "pvbatch not found on the PATH; "
        extra = ["--out", str(Path(args.out).resolve())] if args.out is not None else []
        extra += ["--fps", f"{args.fps:g}"] if args.fps != 8.0 else []
        extra += ["--linear"] if args.linear else []
        _say(f"wrote {script}; {why}{_how_to_run(script, extra)}")
        return 0
    folder, n = report["folder"], len(report["frames"])
    lo, hi = report["colour_range"]
    movies = ", ".join(m for m in (report.get("animation"), report.get("gif")) if m)
    _say(
        f"wrote {n} frames to {folder} ({report['scale']} colour scale {lo:.3g} .. {hi:.3g})"
        + (f" and {movies}" if movies else "")
        + f"; script {script}"
    )
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own code)
        self.exit(2, f"transformer-pde paraview: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m drivers.engine.io._paraview DIR [--out FOLDER] [--fps N] [--no-run] [--linear]``."""
    parser = _Parser(prog="transformer-pde paraview", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
