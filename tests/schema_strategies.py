"""Hypothesis strategies from the JSON schemas of an OpenAPI document: bodies a schema accepts, the same
bodies one step away from it, and arbitrary JSON.

`accepted(schema, components)` covers the keywords the gateway's schemas use (type, properties, required,
additionalProperties, items, minItems, maxItems, minLength, maxLength, minimum, maximum, const, enum, anyOf,
oneOf, not, $ref); a keyword it does not know fails loudly rather than generating bodies the schema does not
accept.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import strategies as st

KNOWN = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "const",
    "enum",
    "anyOf",
    "oneOf",
    "not",
    "$ref",
    "title",
    "default",
    "description",
}

# Text a tokenizer must take whatever it holds: ASCII, other scripts, emoji, control characters.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def accepted(schema: dict[str, Any], components: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values `schema` accepts (with `$ref`s into `components`, an OpenAPI document's
    `components.schemas`)."""
    unknown = set(schema) - KNOWN
    assert not unknown, f"the strategies do not know {sorted(unknown)}"
    if "$ref" in schema:
        name = schema["$ref"].rpartition("/")[2]
        return st.deferred(lambda: accepted(components[name], components))
    strategy = _plain(schema, components)
    if "not" in schema:
        refused = jsonschema.Draft202012Validator(schema["not"])
        strategy = strategy.filter(lambda value: not refused.is_valid(value))
    return strategy


def _plain(schema: dict[str, Any], components: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    branches = schema.get("oneOf") or schema.get("anyOf")
    if branches and "properties" not in schema:
        return st.one_of([accepted(branch, components) for branch in branches])
    kind = schema.get("type")
    if kind == "string":
        low = schema.get("minLength", 0)
        return st.text(
            st.characters(exclude_categories=["Cs"]),
            min_size=low,
            max_size=min(schema.get("maxLength", 12), 12),
        )
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
    if kind == "number":
        low, high = schema.get("minimum"), schema.get("maximum")
        return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False) | st.integers(
            min_value=None if low is None else int(low), max_value=None if high is None else int(high)
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        low = schema.get("minItems", 0)
        items = accepted(schema["items"], components) if "items" in schema else JSON
        return st.lists(items, min_size=low, max_size=min(low + 2, schema.get("maxItems", low + 2)))
    if kind == "object":
        return _object(schema, components)
    return JSON


def _object(schema: dict[str, Any], components: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    if not properties:
        return st.dictionaries(TEXT, JSON, max_size=3)
    declared = st.fixed_dictionaries(
        {name: accepted(properties[name], components) for name in properties if name in required},
        optional={
            name: accepted(properties[name], components) for name in properties if name not in required
        },
    )
    # A field the schema does not declare, as clients send them (metadata, cache hints, ...).
    extra = st.dictionaries(st.sampled_from(["metadata", "x_client", "cache_control"]), JSON, max_size=1)
    strategy = st.builds(lambda fields, more: {**more, **fields}, declared, extra)
    if "anyOf" in schema:  # constraints on the object as a whole (content, or a tool call)
        whole = jsonschema.Draft202012Validator({"anyOf": schema["anyOf"]})
        strategy = strategy.filter(whole.is_valid)
    return strategy


def paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value (keys and indices from the top), the top itself included."""
    found = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*here, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*here, index))
    return found


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """`value` with what is at `path` replaced by `new` (or removed, when `new` is `REMOVE`)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        if not rest and new is REMOVE:
            del copy[head]
        else:
            copy[head] = replaced(value[head], rest, new)
        return copy
    copy_list = list(value)
    if not rest and new is REMOVE:
        del copy_list[head]
    else:
        copy_list[head] = replaced(value[head], rest, new)
    return copy_list


REMOVE = object()

# What a value is replaced by, one step away from an accepted body.
MUTATIONS = st.one_of(
    st.just(REMOVE),
    st.sampled_from(
        [None, True, -1, 0, -3, 3, 10**12, -5, 2.5, "", "hot", [], {}, [None], {"type": "bogus"}]
    ),
    JSON,
)
