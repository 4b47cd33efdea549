"""`package.module:attribute` references: how environments, sandbox kinds and engine scripts are named.

`import_reference` imports the module and returns the attribute, or raises `ReferenceLoadError` saying which
part is wrong (the shape, the module and why it does not import, or the missing attribute). Callers wrap the
message in their own error type.
"""

from __future__ import annotations

import importlib


class ReferenceLoadError(ValueError):
    pass


def import_reference(reference: str, what: str = "reference") -> object:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ReferenceLoadError(f"{reference!r} is not a {what}: write it as package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ReferenceLoadError(
            f"module {module_name!r} does not import: {type(error).__name__}: {error}"
        ) from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ReferenceLoadError(f"module {module_name!r} has no attribute {attribute!r}") from None
