"""A JSON Schema check for the subset of draft 2020-12 that ``accelplat/schemas`` uses.

The subset: ``type`` (one or a list), ``properties``, ``required``, ``additionalProperties``
(a schema), ``items``, ``enum``, ``const``, ``minimum``, ``maximum``, ``exclusiveMinimum``,
``anyOf`` and ``$ref`` to ``#/$defs/NAME``; ``title``, ``description`` and ``$schema`` are
annotations. :func:`keywords` lists what a schema uses, so a test can refuse one that reaches
outside the subset (a keyword this check would silently skip).

``closed=True`` also refuses an object key that its schema does not declare: the documents must
say every key they print, though the published schemas leave objects open (a new key does not
bump the schema version).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

SUPPORTED = frozenset(
    {
        "$schema",
        "$defs",
        "$ref",
        "title",
        "description",
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "anyOf",
    }
)
_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def keywords(schema: Any) -> Iterator[str]:
    """Yield every keyword used anywhere in ``schema`` (property names are not keywords)."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        yield key
        if key in ("properties", "$defs"):
            for sub in value.values():
                yield from keywords(sub)
        elif key == "anyOf":
            for sub in value:
                yield from keywords(sub)
        elif key in ("items", "additionalProperties"):
            yield from keywords(value)


def errors(doc: Any, schema: Mapping[str, Any], *, closed: bool = False) -> list[str]:
    """Return every way ``doc`` breaks ``schema``, each as ``"path: why"``; empty when valid."""
    out: list[str] = []
    _check(doc, schema, schema, "$", closed=closed, out=out)
    return out


def _check(
    value: Any,
    schema: Mapping[str, Any],
    root: Mapping[str, Any],
    at: str,
    *,
    closed: bool,
    out: list[str],
) -> None:
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), f"only local $defs references are supported: {ref}"
        _check(value, root["$defs"][ref.removeprefix("#/$defs/")], root, at, closed=closed, out=out)
    if "anyOf" in schema:
        failures = []
        for option in schema["anyOf"]:
            found: list[str] = []
            _check(value, option, root, at, closed=closed, out=found)
            if not found:
                break
            failures.append("; ".join(found))
        else:
            out.append(f"{at}: matches none of anyOf ({' | '.join(failures)})")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            out.append(f"{at}: {value!r} is not of type {' or '.join(types)}")
            return
    if "const" in schema and (value != schema["const"] or type(value) is not type(schema["const"])):
        out.append(f"{at}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{at}: {value!r} is not one of {schema['enum']}")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{at}: {value} is below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{at}: {value} is above {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(f"{at}: {value} is not above {schema['exclusiveMinimum']}")
    if isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            _check(item, schema["items"], root, f"{at}[{n}]", closed=closed, out=out)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out.extend(
            f"{at}: {key!r} is missing" for key in schema.get("required", ()) if key not in value
        )
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, f"{at}.{key}", closed=closed, out=out)
            elif isinstance(extra, dict):
                _check(item, extra, root, f"{at}.{key}", closed=closed, out=out)
            elif closed and "properties" in schema:
                out.append(f"{at}: {key!r} is not declared in the schema")
