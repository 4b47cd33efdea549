"""Settings as `key=value` overrides, written so that `rollout.config.load` reads them back as they were: how
one process tells another what it was given (a service the stack starts, a run's launch record).

Contract:
- `overrides_for(settings, *paths)`: the settings at dotted `paths` (a section, or one setting), one override
  per setting; a string Hydra would read as something else (a path, a URL with `?` or `,`, `null`, a number)
  is quoted (`hydra_quote`).
- `setting_given(overrides, key)`: the value the last override of `key` gives, unquoted; None when none does.
- No Hydra here (workflow code carries records holding overrides): this module only writes and reads text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, cast


def hydra_quote(value: str) -> str:
    """`value` as a quoted override value, so a URL's `?`, `=`, `,` or `#` reach the setting as they are."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


_PLAIN = re.compile(r"[A-Za-z_][\w./:@+-]*")  # a value Hydra reads back as the same string, unquoted
_WORDS = {"null", "none", "true", "false", "nan", "inf"}  # which Hydra would read as something else


def _written(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        items = cast(list[object] | tuple[object, ...], value)
        return "[" + ",".join(_written(item) for item in items) + "]"
    text = str(value)
    return text if _PLAIN.fullmatch(text) and text.lower() not in _WORDS else hydra_quote(text)


def setting_given(overrides: Sequence[str], key: str) -> str | None:
    """The value `overrides` give setting `key` (the last one given, unquoted), or None."""
    given = [argument.partition("=")[2] for argument in overrides if argument.startswith(f"{key}=")]
    if not given:
        return None
    value = given[-1]
    if len(value) >= 2 and value[0] == value[-1] == "'":
        value = value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    return value


def setting_at(settings: object, path: str) -> Any:
    """The setting or section at dotted `path` (`services.gateway.port`)."""
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def overrides_for(settings: object, *paths: str) -> list[str]:
    """The settings at `paths` (dotted: a section, or one setting) as `key=value` overrides, one per setting,
    which `rollout.config.load` reads back as they are (strings Hydra would misread are quoted)."""
    out: list[str] = []

    def write(path: str, value: object) -> None:
        if is_dataclass(value) and not isinstance(value, type):
            for spec in fields(value):
                write(f"{path}.{spec.name}", getattr(value, spec.name))
        elif isinstance(value, dict):  # a mapping of sections by name (`policies.NAME.*`)
            for name, item in cast(dict[str, object], value).items():
                write(f"{path}.{name}", item)
        else:
            out.append(f"{path}={_written(value)}")

    for path in paths:
        write(path, setting_at(settings, path))
    return out
