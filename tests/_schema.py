"""Check documents against ``accelplat/schemas`` with ``jsonschema`` (draft 2020-12).

The tool ``docs/json.md`` tells users to run. ``closed=True`` also refuses an object key that
its schema does not declare: the documents must say every key they print, though the published
schemas leave objects open (a new key does not bump the schema version).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError


def _closed(schema: Any) -> Any:
    """Return ``schema`` with every object that lists its properties taking no other key."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const") else _closed(v)) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _text(error: ValidationError) -> str:
    where = "$" + "".join(f"[{p!r}]" for p in error.absolute_path)
    why = "; ".join(_text(e) for e in sorted(error.context or (), key=str))
    return f"{where}: {error.message}" + (f" ({why})" if why else "")


def errors(doc: Any, schema: Mapping[str, Any], *, closed: bool = False) -> list[str]:
    """Return every way ``doc`` breaks ``schema``, each as ``"path: why"``; empty when valid."""
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(_closed(schema) if closed else schema)
    return sorted(_text(e) for e in validator.iter_errors(doc))
