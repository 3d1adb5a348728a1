"""``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, as the CUDA driver reads them.

:func:`parse_cuda_visible_devices` reads the variable, :func:`resolve_cuda_visible_devices`
matches it against the GPUs; both never raise. The rules (``docs/backends/cuda.md``) were checked
against ``cuInit`` on driver 580 (``tools/record_cuda_visible.py``). Values are ``NamedTuple``s:
this module is on the detection path, where a frozen dataclass costs about a millisecond at import.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from accelplat._util import shown

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
_GPU_PREFIX = "GPU-"
_MIG_PREFIX = "MIG-"
_WHITESPACE = " \t\n\r\v\f"
_MIG_LEGACY_RE = re.compile(r"MIG-GPU-([^/]*)/([0-9]+)/([0-9]+)\Z")
_UUID_DIGITS_RE = re.compile(r"(?:-*[0-9a-fA-F]){32}|[-0-9a-fA-F]*\Z")


class EntryKind(str, enum.Enum):  # what one entry of CUDA_VISIBLE_DEVICES names
    ORDINAL = "ordinal"  # an index into CUDA's enumeration of the machine's GPUs
    GPU_UUID = "gpu-uuid"  # GPU-…, possibly abbreviated
    MIG_UUID = "mig-uuid"  # MIG-…, possibly abbreviated (drivers R470 and later)
    MIG_LEGACY = "mig-legacy"  # MIG-GPU-<uuid>/<gpu instance id>/<compute instance id>


class VisibleEntry(NamedTuple):  # one valid entry, as written (text) and as read
    kind: EntryKind
    text: str
    ordinal: int | None = None
    uuid_prefix: str | None = None  # GPU-/MIG- and <= 32 lower-case hex digits (MIG_LEGACY: GPU's)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class CudaVisibleSpec(NamedTuple):  # the variable (raw; None: unset): entries before stopped_at
    raw: str | None
    entries: tuple[VisibleEntry, ...]
    stopped_at: str | None = None


class MigRecord(NamedTuple):  # one MIG device of a GPU (instance ids for the legacy form)
    uuid: str
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    name: str = ""  # the backend's facts from here on: the rules never read them
    handle: Any = None


class GpuRecord(NamedTuple):  # one physical GPU, its MIG devices in MIG index order
    nvml_index: int
    uuid: str
    mig_enabled: bool = False
    mig_devices: tuple[MigRecord, ...] = ()
    name: str = ""  # the backend's facts from here on: the rules never read them
    handle: Any = None
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None


class VisibleTarget(NamedTuple):  # one visible device: its GPU's NVML index, its own UUID
    nvml_index: int
    uuid: str
    mig: bool = False


class Resolution(NamedTuple):  # the visible devices (position i is visible index i), and notes
    targets: tuple[VisibleTarget, ...]
    notes: tuple[str, ...] = ()
    named: tuple[VisibleTarget, ...] = ()  # what the variable names, before CUDA's one-MIG rule


def is_pci_bus_order(order: str | None) -> bool:
    """Return whether ``CUDA_DEVICE_ORDER`` is exactly ``"PCI_BUS_ID"`` (else fastest first)."""
    return order == "PCI_BUS_ID"


_ULONG_MAX = 2**64 - 1  # the largest value strtoul reads; beyond it, it overflows
_ORDINAL_MASK = 2**32 - 1  # the driver stores the ordinal strtoul read in a 32-bit int…
_INT_MAX = 2**31 - 1  # …so low 32 bits of 2**31 or more are negative there: no device has it


def _decimal(digits: str) -> int | None:
    """Read ASCII decimal digits as ``strtoul`` would; ``None`` when the value overflows."""
    # Refused by length first: text of any length is read in bounded time, within int()'s limit.
    significant = digits.lstrip("0")
    if len(significant) > len(str(_ULONG_MAX)):
        return None
    value = int(significant or "0")
    return value if value <= _ULONG_MAX else None


def _parse_ordinal(text: str) -> VisibleEntry | None:
    """Return the ordinal entry ``text`` is as the driver reads it (``strtoul``, low 32 bits)."""
    # Leading white space, an optional sign, the leading digits; the rest is ignored ("1abc" is
    # 1). "4294967297" and "-4294967295" are 1, "-1" is invalid.
    body = text.lstrip(_WHITESPACE)
    sign, body = (body[0], body[1:]) if body[:1] in ("+", "-") else ("", body)
    digits = body[: len(body) - len(body.lstrip("0123456789"))]  # the leading ASCII digits
    if not digits:
        return None
    value = _decimal(digits)
    if value is None:
        value = _ULONG_MAX  # strtoul overflows (ERANGE) and returns ULONG_MAX
    elif sign == "-":
        value = -value % (_ULONG_MAX + 1)  # strtoul negates in unsigned arithmetic
    value &= _ORDINAL_MASK  # the driver keeps the low 32 bits, as a signed int
    return None if value > _INT_MAX else VisibleEntry(EntryKind.ORDINAL, text, value)


def _read_uuid_digits(body: str) -> str | None:
    """Read UUID digits as CUDA does; ``None`` when the text is not a UUID (prefix)."""
    # Hex digits in either case, dashes skipped wherever they are; any other character before
    # the 32nd digit, or no digit at all ("GPU-"), makes the entry invalid. After a whole UUID
    # (32 digits) the rest of the entry does not matter.
    match = _UUID_DIGITS_RE.match(body)
    return None if match is None else match.group(0).replace("-", "").lower() or None


def uuid_digits(uuid: str) -> str:
    """Return a ``GPU-``/``MIG-`` UUID as ``VisibleEntry.uuid_prefix`` writes it."""
    return uuid[: len(_GPU_PREFIX)] + uuid[len(_GPU_PREFIX) :].replace("-", "").lower()


def _parse_uuid_entry(text: str) -> VisibleEntry | None:
    # Exactly "GPU-" or "MIG-": no white space before it, no lower case.
    head = len(_GPU_PREFIX)
    prefix, rest = text[:head], text[head:]
    if prefix not in (_GPU_PREFIX, _MIG_PREFIX):
        return None
    legacy = _MIG_LEGACY_RE.match(text)  # else "MIG-GPU-…" is no MIG UUID either ("G")
    if legacy is not None:
        digits = _read_uuid_digits(legacy[1])
        gi, ci = _decimal(legacy[2]), _decimal(legacy[3])  # the GPU and compute instance ids
        if digits is None or gi is None or ci is None:
            return None  # an instance id that overflows names no MIG device
        return VisibleEntry(EntryKind.MIG_LEGACY, text, None, _GPU_PREFIX + digits, gi, ci)
    digits = _read_uuid_digits(rest)
    if digits is None:
        return None
    kind = EntryKind.GPU_UUID if prefix == _GPU_PREFIX else EntryKind.MIG_UUID
    return VisibleEntry(kind, text, uuid_prefix=prefix + digits)


def parse_cuda_visible_devices(value: str | None) -> CudaVisibleSpec:
    """Parse the text of ``CUDA_VISIBLE_DEVICES`` (``None``: unset) into entries; never raises."""
    if value is None:
        return CudaVisibleSpec(None, ())
    entries: list[VisibleEntry] = []
    # The first entry decides the form of the whole list (no prefix holds a comma).
    uuid_form = value.startswith((_GPU_PREFIX, _MIG_PREFIX))
    for text in value.split(","):
        entry = _parse_uuid_entry(text) if uuid_form else _parse_ordinal(text)
        if entry is None:  # the first invalid entry ends the list ("" or NoDevFiles: none)
            return CudaVisibleSpec(value, tuple(entries), stopped_at=text)
        entries.append(entry)
    return CudaVisibleSpec(value, tuple(entries))


def _resolve_entry(
    entry: VisibleEntry, gpus: Sequence[GpuRecord]
) -> tuple[VisibleTarget | None, str]:
    if entry.kind is EntryKind.ORDINAL:
        assert entry.ordinal is not None
        if entry.ordinal >= len(gpus):
            return None, f"ordinal {entry.ordinal} is not below the {len(gpus)} GPU(s) present"
        gpu = gpus[entry.ordinal]
        return VisibleTarget(gpu.nvml_index, gpu.uuid), ""
    assert entry.uuid_prefix is not None
    mig = entry.kind is EntryKind.MIG_UUID
    # The driver matches a MIG- entry's digits against MIG devices and GPUs alike.
    named = [(g, m.uuid) for g in gpus if mig for m in g.mig_devices] + [(g, g.uuid) for g in gpus]
    skip = len(_MIG_PREFIX) if mig else 0
    digits = entry.uuid_prefix[skip:]
    hits = [(g, u) for g, u in named if uuid_digits(u)[skip:].startswith(digits)]
    legacy = entry.kind is EntryKind.MIG_LEGACY
    if len(hits) != 1:  # no UUID starts with the entry, or several do
        what = "MIG device or GPU" if mig else "GPU"
        text = shown(entry.uuid_prefix if legacy else entry.text)
        if not hits:
            return None, f"{text} matches no {what}"
        return None, f"{text} is ambiguous: it is a prefix of {len(hits)} {what} UUIDs"
    gpu, uuid = hits[0]
    if not legacy:
        return VisibleTarget(gpu.nvml_index, uuid, mig=uuid.startswith(_MIG_PREFIX)), ""
    wanted = (entry.gpu_instance_id, entry.compute_instance_id)
    for device in gpu.mig_devices:
        if (device.gpu_instance_id, device.compute_instance_id) == wanted:
            return VisibleTarget(gpu.nvml_index, device.uuid, mig=True), ""
    return None, (
        f"GPU {gpu.uuid} has no MIG device with GPU instance {entry.gpu_instance_id} "
        f"and compute instance {entry.compute_instance_id}"
    )


def _apply_mig_rule(
    targets: list[VisibleTarget], gpus: Sequence[GpuRecord], notes: list[str]
) -> list[VisibleTarget]:
    # A CUDA process enumerates at most one MIG device: the first named one, or else the first
    # MIG device of the first named MIG-enabled GPU (one without MIG devices shows nothing).
    migs = [t for t in targets if t.mig]
    if migs:
        if len(targets) > 1:
            notes.append(
                f"MIG device {migs[0].uuid} is named, and a CUDA process sees at most one MIG "
                f"device: the other {len(targets) - 1} named device(s) are not visible"
            )
        return migs[:1]
    by_index = {g.nvml_index: g for g in gpus}
    kept: list[VisibleTarget] = []
    for target in targets:
        gpu = by_index[target.nvml_index]
        if not gpu.mig_enabled:
            kept.append(target)
            continue
        if not gpu.mig_devices:
            notes.append(f"GPU {gpu.uuid} has MIG enabled but no MIG device: it is not visible")
            continue
        first = gpu.mig_devices[0]
        if len(targets) > 1:
            notes.append(
                f"GPU {gpu.uuid} has MIG enabled: its first MIG device {first.uuid} is the only "
                f"visible device (a CUDA process sees at most one MIG device)"
            )
        return [VisibleTarget(gpu.nvml_index, first.uuid, mig=True)]
    return kept


def _list_ends(text: str, why: str = "") -> str:
    return f"CUDA_VISIBLE_DEVICES entry {shown(text)} is invalid{why}; the list ends before it"


def resolve_cuda_visible_devices(
    spec: CudaVisibleSpec | str | None, gpus: Sequence[GpuRecord]
) -> Resolution:
    """Match ``CUDA_VISIBLE_DEVICES`` (parsed, or its text) against ``gpus`` in CUDA's order."""
    if not isinstance(spec, CudaVisibleSpec):
        spec = parse_cuda_visible_devices(spec)
    notes: list[str] = []
    targets: list[VisibleTarget] = []
    if spec.raw is None:  # unset: every GPU is visible
        targets = [VisibleTarget(g.nvml_index, g.uuid) for g in gpus]
    else:
        seen: dict[VisibleTarget, str] = {}  # each target, and the entry that named it
        for entry in spec.entries:
            target, why = _resolve_entry(entry, gpus)
            if target is None:
                notes.append(_list_ends(entry.text, f" ({why})"))
                break
            if target in seen:  # cuInit then fails with CUDA_ERROR_INVALID_DEVICE
                notes.append(
                    f"CUDA_VISIBLE_DEVICES names {target.uuid} twice ({shown(seen[target])} and "
                    f"{shown(entry.text)}), which makes the whole variable invalid: no device "
                    f"is visible"
                )
                return Resolution((), tuple(notes))
            seen[target] = entry.text
            targets.append(target)
        else:
            if spec.stopped_at is not None:
                notes.append(_list_ends(spec.stopped_at))
    return Resolution(tuple(_apply_mig_rule(targets, gpus, notes)), tuple(notes), tuple(targets))
