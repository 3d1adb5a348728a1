"""JSON encoding of what vendor libraries answer, and its checked decoding.

What JSON cannot say is tagged: ``$tuple``, ``$utf8`` (readable bytes), ``$bytes`` (base64),
``$map``, ``$float`` (``"nan"``), ``$record`` (a structure: ``type`` and ``fields``) and
``$handle`` (an opaque handle's token: the same handle, the same token). Decoding is untrusted:
every shape, type and depth is checked, and a problem is a ``ValueError`` naming where.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes
import enum
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_DEPTH = 32  # deepest nesting of a recorded value that decoding accepts

_SCALARS = (str, int, bool, type(None))


class Handle:
    """An opaque vendor handle replayed from a capture: only its ``token`` (``"nvml-0"``)."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token

    def __repr__(self) -> str:
        return f"<replayed handle {self.token}>"

    def __deepcopy__(self, memo: dict[int, Any]) -> Handle:
        return self  # a handle's identity is its meaning


class Record:
    """A replayed structure or object: its recorded fields as attributes, its type in ``_type``."""

    def __init__(self, type_name: str, fields: Mapping[str, Any]) -> None:
        self._type = type_name
        vars(self).update(fields)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "_type")
        return f"<replayed {self._type}: {fields}>"


HandleToken = Callable[[object], str]  # gives an opaque object its token (the recorder's table)


def encode(value: object, token: HandleToken, depth: int = 0) -> object:
    """Return the JSON form (see the module docstring) of a vendor answer or argument."""
    if depth > MAX_DEPTH:
        return {"$handle": token(value)}
    if isinstance(value, enum.Enum):
        return encode(value.value, token, depth + 1)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, (bytes, bytearray)):
        with contextlib.suppress(UnicodeDecodeError):
            text = bytes(value).decode("utf-8")
            if text.replace("\n", "").replace("\t", "").isprintable():
                return {"$utf8": text}
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Handle):
        return {"$handle": value.token}
    opaque = isinstance(value, (ctypes._Pointer, ctypes.c_void_p))
    if opaque or type(value).__name__.lower().endswith("handle"):
        return {"$handle": token(value)}
    if isinstance(value, ctypes._SimpleCData):
        return encode(value.value, token, depth + 1)
    if isinstance(value, (list, ctypes.Array)):
        return [encode(v, token, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, token, depth + 1) for v in value]}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {"$map": {str(k): encode(v, token, depth + 1) for k, v in value.items()}}
        return {"$handle": token(value)}
    kind, attrs = type(value).__name__, getattr(value, "__dict__", None)
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        attrs = {f[0]: getattr(value, f[0]) for f in getattr(type(value), "_fields_", ())}
    elif isinstance(value, Record):
        kind = value._type  # its fields are public names, "_type" is not
    if not isinstance(attrs, dict) or callable(value):
        return {"$handle": token(value)}
    fields = {
        k: encode(v, token, depth + 1)
        for k, v in attrs.items()
        if isinstance(k, str) and not k.startswith("_")
    }
    return {"$record": {"type": kind, "fields": fields}}


def call_key(
    name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], token: HandleToken
) -> list[object]:
    """Return the key of a call of the vendor function ``name``."""
    encoded = {k: encode(v, token) for k, v in sorted(kwargs.items())}
    return ["call", name, [encode(a, token) for a in args], encoded]


def key_text(parts: object) -> str:
    """Return the canonical text of an encoded key (sorted keys, no spaces)."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


_TAGGED = {"$tuple": list, "$map": dict, "$record": dict, "$handle": str, "$float": str}
_TAGGED.update({"$bytes": str, "$utf8": str})  # each tag and the JSON type its body must be


def decode(data: object, handle: Callable[[str], Handle], where: str, depth: int = 0) -> Any:
    """Return what untrusted ``data`` stands for; ``ValueError`` naming ``where`` if malformed."""
    if depth > MAX_DEPTH:
        raise _fail(where, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(data, _SCALARS):
        if isinstance(data, int) and not -(2**63) <= data < 2**64:  # no C type holds it
            raise _fail(where, "an integer wider than 64 bits")
        return data
    if isinstance(data, float):
        if not math.isfinite(data):
            raise _fail(where, "a non-finite number must be tagged $float")
        return data
    if isinstance(data, list):
        return [decode(v, handle, f"{where}[{i}]", depth + 1) for i, v in enumerate(data)]
    if not isinstance(data, dict) or len(data) != 1:
        raise _fail(where, "expected a value or a one-key tagged object")
    ((tag, body),) = data.items()
    kind = _TAGGED.get(tag)
    if kind is None or not isinstance(body, kind):
        raise _fail(where, f"{str(tag)[:40]!r} is no tag, or its body is not {kind}")
    if tag == "$tuple":
        return tuple(decode(v, handle, f"{where}[{i}]", depth + 1) for i, v in enumerate(body))
    if tag == "$map":
        return {k: decode(v, handle, f"{where}.{k}", depth + 1) for k, v in body.items()}
    if tag == "$record":
        return _record(body, handle, where, depth)
    if tag == "$handle":
        if not body or len(body) > 64:
            raise _fail(where, "$handle must be a token of 1-64 characters")
        return handle(body)
    if tag == "$float":
        if body not in ("nan", "inf", "-inf"):
            raise _fail(where, "$float must be 'nan', 'inf' or '-inf'")
        return float(body)
    try:
        return base64.b64decode(body, validate=True) if tag == "$bytes" else body.encode("utf-8")
    except (binascii.Error, UnicodeError):
        raise _fail(
            where, f"{tag} holds no valid {'base64' if tag == '$bytes' else 'UTF-8'}"
        ) from None


def _record(
    body: dict[str, Any], handle: Callable[[str], Handle], where: str, depth: int
) -> Record:
    type_name, fields = body.get("type"), body.get("fields")
    if set(body) != {"type", "fields"} or not isinstance(fields, dict):
        raise _fail(where, "$record must hold exactly 'type' and an object of 'fields'")
    if not isinstance(type_name, str) or not type_name.isidentifier() or len(type_name) > 64:
        raise _fail(where, "$record type must be an identifier of at most 64 characters")
    decoded: dict[str, Any] = {}
    for name, value in fields.items():
        if not name.isidentifier() or name.startswith("_") or len(name) > 64:
            raise _fail(where, f"$record field {name[:40]!r} is not a public identifier")
        decoded[name] = decode(value, handle, f"{where}.{name}", depth + 1)
    return Record(type_name, decoded)
