"""``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, as the CUDA driver reads them.

:func:`parse_cuda_visible_devices` turns the variable's text into entries, and
:func:`resolve_cuda_visible_devices` matches them against the machine's GPUs (in CUDA's order)
and returns the visible devices; both are pure and never raise. The rules (``docs/backends/
cuda.md``) were checked form by form against ``cuInit`` on driver 580:
``tools/record_cuda_visible.py`` records the driver's answers into
``tests/data/cuda_visible_ground_truth.json``, which ``tests/visible/test_cuda_ground_truth.py``
replays through these functions. The value types are ``NamedTuple``s: this module is on the
detection path, where a frozen dataclass costs about a millisecond to create at import.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"

_GPU_PREFIX = "GPU-"
_MIG_PREFIX = "MIG-"
_WHITESPACE = " \t\n\r\v\f"
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_UUID_DIGITS = 32


class EntryKind(str, enum.Enum):
    """What one entry of ``CUDA_VISIBLE_DEVICES`` names."""

    ORDINAL = "ordinal"  # an index into CUDA's enumeration of the machine's GPUs
    GPU_UUID = "gpu-uuid"  # GPU-…, possibly abbreviated
    MIG_UUID = "mig-uuid"  # MIG-…, possibly abbreviated (drivers R470 and later)
    MIG_LEGACY = "mig-legacy"  # MIG-GPU-<uuid>/<gpu instance id>/<compute instance id>


class VisibleEntry(NamedTuple):
    """One valid entry of ``CUDA_VISIBLE_DEVICES``, as written (``text``) and as read.

    ``uuid_prefix`` is the (possibly abbreviated) UUID as CUDA reads it: the ``GPU-``/``MIG-``
    prefix and up to 32 lower-case hex digits without dashes (``"GPU-8932f937d72c"``); for
    ``MIG_LEGACY``, the parent GPU's, with the two instance ids.
    """

    kind: EntryKind
    text: str
    ordinal: int | None = None
    uuid_prefix: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class CudaVisibleSpec(NamedTuple):
    """``CUDA_VISIBLE_DEVICES`` parsed: the valid entries before ``stopped_at``, the first invalid.

    ``raw`` is ``None`` when the variable is unset.
    """

    raw: str | None
    entries: tuple[VisibleEntry, ...]
    stopped_at: str | None = None

    @property
    def unset(self) -> bool:
        """``True`` when the variable is unset, so every GPU is visible."""
        return self.raw is None


class MigRecord(NamedTuple):
    """One MIG device of a GPU (instance ids where known, for the legacy form)."""

    uuid: str
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class GpuRecord(NamedTuple):
    """One physical GPU: its NVML index, ``GPU-…`` UUID and MIG devices in MIG index order."""

    nvml_index: int
    uuid: str
    mig_enabled: bool = False
    mig_devices: tuple[MigRecord, ...] = ()


class VisibleTarget(NamedTuple):
    """One visible device: its GPU's NVML index (a MIG device's parent) and its own UUID."""

    nvml_index: int
    uuid: str
    mig: bool = False


class Resolution(NamedTuple):
    """The visible devices (position ``i`` is visible index ``i``) and what was noticed.

    ``notes`` are sentences about entries that ended the list, duplicates or MIG rules, for
    ``accelplat info`` and error messages; empty when the variable was applied plainly.
    """

    targets: tuple[VisibleTarget, ...]
    notes: tuple[str, ...] = ()


def is_pci_bus_order(order: str | None) -> bool:
    """Return whether ``CUDA_DEVICE_ORDER`` (``None``: unset) selects PCI bus order.

    Only ``"PCI_BUS_ID"`` does (CUDA compares exactly); anything else means ``FASTEST_FIRST``.
    """
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


def _parse_ordinal(text: str) -> int | None:
    """Read ``text`` as the driver does (``strtoul``, low 32 bits); ``None`` without digits."""
    # Leading white space (stripped by the caller), an optional sign, the leading digits; the
    # rest is ignored ("1abc" is 1). "4294967297" and "-4294967295" are 1, "-1" is invalid.
    sign = ""
    body = text
    if body[:1] in ("+", "-"):
        sign, body = body[0], body[1:]
    end = 0
    while end < len(body) and "0" <= body[end] <= "9":
        end += 1
    if end == 0:
        return None
    value = _decimal(body[:end])
    if value is None:
        value = _ULONG_MAX  # strtoul overflows (ERANGE) and returns ULONG_MAX
    elif sign == "-":
        value = -value % (_ULONG_MAX + 1)  # strtoul negates in unsigned arithmetic
    value &= _ORDINAL_MASK  # the driver keeps the low 32 bits, as a signed int
    return None if value > _INT_MAX else value


def _read_uuid_digits(body: str) -> str | None:
    """Read UUID digits as CUDA does; ``None`` when the text is not a UUID (prefix)."""
    # Hex digits in either case, dashes skipped wherever they are; any other character before
    # the 32nd digit, or no digit at all ("GPU-"), makes the entry invalid.
    digits: list[str] = []
    for char in body:
        if len(digits) == _UUID_DIGITS:
            break  # a whole UUID has been read: the rest of the entry does not matter
        if char == "-":
            continue
        if char not in _HEX_DIGITS:
            return None
        digits.append(char)
    return "".join(digits).lower() or None


def uuid_digits(uuid: str) -> str:
    """Return a UUID (``GPU-…``/``MIG-…``) as its prefix and 32 lower-case digits, no dashes.

    ``"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"`` gives ``"GPU-8932f937d72c4106c12f20bd9faed9f6"``,
    the form ``VisibleEntry.uuid_prefix`` is compared with.
    """
    head = len(_GPU_PREFIX)
    return uuid[:head] + uuid[head:].replace("-", "").lower()


def _parse_uuid_entry(text: str) -> VisibleEntry | None:
    # Exactly "GPU-" or "MIG-": no white space before it, no lower case.
    head = len(_GPU_PREFIX)
    if text.startswith(_GPU_PREFIX):
        digits = _read_uuid_digits(text[head:])
        if digits is None:
            return None
        return VisibleEntry(EntryKind.GPU_UUID, text, uuid_prefix=_GPU_PREFIX + digits)
    if not text.startswith(_MIG_PREFIX):
        return None
    rest = text[head:]
    if rest.startswith(_GPU_PREFIX) and "/" in rest:
        parts = rest.split("/")
        if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts[1:]):
            return None
        digits = _read_uuid_digits(parts[0][head:])
        gpu_instance_id, compute_instance_id = _decimal(parts[1]), _decimal(parts[2])
        if digits is None or gpu_instance_id is None or compute_instance_id is None:
            return None  # an instance id that overflows names no MIG device
        return VisibleEntry(
            EntryKind.MIG_LEGACY,
            text,
            uuid_prefix=_GPU_PREFIX + digits,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
        )
    digits = _read_uuid_digits(rest)
    if digits is None:
        return None
    return VisibleEntry(EntryKind.MIG_UUID, text, uuid_prefix=_MIG_PREFIX + digits)


def parse_cuda_visible_devices(value: str | None) -> CudaVisibleSpec:
    """Parse the text of ``CUDA_VISIBLE_DEVICES`` (``None``: unset) into entries; never raises.

    Whether an ordinal is in range, a UUID prefix unique, or a device named twice is decided by
    :func:`resolve_cuda_visible_devices`.

    Example:
        >>> spec = parse_cuda_visible_devices("1abc, 0,GPU-8932f937")
        >>> [e.ordinal for e in spec.entries], spec.stopped_at
        ([1, 0], 'GPU-8932f937')
    """
    if value is None:
        return CudaVisibleSpec(None, ())
    entries: list[VisibleEntry] = []
    uuid_form: bool | None = None
    for text in value.split(","):
        if uuid_form is None:  # the first entry decides the form of the whole list
            uuid_form = text.startswith((_GPU_PREFIX, _MIG_PREFIX))
        entry: VisibleEntry | None
        if uuid_form:
            entry = _parse_uuid_entry(text)
        else:
            ordinal = _parse_ordinal(text.lstrip(_WHITESPACE))
            entry = None if ordinal is None else VisibleEntry(EntryKind.ORDINAL, text, ordinal)
        if entry is None:  # the first invalid entry ends the list ("" or NoDevFiles: none)
            return CudaVisibleSpec(value, tuple(entries), stopped_at=text)
        entries.append(entry)
    return CudaVisibleSpec(value, tuple(entries))


def _match_prefix(prefix: str, uuids: Sequence[str]) -> tuple[int | None, int]:
    """Return ``(position of the single match or None, number of matches)``.

    ``prefix`` is in :func:`uuid_digits` form; each UUID is brought to it before comparing.
    """
    found: int | None = None
    count = 0
    for pos, uuid in enumerate(uuids):
        if uuid_digits(uuid).startswith(prefix):
            count += 1
            found = pos
    return (found if count == 1 else None), count


def _resolve_entry(
    entry: VisibleEntry, gpus: Sequence[GpuRecord]
) -> tuple[VisibleTarget | None, str]:
    """Match one entry; on failure return ``(None, why)``."""
    if entry.kind is EntryKind.ORDINAL:
        assert entry.ordinal is not None
        if entry.ordinal >= len(gpus):
            return None, f"ordinal {entry.ordinal} is not below the {len(gpus)} GPU(s) present"
        gpu = gpus[entry.ordinal]
        return VisibleTarget(gpu.nvml_index, gpu.uuid), ""
    assert entry.uuid_prefix is not None
    if entry.kind is EntryKind.GPU_UUID:
        pos, count = _match_prefix(entry.uuid_prefix, [g.uuid for g in gpus])
        if pos is None:
            return None, _no_unique("GPU", entry.text, count)
        return VisibleTarget(gpus[pos].nvml_index, gpus[pos].uuid), ""
    if entry.kind is EntryKind.MIG_UUID:
        # The driver matches a MIG- entry's digits against MIG devices and GPUs alike.
        named = [(g, m.uuid) for g in gpus for m in g.mig_devices] + [(g, g.uuid) for g in gpus]
        digits = entry.uuid_prefix[len(_MIG_PREFIX) :]
        pos, count = _match_prefix(digits, [uuid_digits(u)[len(_MIG_PREFIX) :] for _, u in named])
        if pos is None:
            return None, _no_unique("MIG device or GPU", entry.text, count)
        gpu, uuid = named[pos]
        return VisibleTarget(gpu.nvml_index, uuid, mig=uuid.startswith(_MIG_PREFIX)), ""
    pos, count = _match_prefix(entry.uuid_prefix, [g.uuid for g in gpus])
    if pos is None:
        return None, _no_unique("GPU", entry.uuid_prefix, count)
    for mig in gpus[pos].mig_devices:
        if (mig.gpu_instance_id, mig.compute_instance_id) == (
            entry.gpu_instance_id,
            entry.compute_instance_id,
        ):
            return VisibleTarget(gpus[pos].nvml_index, mig.uuid, mig=True), ""
    return None, (
        f"GPU {gpus[pos].uuid} has no MIG device with GPU instance {entry.gpu_instance_id} "
        f"and compute instance {entry.compute_instance_id}"
    )


def _no_unique(what: str, text: str, count: int) -> str:
    if count == 0:
        return f"{text!r} matches no {what}"
    return f"{text!r} is ambiguous: it is a prefix of {count} {what} UUIDs"


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


def resolve_cuda_visible_devices(
    spec: CudaVisibleSpec | str | None, gpus: Sequence[GpuRecord]
) -> Resolution:
    """Match ``CUDA_VISIBLE_DEVICES`` against the machine's GPUs, as the driver does; never raises.

    Args:
        spec: A parsed spec, or the variable's text (``None`` when unset).
        gpus: Every GPU in CUDA's enumeration order (ordinal ``i`` is ``gpus[i]``; PCI bus order
            under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), with their MIG devices.

    Example:
        >>> gpus = [GpuRecord(0, "GPU-aa11"), GpuRecord(1, "GPU-bb22")]
        >>> [t.nvml_index for t in resolve_cuda_visible_devices("1", gpus).targets]
        [1]
    """
    if not isinstance(spec, CudaVisibleSpec):
        spec = parse_cuda_visible_devices(spec)
    notes: list[str] = []
    targets: list[VisibleTarget] = []
    if spec.unset:
        targets = [VisibleTarget(g.nvml_index, g.uuid) for g in gpus]
    else:
        seen: dict[tuple[int, str], str] = {}
        for entry in spec.entries:
            target, why = _resolve_entry(entry, gpus)
            if target is None:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry.text!r} is invalid ({why}); "
                    f"the list ends before it"
                )
                break
            key = (target.nvml_index, target.uuid)
            if key in seen:  # cuInit then fails with CUDA_ERROR_INVALID_DEVICE
                notes.append(
                    f"CUDA_VISIBLE_DEVICES names {target.uuid} twice ({seen[key]!r} and "
                    f"{entry.text!r}), which makes the whole variable invalid: no device "
                    f"is visible"
                )
                return Resolution((), tuple(notes))
            seen[key] = entry.text
            targets.append(target)
        else:
            if spec.stopped_at is not None:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {spec.stopped_at!r} is invalid; "
                    f"the list ends before it"
                )
    return Resolution(tuple(_apply_mig_rule(targets, gpus, notes)), tuple(notes))
