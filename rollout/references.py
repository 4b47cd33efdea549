"""`package.module:attribute` references: how environments, sandbox kinds and engine scripts are named.

`import_reference` imports the module and returns the attribute, or raises `ReferenceLoadError` saying which
part is wrong (the shape, the module and why it does not import, or the missing attribute). Callers wrap the
message in their own error type.

Every process resolves references the same way (`rollout env check`, `train`, `run start`, runners): from the
installed packages, the directory the process runs in, and $PYTHONPATH, as `python -m` would. `import_path()`
is that search path beyond the installed packages; the embedded stack hands a runner the caller's, so an
environment in the user's own folder plays on the runner too.
"""

from __future__ import annotations

import importlib
import os
import sys


def import_path() -> list[str]:
    """The working directory, then each $PYTHONPATH entry: where references are found beyond installed
    packages."""
    entries = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return list(dict.fromkeys(os.path.abspath(entry) for entry in entries if entry))


def _working_directory_importable() -> None:
    # A console script's sys.path starts at its bin/ directory, not the working directory (unlike `python
    # -m`).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


class ReferenceLoadError(ValueError):
    pass


def import_reference(reference: str, what: str = "reference") -> object:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ReferenceLoadError(f"{reference!r} is not a {what}: write it as package.module:attribute")
    _working_directory_importable()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        hint = ""
        if error.name is not None and module_name.startswith(error.name):
            hint = (
                f" (looked in the installed packages, in {os.getcwd()} and in $PYTHONPATH: run from the folder "
                "that holds it, or add that folder to PYTHONPATH)"
            )
        raise ReferenceLoadError(f"module {module_name!r} does not import: {error}{hint}") from error
    except Exception as error:
        raise ReferenceLoadError(
            f"module {module_name!r} does not import: {type(error).__name__}: {error}"
        ) from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ReferenceLoadError(f"module {module_name!r} has no attribute {attribute!r}") from None
