"""Old import paths of moved modules.

The packages are grouped by concept (``solvers.attention``, ``solvers.transport``, ...); the
flat modules of earlier versions (``solvers.jko``, ``solvers.kernels``, ``drivers.cli``, ...)
keep working: importing an old name gives the module at its new home, the same object (so
``solvers.jko.JKOSolver is solvers.transport.JKOSolver``). Each package registers its table
of moves with :func:`register_moves` in its ``__init__``; nothing is imported until an old name
is asked for.

Mechanism: a finder appended to :data:`sys.meta_path` (after the normal path finders, so a real
module of that name always wins) returns a spec whose loader puts the new module into
:data:`sys.modules` under the old name. ``python -m OLD.NAME`` runs the new module's code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MOVED", "register_moves"]

#: old module name -> new module name (every registered move)
MOVED: dict[str, str] = {}


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the old name once this
        # returns, without touching its attributes: the new module itself.
        sys.modules[module.__name__] = importlib.import_module(self.target)

    def get_code(self, fullname: str) -> Any:
        """The new module's code (for ``python -m OLD.NAME``)."""
        spec = importlib.util.find_spec(self.target)
        if spec is None or spec.loader is None:
            raise ImportError(f"{self.target} (the new home of {fullname}) not found")
        return spec.loader.get_code(self.target)  # type: ignore[attr-defined]


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))


def register_moves(moves: Mapping[str, str]) -> None:
    """Make each old module name in ``moves`` import as its new module (idempotent)."""
    MOVED.update(moves)
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
