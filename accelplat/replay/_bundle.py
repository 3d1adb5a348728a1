"""The capture bundle: its format, a writer, and a loader for untrusted bundles.

A bundle is a ``.tar.gz`` holding ``host.json`` (the format marker and version, options,
summary, environment and the *records*: every question asked at the vendor boundary with its
answers, in order), and optionally ``info.json`` (the captured ``accelplat info --json``) and
``CONTENTS.txt`` (the same in words). Loading extracts nothing to disk, bounds every size and
count, accepts only those three regular files, and checks every field: any problem is a
:class:`~accelplat.errors.BundleError` naming the member and field.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accelplat import _files
from accelplat._validate import JsonFields
from accelplat.errors import (
    BundleError,
    BundleVersionError,
    FileTooLargeError,
    NotARegularFileError,
)
from accelplat.replay._codec import MAX_DEPTH, Handle, decode, key_text

FORMAT_NAME = "accelplat-capture"
"""The value of ``host.json``'s ``format`` field."""

FORMAT_VERSION = 1
"""The bundle format version this accelplat writes and the highest it reads."""

HOST_MEMBER = "host.json"
INFO_MEMBER = "info.json"
CONTENTS_MEMBER = "CONTENTS.txt"
_MEMBERS = (HOST_MEMBER, INFO_MEMBER, CONTENTS_MEMBER)

_CHANNEL_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Bounds the loader enforces; the defaults fit any real host with a wide margin.

    Attributes:
        compressed_bytes: Largest bundle file.
        uncompressed_bytes: Largest archive after decompression.
        members: Most archive members (including any a tar writer adds).
        member_bytes: Largest single member.
        records: Most records in ``host.json``.
        answers: Most answers per record.
        env_vars: Most recorded environment variables.
    """

    compressed_bytes: int = 32 * _MIB
    uncompressed_bytes: int = 96 * _MIB
    members: int = 8
    member_bytes: int = 64 * _MIB
    records: int = 200_000
    answers: int = 4096
    env_vars: int = 256


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Answer:
    """One recorded answer: a value, or the exception the call raised.

    Attributes:
        value: The decoded value (``None`` when the call raised).
        error: ``None``, or the raised exception's description: ``type`` (its class name),
            ``message``, and, where they apply, ``errno`` and ``value`` (a vendor error code).
    """

    value: Any = None
    error: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RecordEntry:
    """Every answer one question got, in the order they were given.

    Attributes:
        channel: The seam (``"file"``, ``"nvml"``, ``"levelzero"``, ``"amdsmi"``, ``"dist"``,
            ``"proc"``).
        key: The question, as recorded (JSON data).
        answers: The answers, oldest first.
    """

    channel: str
    key: Any
    answers: tuple[Answer, ...]

    @property
    def key_text(self) -> str:
        """The canonical text of :attr:`key`."""
        return key_text(self.key)


@dataclass(frozen=True)
class Bundle:
    """A loaded (and checked) capture.

    Attributes:
        source: Where it was loaded from.
        format_version: The format version it declares.
        created: When it was captured (ISO 8601, UTC), as recorded.
        accelplat_version: The accelplat that captured it.
        options: Capture options (``{"processes": bool}``).
        summary: What the capture found (platform, device count, versions), for people.
        env: The relevant environment variables on the captured host.
        records: Every recorded question and its answers.
        info: ``accelplat info --json`` as the captured host printed it, or ``None``.
        contents: ``CONTENTS.txt``, or ``""``.
    """

    source: str
    format_version: int
    created: str
    accelplat_version: str
    options: Mapping[str, Any]
    summary: Mapping[str, Any]
    env: Mapping[str, str]
    records: tuple[RecordEntry, ...]
    info: Mapping[str, Any] | None = None
    contents: str = ""


def bundle_bytes(host: Mapping[str, Any], info: Mapping[str, Any] | None, contents: str) -> bytes:
    """Return a reproducible bundle (no owners, ids, times or file names in the archive).

    Args:
        host: The ``host.json`` document.
        info: The ``info.json`` document, or ``None`` to leave it out.
        contents: The text of ``CONTENTS.txt``.

    Returns:
        The ``.tar.gz`` bytes.
    """
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
    """Read and check a bundle file (read into memory; nothing is extracted).

    Args:
        path: The ``.tar.gz`` file.
        limits: Size and count bounds.

    Returns:
        The checked :class:`Bundle`.

    Raises:
        BundleError: When the file is missing, not a regular file, too large, not a gzip'd tar,
            holds unexpected members, or any field is malformed.
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
    """Check and decode a bundle held in memory, as :func:`load_bundle` does.

    Args:
        data: The ``.tar.gz`` bytes.
        source: Name used in error messages.
        limits: Size and count bounds.
    """
    if len(data) > limits.compressed_bytes:
        raise BundleError(source, f"over the limit of {limits.compressed_bytes} bytes")
    members = _read_members(_gunzip(data, source, limits), source, limits)
    if HOST_MEMBER not in members:
        raise BundleError(source, f"the archive has no {HOST_MEMBER}")
    host = _parse_json(members[HOST_MEMBER], source, HOST_MEMBER)
    info = (
        _parse_json(members[INFO_MEMBER], source, INFO_MEMBER) if INFO_MEMBER in members else None
    )
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
        raise BundleError(
            source, f"decompresses to more than the limit of {limits.uncompressed_bytes} bytes"
        )
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


