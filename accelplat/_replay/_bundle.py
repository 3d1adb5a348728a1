"""The capture bundle: its format, a writer, and a loader for untrusted bundles.

A ``.tar.gz`` of ``host.json`` (format, options, summary, environment and the *records*: every
question asked at the vendor boundary with its answers, in order), optionally ``info.json`` and
``CONTENTS.txt``. Loading extracts nothing, bounds every size and count, and checks every field
(and the shape of answers the backends turn into numbers): a problem is a ``BundleError``.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from accelplat import _files
from accelplat._replay._codec import MAX_DEPTH, Handle, Record, decode, key_text
from accelplat._validate import JsonFields
from accelplat.errors import (
    BundleError,
    BundleVersionError,
    FileTooLargeError,
    NotARegularFileError,
)

FORMAT_NAME = "accelplat-capture"
FORMAT_VERSION = 1  # the version this accelplat writes and the highest it reads

HOST_MEMBER = "host.json"
INFO_MEMBER = "info.json"
CONTENTS_MEMBER = "CONTENTS.txt"
_MEMBERS = (HOST_MEMBER, INFO_MEMBER, CONTENTS_MEMBER)

_CHANNEL_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MIB = 1024 * 1024
_MAX_TEXT = 4096  # characters of a text field (a version, an error message, a file name)
_Handles = Callable[[str], Handle]  # one Handle object per token
_Seen = set[tuple[str, str]]  # (channel, key text) of the records so far


@dataclass(frozen=True)
class Limits:
    """Bounds the loader enforces; the defaults fit any real host with a wide margin."""

    compressed_bytes: int = 32 * _MIB
    uncompressed_bytes: int = 96 * _MIB
    members: int = 8  # any member a tar writer adds counts
    member_bytes: int = 64 * _MIB
    records: int = 200_000
    answers: int = 4096  # per record
    env_vars: int = 256


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Answer:
    """One recorded answer: a ``value``, or the ``error`` the call raised."""

    value: Any = None
    error: Mapping[str, Any] | None = None  # type, message; errno, filename, value where apply


@dataclass(frozen=True)
class RecordEntry:
    """Every answer (oldest first) one question (``key``, JSON data) of a ``channel`` got."""

    channel: str
    key: Any
    answers: tuple[Answer, ...]


@dataclass(frozen=True)
class Bundle:
    """A loaded (and checked) capture."""

    source: str
    format_version: int
    created: str  # as recorded: ISO 8601, UTC
    accelplat_version: str
    options: Mapping[str, Any]  # {"processes": bool, ...}
    summary: Mapping[str, Any]  # what the capture found, for people
    env: Mapping[str, str]  # the considered variables that were set on the captured host
    records: tuple[RecordEntry, ...]
    info: Mapping[str, Any] | None = None  # the captured ``accelplat info --json``
    contents: str = ""  # CONTENTS.txt ("" without one)
    variables: tuple[str, ...] | None = None  # the names the capture considered (None: unsaid)


def bundle_bytes(host: Mapping[str, Any], info: Mapping[str, Any] | None, contents: str) -> bytes:
    """Return a reproducible ``.tar.gz`` (no owners, ids, times or names); ``info=None``: none."""
    members = [(HOST_MEMBER, _json_bytes(host))]
    if info is not None:
        members.append((INFO_MEMBER, _json_bytes(info)))
    members.append((CONTENTS_MEMBER, contents.encode("utf-8")))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            item = tarfile.TarInfo(name)
            item.size, item.mode, item.mtime = len(data), 0o644, 0
            tar.addfile(item, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _json_bytes(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def load_bundle(path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS) -> Bundle:
    """Read and check the bundle file at ``path`` (read into memory; nothing is extracted).

    Raises:
        BundleError: Missing, not a regular file, too large, not a gzip'd tar, other members.
        BundleVersionError: For a bundle of a newer format version.
    """
    source = os.fspath(path)
    try:
        data = _files.read_live(source, limit=limits.compressed_bytes)
    except FileTooLargeError:
        raise BundleError(source, f"over the limit of {limits.compressed_bytes} bytes") from None
    except NotARegularFileError:
        raise BundleError(source, "not a regular file") from None
    except OSError as exc:
        raise BundleError(source, f"cannot open: {exc.strerror or exc}") from None
    return parse_bundle(data, source=source, limits=limits)


def parse_bundle(
    data: bytes, *, source: str = "<bytes>", limits: Limits = DEFAULT_LIMITS
) -> Bundle:
    """Check and decode the bundle bytes ``data`` as :func:`load_bundle` does.

    Raises:
        BundleError: As :func:`load_bundle`; ``source`` names the bundle in the message.
    """
    if len(data) > limits.compressed_bytes:
        raise BundleError(source, f"over the limit of {limits.compressed_bytes} bytes")
    members = _read_members(_gunzip(data, source, limits), source, limits)
    if HOST_MEMBER not in members:
        raise BundleError(source, f"the archive has no {HOST_MEMBER}")
    host = _parse_json(members[HOST_MEMBER], source, HOST_MEMBER)
    raw_info = members.get(INFO_MEMBER)
    info = None if raw_info is None else _parse_json(raw_info, source, INFO_MEMBER)
    contents = members.get(CONTENTS_MEMBER, b"").decode("utf-8", "replace")
    return _check_host(host, info, contents, source, limits)


def _gunzip(data: bytes, source: str, limits: Limits) -> bytes:
    if data[:2] != b"\x1f\x8b":
        raise BundleError(source, "not a gzip file (a bundle is a .tar.gz)")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limits.uncompressed_bytes + 1)  # a bomb stops here
    except zlib.error as exc:
        raise BundleError(source, f"corrupt gzip data: {exc}") from None
    if len(out) > limits.uncompressed_bytes or inflater.unconsumed_tail:
        why = f"decompresses to more than the limit of {limits.uncompressed_bytes} bytes"
        raise BundleError(source, why)
    if not inflater.eof:
        raise BundleError(source, "truncated gzip data")
    return out


def _read_members(archive: bytes, source: str, limits: Limits) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    try:
        tar = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")  # noqa: SIM115 - closed below
    except (tarfile.TarError, EOFError, ValueError) as exc:
        raise BundleError(source, f"not a tar archive: {exc}") from None
    with tar:
        while True:
            try:
                member = tar.next()
            except (tarfile.TarError, EOFError, ValueError, UnicodeError) as exc:
                raise BundleError(source, f"corrupt tar archive: {exc}") from None
            if member is None:
                return members
            if len(members) >= limits.members:
                raise BundleError(source, f"more than {limits.members} archive members")
            name, where = member.name, f"member {member.name[:80]!r}"
            if not member.isreg():
                why = "only regular files are allowed (no links, directories or devices)"
                raise BundleError(source, why, field=where)
            if name not in _MEMBERS:
                why = f"unexpected member; a bundle holds only {', '.join(_MEMBERS)} at its top"
                raise BundleError(source, why, field=where)
            if name in members:
                raise BundleError(source, "appears twice", field=where)
            if member.size > limits.member_bytes:
                why = f"{member.size} bytes is over the limit of {limits.member_bytes}"
                raise BundleError(source, why, field=where)
            try:
                fh = tar.extractfile(member)
                data = fh.read(member.size + 1) if fh is not None else b""
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                raise BundleError(source, f"unreadable: {exc}", field=where) from None
            if len(data) != member.size:
                raise BundleError(source, "truncated", field=where)
            members[name] = data


def _parse_json(data: bytes, source: str, member: str) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BundleError(source, "not UTF-8 text", field=member) from None
    except RecursionError:
        raise BundleError(source, "nested too deeply", field=member) from None
    except ValueError as exc:
        raise BundleError(source, f"not valid JSON: {exc}", field=member) from None
    if not isinstance(doc, dict):
        raise BundleError(source, "must hold a JSON object", field=member)
    return doc


def fields_of(source: str) -> JsonFields:
    """Field checks whose failure is a ``BundleError`` of ``source`` naming the field."""
    return JsonFields(
        "",
        max_items=0,  # every array passes its own limit
        max_text=_MAX_TEXT,
        wording="must be",
        error_type=lambda where, words: BundleError(source, words, field=where),
    )


def _check_host(
    host: dict[str, Any], info: dict[str, Any] | None, contents: str, source: str, limits: Limits
) -> Bundle:
    at = f"{HOST_MEMBER}: "
    if host.get("format") != FORMAT_NAME:
        why = f"not an accelplat capture (format must be {FORMAT_NAME!r})"
        raise BundleError(source, why, field=at + "format")
    fields = fields_of(source)
    version = fields.integer(
        host.get("format_version"), at + "format_version", minimum=1, maximum=2**31 - 1
    )
    if version > FORMAT_VERSION:
        raise BundleVersionError(source, version, FORMAT_VERSION)
    created = fields.text(host.get("created"), at + "created")
    accelplat_version = fields.text(host.get("accelplat_version"), at + "accelplat_version")
    options = fields.mapping(host.get("options"), at + "options")
    fields.boolean(options.get("processes"), at + "options.processes")
    summary = fields.mapping(host.get("summary"), at + "summary")
    env = fields.mapping(host.get("env"), at + "env")
    if len(env) > limits.env_vars:
        raise BundleError(source, f"more than {limits.env_vars} variables", field=f"{at}env")
    for name, value in env.items():
        text = isinstance(value, str) and len(value) <= 65536 and "\0" not in value
        if not (_ENV_NAME_RE.match(name) and text):
            why = "must map variable names to text"
            raise BundleError(source, why, field=f"{at}env.{name[:40]}")
    variables = host.get("variables")  # absent before accelplat 0.2: unsaid
    if variables is not None:
        variables = tuple(fields.array(variables, at + "variables", limits.env_vars))
        if not all(isinstance(n, str) and _ENV_NAME_RE.match(n) for n in variables):
            raise BundleError(source, "must list variable names", field=f"{at}variables")
    raw_records = fields.array(host.get("records"), at + "records", limits.records)
    handle = functools.cache(Handle)  # one object per token: a replayed call's key uses it
    seen: set[tuple[str, str]] = set()
    records = tuple(
        _check_record(raw, f"{at}records[{i}]", source, limits=limits, handle=handle, seen=seen)
        for i, raw in enumerate(raw_records)
    )
    return Bundle(
        source=source,
        format_version=version,
        created=created,
        accelplat_version=accelplat_version,
        options=dict(options),
        summary=dict(summary),
        env=dict(env),
        records=records,
        info=info,
        contents=contents,
        variables=variables,
    )


# The replay's tables: answer shapes, what a replayed vendor raises, CONTENTS.txt's sentences
TABLES = json.loads(resources.files(__package__).joinpath("_bundle.json").read_text("utf-8"))
# Per channel and call, the shape of an answer a backend turns into numbers: "u32"/"u64" an
# integer from 0 to its maximum, "text" text or bytes, [shape] a list of it, an object a
# structure's fields ("x?": optional).
_SHAPES: dict[str, dict[str, object]] = TABLES["shapes"]
_MAXIMA = {"u32": 2**32 - 1, "u64": 2**64 - 1}


def _check_shape(value: object, shape: object, where: str, source: str) -> None:
    if isinstance(shape, str) and shape in _MAXIMA:
        top = _MAXIMA[shape]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            why = f"must be an integer from 0 to {top}, not {value!r:.40}"
            raise BundleError(source, why, field=where)
    elif shape == "text":
        if not isinstance(value, (str, bytes)):
            raise BundleError(source, f"must be text, not {value!r:.40}", field=where)
    elif isinstance(shape, list):
        if not isinstance(value, (list, tuple)):
            raise BundleError(source, f"must be a list, not {value!r:.40}", field=where)
        for i, item in enumerate(value):
            _check_shape(item, shape[0], f"{where}[{i}]", source)
    else:
        assert isinstance(shape, dict)
        if not isinstance(value, Record):
            raise BundleError(source, f"must be a structure, not {value!r:.40}", field=where)
        for spelled, field_shape in shape.items():
            name = spelled.rstrip("?")
            if not (spelled.endswith("?") and not hasattr(value, name)):
                _check_shape(getattr(value, name, None), field_shape, f"{where}.{name}", source)


def _check_key(key: object, where: str, source: str, depth: int = 0) -> None:
    if depth > 8:
        raise BundleError(source, f"{where}: nested deeper than 8 levels")
    if isinstance(key, float):
        raise BundleError(source, f"{where}: keys hold no floating-point numbers")
    if isinstance(key, list):
        for i, item in enumerate(key):
            _check_key(item, f"{where}[{i}]", source, depth + 1)
    elif isinstance(key, dict):  # the rest is JSON's: text, integers, booleans, null
        for name, item in key.items():
            _check_key(item, f"{where}.{name}", source, depth + 1)


def _check_record(
    raw: object, where: str, source: str, *, limits: Limits, handle: _Handles, seen: _Seen
) -> RecordEntry:
    if not isinstance(raw, dict) or set(raw) != {"channel", "key", "answers"}:
        raise BundleError(source, "must hold exactly channel, key and answers", field=where)
    channel, key, answers = raw["channel"], raw["key"], raw["answers"]
    if not isinstance(channel, str) or not _CHANNEL_RE.match(channel):
        raise BundleError(source, "must be a short lower-case name", field=f"{where}.channel")
    if not isinstance(key, list) or not key:
        raise BundleError(source, "must be a non-empty list", field=f"{where}.key")
    _check_key(key, f"{where}.key", source)
    text = key_text(key)
    if (channel, text) in seen:
        raise BundleError(source, "repeats an earlier record's key", field=f"{where}.key")
    seen.add((channel, text))
    if not isinstance(answers, list) or not answers or len(answers) > limits.answers:
        why = f"must be a list of 1 to {limits.answers} answers"
        raise BundleError(source, why, field=f"{where}.answers")
    call = key[1] if len(key) > 1 and isinstance(key[1], str) else None
    shape = _SHAPES.get(channel, {}).get(call) if call else None
    checked = []
    for j, raw_answer in enumerate(answers):
        answer = _check_answer(raw_answer, f"{where}.answers[{j}]", source, handle)
        if shape is not None and answer.error is None:
            _check_shape(answer.value, shape, f"{where}.answers[{j}].v", source)
        checked.append(answer)
    return RecordEntry(channel, key, tuple(checked))


def _check_answer(raw: object, where: str, source: str, handle: _Handles) -> Answer:
    if not isinstance(raw, dict) or len(raw) != 1 or not ({"v", "raise"} >= set(raw)):
        raise BundleError(source, 'must be {"v": value} or {"raise": error}', field=where)
    if "v" in raw:
        try:
            return Answer(value=decode(raw["v"], handle, f"{where}.v"))
        except ValueError as exc:
            raise BundleError(source, str(exc)) from None
        except RecursionError:
            why = f"nested deeper than {MAX_DEPTH} levels"
            raise BundleError(source, why, field=where) from None
    fields = fields_of(source)
    error = fields.mapping(
        raw["raise"], f"{where}.raise", allowed={"type", "message", "errno", "value", "filename"}
    )
    type_name = error.get("type")
    if not isinstance(type_name, str) or not type_name.isidentifier() or len(type_name) > 64:
        why = "must be an identifier of at most 64 characters"
        raise BundleError(source, why, field=f"{where}.raise.type")
    checked: dict[str, Any] = {
        "type": type_name,
        "message": fields.text(error.get("message", ""), f"{where}.raise.message"),
    }
    for name in ("errno", "value"):  # a C int or an unsigned 64-bit return value
        if error.get(name) is not None:
            checked[name] = fields.integer(
                error[name], f"{where}.raise.{name}", minimum=-(2**63), maximum=2**64 - 1
            )
    if error.get("filename") is not None:
        checked["filename"] = fields.text(error["filename"], f"{where}.raise.filename")
    return Answer(error=checked)
