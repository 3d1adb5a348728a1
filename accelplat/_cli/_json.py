"""The JSON documents the command line prints, each carrying the schema version.

Every ``--json`` output of every sub-command (one document, or one per line for streams such as
``accelplat stats --watch --json``) is an object with the key ``"schema"``, the integer
:data:`SCHEMA_VERSION` (the first key, except in ``info``, whose keys are sorted). Scripts
compare it before reading other keys. Adding a key does not change the version; a key that
changes meaning or disappears does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from accelplat._describe import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "dumps", "versioned"]


def versioned(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``doc`` with ``"schema": SCHEMA_VERSION`` as its first key.

    Args:
        doc: The document's own keys (a ``"schema"`` key in it is replaced).

    Returns:
        A new dictionary; ``doc`` is not changed.
    """
    out: dict[str, Any] = {"schema": SCHEMA_VERSION}
    out.update((k, v) for k, v in doc.items() if k != "schema")
    return out


def dumps(doc: Mapping[str, Any], *, indent: int | None = None) -> str:
    """Serialise ``doc`` as the command line prints it: versioned, strict JSON.

    Args:
        doc: The document's own keys.
        indent: As for :func:`json.dumps`; ``None`` prints one line (streams need that).

    Returns:
        The JSON text, without a trailing newline.

    Raises:
        ValueError: For a float that is not finite (JSON has no NaN or infinity).
    """
    return json.dumps(versioned(doc), indent=indent, allow_nan=False)