_MAX_TEXT = 4096
"""Characters a bundle's text field (a version, an error message, a file name) may hold."""


def fields_of(source: str) -> JsonFields:
    """Field checks of the bundle at ``source``: a failure is a ``BundleError`` naming the field."""
    return JsonFields(
        "",
        max_items=0,  # every array passes its own limit
        max_text=_MAX_TEXT,
        wording="must be",
        error_type=lambda where, words: BundleError(source, words, field=where),
    )


def _check_host(
    host: dict[str, Any],
    info: dict[str, Any] | None,
    contents: str,
    source: str,
    limits: Limits,
) -> Bundle:
    if host.get("format") != FORMAT_NAME:
        raise BundleError(
            source,
            f"not an accelplat capture (format must be {FORMAT_NAME!r})",
            field=f"{HOST_MEMBER}: format",
        )
    fields = fields_of(source)
    at = f"{HOST_MEMBER}: "
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
            raise BundleError(
                source, "must map variable names to text", field=f"{at}env.{name[:40]}"
            )
    raw_records = fields.array(host.get("records"), at + "records", limits.records)
    handles: dict[str, Handle] = {}

    def handle(token: str) -> Handle:  # one object per token: a replayed call's key uses it
        return handles.setdefault(token, Handle(token))

    records: list[RecordEntry] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(raw_records):
        where = f"{HOST_MEMBER}: records[{i}]"
        records.append(_check_record(raw, where, source, limits=limits, handle=handle, seen=seen))
    return Bundle(
        source=source,
        format_version=version,
        created=created,
        accelplat_version=accelplat_version,
        options=dict(options),
        summary=dict(summary),
        env=dict(env),
        records=tuple(records),
        info=info,
        contents=contents,
    )


def _check_key(key: object, where: str, depth: int = 0) -> None:
    if depth > 8:
        raise ValueError(f"{where}: nested deeper than 8 levels")
    if isinstance(key, float):
        raise ValueError(f"{where}: keys hold no floating-point numbers")
    if isinstance(key, (str, int, bool)) or key is None:
        return
    if isinstance(key, list):
        for i, item in enumerate(key):
            _check_key(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(key, dict):
        for name, item in key.items():
            _check_key(item, f"{where}.{name}", depth + 1)
        return
    raise ValueError(f"{where}: unexpected {type(key).__name__}")


def _check_record(
    raw: object,
    where: str,
    source: str,
    *,
    limits: Limits,
    handle: Any,
    seen: set[tuple[str, str]],
) -> RecordEntry:
    if not isinstance(raw, dict) or set(raw) != {"channel", "key", "answers"}:
        raise BundleError(source, "must hold exactly channel, key and answers", field=where)
    channel, key, answers = raw["channel"], raw["key"], raw["answers"]
    if not isinstance(channel, str) or not _CHANNEL_RE.match(channel):
        raise BundleError(source, "must be a short lower-case name", field=f"{where}.channel")
    if not isinstance(key, list) or not key:
        raise BundleError(source, "must be a non-empty list", field=f"{where}.key")
    try:
        _check_key(key, f"{where}.key")
    except ValueError as exc:
        raise BundleError(source, str(exc)) from None
    text = key_text(key)
    if (channel, text) in seen:
        raise BundleError(source, "repeats an earlier record's key", field=f"{where}.key")
    seen.add((channel, text))
    if not isinstance(answers, list) or not answers or len(answers) > limits.answers:
        raise BundleError(
            source, f"must be a list of 1 to {limits.answers} answers", field=f"{where}.answers"
        )
    checked = tuple(
        _check_answer(a, f"{where}.answers[{j}]", source, handle) for j, a in enumerate(answers)
    )
    return RecordEntry(channel, key, checked)


def _check_answer(raw: object, where: str, source: str, handle: Any) -> Answer:
    if not isinstance(raw, dict) or len(raw) != 1 or not ({"v", "raise"} >= set(raw)):
        raise BundleError(source, 'must be {"v": value} or {"raise": error}', field=where)
    if "v" in raw:
        try:
            return Answer(value=decode(raw["v"], handle, f"{where}.v"))
        except ValueError as exc:
            raise BundleError(source, str(exc)) from None
        except RecursionError:
            raise BundleError(
                source, f"nested deeper than {MAX_DEPTH} levels", field=where
            ) from None
    fields = fields_of(source)
    error = fields.mapping(raw["raise"], f"{where}.raise")
    type_name = error.get("type")
    if not isinstance(type_name, str) or not type_name.isidentifier() or len(type_name) > 64:
        raise BundleError(
            source, "must be an identifier of at most 64 characters", field=f"{where}.raise.type"
        )
    message = fields.text(error.get("message", ""), f"{where}.raise.message")
    checked: dict[str, Any] = {"type": type_name, "message": message}
    for name in ("errno", "value"):
        item = error.get(name)
        if item is not None:  # a C int or an unsigned 64-bit return value
            where_item = f"{where}.raise.{name}"
            checked[name] = fields.integer(item, where_item, minimum=-(2**63), maximum=2**64 - 1)
    filename = error.get("filename")
    if filename is not None:
        checked["filename"] = fields.text(filename, f"{where}.raise.filename")
    unknown = set(error) - {"type", "message", "errno", "value", "filename"}
    if unknown:
        raise BundleError(source, f"unknown fields {sorted(unknown)[:3]}", field=f"{where}.raise")
    return Answer(error=checked)
