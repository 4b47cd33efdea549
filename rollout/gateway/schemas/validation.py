"""The building blocks of the request schemas, and `check`, which turns pydantic's first error into a
`BadRequest` that names the field as the client wrote it.

Contract:
- `Body` is every request object's base: the types of the fields it declares are checked strictly (no string
  for a number, no boolean for an integer), any other field is allowed.
- A union built with `one_of` (objects picked by a key such as `type` or `role`) or `text_or_list` (a string
  or an array) fails with one error at the value, not one per member; its members' names never appear in a
  field name. A value of `one_of` that is not an object is refused as "must be an object"; an unknown key
  names the key (`messages[0].role`).
- `TokenBudget` is a token count of at least 1 and, when `check` is given `max_context`, at most that: a
  budget beyond the model's whole context is refused, not clamped. Its JSON schema is marked `x-token-budget`,
  where the OpenAPI document writes that maximum.
- `StopString` is a stop string: non-empty, at most `MAX_STOP_CHARS` (256) characters.
- `check(model, body, max_context=...)` raises `BadRequest(message, field)` for the first violation: the field
  in the client's naming (`messages[2].content`, `body` for the document itself) and a message that quotes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, LiteralString

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from rollout.gateway.requests import BadRequest
from rollout.gateway.stops import MAX_STOP_CHARS

MARK = (
    "~"  # starts the name of a union member: such names appear in pydantic's error locations, never in ours
)
OTHER = "other"  # the member `one_of` picks for a key value it does not list, when a union has one
TOKEN_BUDGET = "x-token-budget"


class Body(BaseModel):
    """A request object: strict about the fields it declares, open to every other one."""

    model_config = ConfigDict(extra="allow", strict=True)


def member(name: str) -> Tag:
    """The name of a union member of `one_of` or `text_or_list` (use as `Annotated[Model,
    member("text")]`)."""
    return Tag(MARK + name)


def one_of(
    key: str, members: Mapping[str, str], *, default: str | None = None, other: bool = False
) -> Discriminator:
    """Pick an object's member by `value[key]` (`default` when absent): `members` maps a value to its member's
    name; with `other`, any other string value picks the member named `OTHER`."""

    def choose(value: Any) -> str | None:
        if not isinstance(value, dict):
            return None
        picked = value.get(key, default)
        if not isinstance(picked, str):
            return None
        if picked in members:
            return MARK + members[picked]
        return MARK + OTHER if other else None

    return Discriminator(
        choose,
        custom_error_type="one_of",
        custom_error_message="must be a string" if other else f"must be one of {', '.join(members)}",
        custom_error_context={"key": key},
    )


def text_or_list(items: str) -> Discriminator:
    """A string (member `text`) or an array (member `list`) of `items`."""

    def choose(value: Any) -> str | None:
        return MARK + "text" if isinstance(value, str) else MARK + "list" if isinstance(value, list) else None

    return Discriminator(
        choose,
        custom_error_type="text_or_list",
        custom_error_message=f"must be a string or an array of {items}",
    )


def _within_context(value: int, info: ValidationInfo) -> int:
    limit = (info.context or {}).get("max_context")
    if limit is not None and value > limit:
        raise PydanticCustomError(
            "context", "must be at most {max_context}, the model's context length", {"max_context": limit}
        )
    return value


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
"""A stop string: each is matched against every reply (rollout.gateway.stops), so its length is bounded."""

TokenBudget = Annotated[
    int, Field(ge=1, json_schema_extra={TOKEN_BUDGET: True}), AfterValidator(_within_context)
]


def rule(message: LiteralString, field: str) -> PydanticCustomError:
    """An error a model's own validator raises about one of its fields (`field`), with `message` about it."""
    return PydanticCustomError("rule", message, {"field": field})


_TYPES = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "missing": "is required",
}


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _phrase(error: ErrorDetails) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _TYPES:
        return _TYPES[kind]
    if kind == "one_of" and not isinstance(error["input"], dict):
        return "must be an object"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx['ge'])}"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx['le'])}"
    if kind == "too_short":
        n = ctx["min_length"]
        return "must be a non-empty array" if n == 1 else f"must hold at least {n} items"
    if kind == "too_long":
        return f"must hold at most {ctx['max_length']} items"
    if kind == "string_too_short":
        return "must be a non-empty string"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters"
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    return error["msg"][:1].lower() + error["msg"][1:]


def field_name(error: ErrorDetails) -> str:
    """The field an error is about, in the client's naming: `messages[2].content`; `body` for the whole
    body."""
    parts: list[str] = []
    for part in error["loc"]:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif not part.startswith(MARK):
            parts.append(f".{part}" if parts else part)
    ctx = error.get("ctx") or {}
    if error["type"] == "one_of" and isinstance(error["input"], dict):
        parts.append(f".{ctx['key']}" if parts else ctx["key"])
    elif error["type"] == "rule":
        parts.append(f".{ctx['field']}" if parts else ctx["field"])
    return "".join(parts) or "body"


def check(model: type[BaseModel], body: Any, *, max_context: int | None = None) -> None:
    """Validate `body` against `model`; the first violation is a `BadRequest` naming its field."""
    try:
        model.model_validate(body, context={"max_context": max_context})
    except ValidationError as invalid:
        error = invalid.errors(include_url=False)[0]
        field = field_name(error)
        raise BadRequest(f"'{field}' {_phrase(error)}", field=field) from None
