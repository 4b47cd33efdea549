"""Environments as the runner imports them: again when their module's file changed.

Contract: `load_current(reference)` is `rollout.environment.load_environment(reference)`, except that a module
already imported whose file changed since this process imported it is imported again first, so a user who
fixed a paused run's environment resumes it on the new code without restarting runners. A changed module that
no longer imports raises `EnvironmentLoadError` saying so. Modification times are kept per file, for this
process.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from rollout.environment import Environment, EnvironmentLoadError, load_environment

__all__ = ["load_current"]

# The modification time of each environment module when this process imported it.
_imported_at: dict[str, float] = {}


def _module_file(reference: str) -> tuple[ModuleType, str, float] | None:
    module = sys.modules.get(reference.partition(":")[0])
    file = getattr(module, "__file__", None)
    if module is None or file is None:
        return None
    try:
        return module, file, os.stat(file).st_mtime
    except OSError:
        return None


def _reload_if_changed(reference: str) -> None:
    if (found := _module_file(reference)) is None:
        return
    module, file, modified = found
    if _imported_at.setdefault(file, modified) != modified:
        _imported_at[file] = modified
        try:
            importlib.reload(module)
        except Exception as error:
            reason = (
                f"module {module.__name__!r} changed and does not import: {type(error).__name__}: {error}"
            )
            raise EnvironmentLoadError(reason) from error


def load_current(reference: str) -> Environment:
    _reload_if_changed(reference)
    loaded = load_environment(reference)
    if (found := _module_file(reference)) is not None:  # imported just now: as it is now
        _imported_at.setdefault(found[1], found[2])
    return loaded
