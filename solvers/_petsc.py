"""PETSc plumbing shared by the solvers: option prefixes, convergence checks, destruction.

Kept apart from the numerics (STYLE.md item 1), like ``dolfinx/fem/petsc.py``.

Options. A solver owns a mandatory prefix (e.g. ``"jko_"``). :func:`apply_options` writes its
defaults into the PETSc options database under that prefix *only where the user has not set
the key already* (so ``-jko_snes_rtol 1e-12`` on the mpirun command line wins over a default),
then the explicit ``petsc_options`` dict (which wins over both), calls ``setFromOptions`` on the
objects, and finally removes every key it inserted and restores every value it overwrote, in
a ``finally`` block: a failed set-up never leaves a polluted prefix behind (docs/numerics.md, PETSc notes).

Convergence. :func:`snes_reason_name` / :func:`ksp_reason_name` turn PETSc's integer reasons
into their names (``"DIVERGED_MAX_IT"``); :func:`check_snes` raises
:class:`solvers.errors.SolverError` naming the reason when a SNES did not converge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import dolfinx_solver  # noqa: F401
from petsc4py import PETSc

from solvers.errors import SolverError

__all__ = [
    "apply_options",
    "check_snes",
    "destroy",
    "ksp_reason_name",
    "snes_reason_name",
    "validate_prefix",
]


def validate_prefix(prefix: Any) -> str:
    """A non-empty options prefix ending in ``_`` without whitespace (ValueError otherwise)."""
    if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
        raise ValueError(f"petsc_options_prefix must be a non-empty string, got {prefix!r}")
    if prefix.startswith("-"):
        raise ValueError(f"petsc_options_prefix must not start with '-', got {prefix!r}")
    if not prefix.endswith("_"):
        raise ValueError(f"petsc_options_prefix must end with '_', got {prefix!r}")
    return prefix


def _option_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def apply_options(
    prefix: str,
    defaults: Mapping[str, Any],
    overrides: Mapping[str, Any] | None,
    set_from_options: Iterable[Callable[[], None]],
) -> None:
    """Push ``defaults`` (unless already set) and ``overrides`` under ``prefix``; configure.

    Every key this call inserted is removed afterwards, and every key it overwrote gets its
    previous value back, also when a callable raises.

    Args:
        prefix: the options prefix (``validate_prefix``).
        defaults: option name (without prefix or dash) -> value; inserted only if absent.
        overrides: the user's ``petsc_options``; always inserted (a value None means a flag).
        set_from_options: callables run while the options are in place, e.g.
            ``[snes.setFromOptions]``.
    """
    opts = PETSc.Options()
    inserted: list[str] = []
    restored: dict[str, str] = {}
    try:
        for key, value in defaults.items():
            name = prefix + key
            if not opts.hasName(name):
                opts.setValue(name, _option_value(value))
                inserted.append(name)
        for key, value in (overrides or {}).items():
            name = prefix + str(key).lstrip("-")
            if opts.hasName(name):
                if name not in inserted and name not in restored:
                    restored[name] = opts.getString(name, "")
            elif name not in inserted:
                inserted.append(name)
            opts.setValue(name, _option_value(value))
        for call in set_from_options:
            call()
    finally:
        for name in inserted:
            opts.delValue(name)
        for name, value in restored.items():
            opts.setValue(name, value)


def _reason_names(enum: Any) -> dict[int, str]:
    return {
        int(getattr(enum, name)): name
        for name in dir(enum)
        if name.isupper() and isinstance(getattr(enum, name), int)
    }


_SNES_REASONS = _reason_names(PETSc.SNES.ConvergedReason)
_KSP_REASONS = _reason_names(PETSc.KSP.ConvergedReason)


def snes_reason_name(reason: int) -> str:
    """The name of a ``SNESConvergedReason`` (e.g. ``"CONVERGED_FNORM_RELATIVE"``)."""
    return _SNES_REASONS.get(int(reason), f"UNKNOWN({int(reason)})")


def ksp_reason_name(reason: int) -> str:
    """The name of a ``KSPConvergedReason`` (e.g. ``"DIVERGED_ITS"``)."""
    return _KSP_REASONS.get(int(reason), f"UNKNOWN({int(reason)})")


def check_snes(snes: PETSc.SNES, what: str, t: float | None = None) -> None:
    """Raise SolverError (with the reason name, iterations and residual) if SNES diverged."""
    reason = snes.getConvergedReason()
    if reason > 0:
        return
    ksp_reason = snes.getKSP().getConvergedReason()
    raise SolverError(
        f"{what}: SNES did not converge: {snes_reason_name(reason)} ({reason}) after "
        f"{snes.getIterationNumber()} Newton iterations, residual norm "
        f"{snes.getFunctionNorm():.3e}; last KSP {ksp_reason_name(ksp_reason)}",
        t=t,
    )


def destroy(*objects: Any) -> None:
    """Destroy PETSc objects (collective: call on every rank, in the same order)."""
    for obj in objects:
        if obj is not None:
            obj.destroy()
