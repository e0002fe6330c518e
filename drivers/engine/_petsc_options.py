"""PETSc options of the command line that no solver of the run reads, reported at start-up.

A run owns the options prefixes of :func:`owned`: that of each scheme with PETSc solvers,
from its :class:`~solvers.transport.SchemeSpec` (``petsc_options_prefix``: ``jko_``, the
SNES/KSP/PC of the JKO scheme), and :data:`WEIGHT_LAW_PREFIX` (``theta_``, the KSP of the
weight law of ``weights.dynamics = "fokker-planck"``). Their
solvers are built with the problem and read their options then (the JKO fieldsplit blocks
and their ASM sub-solvers included, ``solvers._petsc.apply_options``), so once the problem is
built an option with an owned prefix that PETSc reports as not used (``PetscOptionsUsed``)
is misspelt, belongs to a solver this run does not have (``-jko_...`` on an fv run), or is
not read with these settings (``-jko_pc_fieldsplit_schur_fact_type`` when the fieldsplit is
not Schur). :func:`check_start_up` reports them on one line on stderr (a warning), or raises
:class:`~drivers.engine.ConfigError` (exit 2) with ``strict``; either way they are removed from
the options database, so PETSc does not list them again when it finalises.

Options of the ``*_view`` family (``-jko_snes_view``, ``-jko_ksp_view_...``) are read when a
solve ends: they are checked after the first step (:func:`check_after_first_step`, a
warning, also with ``strict``). Options without an owned prefix are PETSc's own business
(PETSc lists unused ones when it finalises). Collective: rank 0 decides, every rank gets the
same verdict.
"""

from __future__ import annotations

import sys
from typing import Any

from drivers.engine._config import ConfigError

__all__ = ["WEIGHT_LAW_PREFIX", "check_after_first_step", "check_start_up", "owned"]

#: the options prefix of the weight law's KSP (``weights.dynamics = "fokker-planck"``)
WEIGHT_LAW_PREFIX = "theta_"


def owned() -> dict[str, tuple[str, tuple[str, str], str]]:
    """The options prefixes a run owns: prefix -> (the solver in words, the setting that
    builds it, its value). The schemes' from the registry (:class:`~solvers.transport.SchemeSpec`
    ``petsc_options_prefix``), then the weight law's."""
    from solvers.transport import SCHEME_SPECS

    out = {
        s.petsc_options_prefix: (f"the {s.title} scheme", ("time", "scheme"), s.name)
        for s in SCHEME_SPECS.values()
        if s.petsc_options_prefix
    }
    out[WEIGHT_LAW_PREFIX] = ("the weight law", ("weights", "dynamics"), "fokker-planck")
    return out


def _why(name: str, cfg: dict[str, Any]) -> str:
    table = owned()
    prefix = next(p for p in table if name.startswith(p))
    solver, (section, key), value = table[prefix]
    if cfg[section][key] != value:
        return (
            f"-{name} (no {prefix} solver: {section}.{key} is {cfg[section][key]!r}, not {value!r})"
        )
    return f"-{name} (not read by {solver}: misspelt, or unused with these settings)"


def _unused(names: list[str] | None = None) -> list[str]:
    from petsc4py import PETSc

    opts = PETSc.Options()
    if names is None:
        names = sorted(n for n in opts.getAll() if n.startswith(tuple(owned())))
    return [n for n in names if not opts.used(n)]  # (hasName would mark it used)


def _forget(names: list[str]) -> None:
    from petsc4py import PETSc

    opts = PETSc.Options()
    for name in names:
        opts.delValue(name)


def check_start_up(cfg: dict[str, Any], comm: Any, strict: bool = False) -> list[str]:
    """Report the unused options of the owned prefixes once the problem is built (module
    docstring). Collective.

    Returns:
        The options read only when a solve ends (``*_view``), to check after the first step.

    Raises:
        ConfigError: with ``strict``, when an option is not used (exit 2, one line).
    """
    now: list[str] = []
    later: list[str] = []
    if comm.rank == 0:
        table = owned()
        for name in _unused():
            prefix = next(p for p in table if name.startswith(p))
            _, (section, key), value = table[prefix]
            active = cfg[section][key] == value
            (later if active and "view" in name else now).append(name)
    now, later = comm.bcast((now, later), root=0)
    if now:
        _forget(now)
        reasons = "; ".join(_why(n, cfg) for n in now)
        if strict:
            raise ConfigError("PETSc options", f"not used by this run: {reasons} (--strict-petsc)")
        if comm.rank == 0:
            print(
                f"transformer-pde: warning: PETSc options not used by this run: {reasons}",
                file=sys.stderr,
                flush=True,
            )
    return later


def check_after_first_step(names: list[str], cfg: dict[str, Any], comm: Any) -> None:
    """The ``*_view`` options of :func:`check_start_up` that the first step did not read:
    one warning line (collective)."""
    if not names:
        return
    unused = _unused(names) if comm.rank == 0 else []
    unused = comm.bcast(unused, root=0)
    if unused:
        _forget(unused)
        if comm.rank == 0:
            print(
                "transformer-pde: warning: PETSc options not read by the first step: "
                + "; ".join(_why(n, cfg) for n in unused),
                file=sys.stderr,
                flush=True,
            )
