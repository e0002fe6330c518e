"""The preamble that every experiment script in drivers/ shares.

An experiment ``drivers/NAME.py`` starts its ``main`` with::

    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()  # --tiny and --out (default results/NAME)
    parser.add_argument("--beta", type=float, default=9.0, help="inverse temperature")
    args = experiment.start(parser, argv)  # parse, then prepare(args.out)
    log = experiment.log  # print on rank 0 only

:meth:`Experiment.start` parses the command line and calls :meth:`Experiment.prepare`, which
shares the cores of the node between the MPI ranks and numba's threads
(:func:`solvers.threads.configure_threads`; ``import solvers`` does not) and creates the
output folder (rank 0, then a barrier). Nothing here is collective before that.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

from drivers.engine import provenance, write_json
from solvers.threads import configure_threads

__all__ = ["Experiment"]


class Experiment:
    """Name, communicator, command line, log and output folder of one experiment script.

    Args:
        script: the path of the script (``__file__``); its stem names the experiment in the
            log and in the default output folder ``results/<stem>``.
        doc: the module docstring (``__doc__``); its first line describes the command line.
        comm: the communicator of the run (all ranks take part in :meth:`start`).
    """

    def __init__(self, script: str, doc: str | None, comm: MPI.Comm = MPI.COMM_WORLD) -> None:
        self.name = Path(script).stem
        self.arguments: dict[str, Any] = {}
        self.argv: list[str] = [f"drivers/{self.name}.py", *sys.argv[1:]]
        self.provenance: dict[str, Any] = {}
        self.description = doc.strip().splitlines()[0] if doc and doc.strip() else self.name
        self.comm = comm

    def parser(self) -> argparse.ArgumentParser:
        """The command line every experiment has; the script adds its own arguments.

        Returns:
            A parser with ``--tiny`` (a problem of seconds) and ``--out`` (the output
            folder, default ``results/<script name>``).
        """
        parser = argparse.ArgumentParser(description=self.description)
        parser.add_argument("--tiny", action="store_true", help="a very small problem (seconds)")
        parser.add_argument("--out", type=Path, default=Path("results") / self.name)
        return parser

    def start(
        self, parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
    ) -> argparse.Namespace:
        """Parse the command line, configure the threads and create the output folder.

        Args:
            parser: the parser of :meth:`parser` with the script's own arguments added.
            argv: the arguments (default: ``sys.argv[1:]``).

        Returns:
            The parsed arguments; ``args.out`` exists on return, on every rank.

        Raises:
            SystemExit: on a malformed command line or ``--help`` (argparse).
        """
        args = parser.parse_args(argv)
        self.arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        self.argv = [f"drivers/{self.name}.py", *(sys.argv[1:] if argv is None else argv)]
        self.prepare(args.out)
        return args

    def prepare(self, out: Path) -> Path:
        """Configure the threads and create the output folder (collective).

        :meth:`start` does this after parsing; a script that checks its arguments further
        calls it itself, after the checks.

        Args:
            out: the output folder.

        Returns:
            ``out``, which exists on return, on every rank.
        """
        configure_threads()
        if self.comm.rank == 0:
            self.provenance = provenance(self.argv, self.comm.size)
        return self.folder(out)

    def folder(self, path: Path) -> Path:
        """Create ``path`` (and its parents) on rank 0; collective (a barrier follows).

        Args:
            path: the folder to create; an existing folder is kept as it is.

        Returns:
            ``path``, which every rank can then write into.
        """
        if self.comm.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        self.comm.barrier()
        return path

    def write_summary(self, out: Path, summary: dict[str, Any]) -> None:
        """Write ``out/summary.json`` (rank 0): ``summary`` with the command-line arguments
        (``parameters``) and the provenance (version, commit, command line, host, threads:
        :func:`drivers.engine.provenance`).

        Args:
            out: the output folder.
            summary: what the experiment found (JSON-ready values, numpy arrays allowed).
        """
        data = {**summary, "parameters": self.arguments, "provenance": self.provenance}
        write_json(Path(out) / "summary.json", data)

    def log(self, message: str) -> None:
        """Print ``[<script name> <size> rank(s)] message`` on rank 0 only, flushed.

        Args:
            message: the line to print.
        """
        if self.comm.rank == 0:
            print(f"[{self.name} {self.comm.size} rank(s)] {message}", flush=True)


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """A CSV with a header (the first row's keys) and one line per row (csv defaults; the
    caller is rank 0).

    Args:
        path: the CSV file.
        rows: the rows (at least one).
    """
    import csv

    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
