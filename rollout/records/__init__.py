"""Typed records as ledger payloads, by one codec: no record writes its own `to_payload` or `from_payload`.

Contract:
- A record is a dataclass that subclasses `Payload`. `record.to_payload()` is its fields as JSON values
  (tuples as lists, enums as their values, nested dataclasses as objects), plus its `markers()` (fixed keys
  readers use, such as `"trainable": false`), less the fields named in `OMITTED_AT_DEFAULT` while they hold
  their default (fields added later: a record that does not use one keeps the shape it had before it existed).
- `Record.from_payload(payload)` checks the payload against the record's field types (pydantic's validation of
  the dataclass: a payload read from the ledger is checked before it is used) and ignores keys it does not
  know; a field missing from the payload, or null where its default is not, takes its default (a field added
  later has one, and earlier writers may have written null for it), and a payload
  missing a field without one, or holding a value of the wrong type, raises `ValueError` naming the field.
- `from_payload(record.to_payload()) == record` for every record.
- pydantic is imported on first use, not with this module: workflow code imports records (their types cross
  the Temporal boundary) and never encodes them.

The records of the ledger's event kinds live in this package's modules, below every module that reads them
(`runs`, `seats`, `batches`, `checkpoints`, `serving`, `evals`, `sandboxes`, `presets`; a turn's and an
episode's in rollout.ledger.payloads), and rollout.ledger.records is the one table from kind to record. A
module here imports only the codec and the core's pure checks: readers in the ledger itself parse with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = ["Payload"]


@cache
def _defaulted(cls: type) -> frozenset[str]:
    """The fields whose default is not None: a null recorded for one reads as its default."""
    return frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING
        or (f.default is not dataclasses.MISSING and f.default is not None)
    )


@cache
def _omitted_defaults(cls: type[Payload]) -> dict[str, Any]:
    """The defaults of `cls.OMITTED_AT_DEFAULT`, by field name (made once per class)."""
    defaults: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):  # pyright: ignore[reportArgumentType]
        if spec.name in cls.OMITTED_AT_DEFAULT:
            factory = spec.default_factory
            defaults[spec.name] = spec.default if factory is dataclasses.MISSING else factory()
    return defaults


@cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


class Payload:
    """A record recorded as a ledger payload (see the module's contract)."""

    # Fields left out of the payload while they hold their default.
    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()

    def markers(self) -> dict[str, Any]:
        """Keys written beside the fields, which readers tell records apart by (none by default)."""
        return {}

    def to_payload(self) -> dict[str, Any]:
        encoded: dict[str, Any] = _adapter(type(self)).dump_python(self, mode="json")
        for name, default in _omitted_defaults(type(self)).items():
            if getattr(self, name) == default:
                encoded.pop(name, None)
        return encoded | self.markers()

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Self:
        from pydantic import ValidationError

        given = {k: v for k, v in payload.items() if v is not None or k not in _defaulted(cls)}
        try:
            return _adapter(cls).validate_python(given)
        except ValidationError as error:
            raise ValueError(f"not a {cls.__name__} payload: {error}") from None
