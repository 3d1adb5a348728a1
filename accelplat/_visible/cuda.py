"""``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, as the CUDA driver reads them.

Two pure functions, so every rule can be tested without a GPU:

* :func:`parse_cuda_visible_devices` turns the variable's text into entries;
* :func:`resolve_cuda_visible_devices` matches those entries against a table of the machine's
  GPUs (in CUDA's enumeration order) and returns the visible devices in visible-index order.

Neither reads the environment or imports a vendor library; the CUDA backend gathers the table
from NVML and calls them. The value types are immutable ``NamedTuple``s rather than dataclasses
because this module is on the detection path, where each frozen dataclass costs about a
millisecond to create at import.

The rules (CUDA programming guide, MIG user guide, and the behaviour of the CUDA driver itself,
checked form by form against ``cuInit`` on driver 580: ``tools/record_cuda_visible.py`` records
the driver's answer for a few hundred forms into ``tests/data/cuda_visible_ground_truth.json``,
which ``tests/visible/test_cuda_ground_truth.py`` replays through these functions):

* Unset: every GPU is visible. Set to the empty string (or to anything whose first entry is
  invalid, ``NoDevFiles`` included): no GPU is visible.
* The text is split at commas.
* The first entry decides the form of the whole list. A list whose first entry starts with
  ``GPU-`` or ``MIG-`` is a list of UUIDs, and a later ordinal is invalid there; any other list is
  a list of ordinals, and a later ``GPU-``/``MIG-`` entry is invalid there.
* An ordinal is read like C's ``strtoul``: leading white space, an optional sign, then the
  leading decimal digits; whatever follows is ignored (``"1abc"`` and ``" 1 "`` are ``1``).
  As ``strtoul`` does, a minus sign negates the value modulo 2**64, and a value that overflows
  an ``unsigned long`` (however many digits it has) becomes ``ULONG_MAX``. The driver then keeps
  the low 32 bits as an ``int``: ``"4294967297"`` and ``"-4294967295"`` are ordinal ``1``,
  ``"-0"`` is ``0``, and ``"-1"``, ``"2147483648"`` or an overflowing value are negative there.
  A negative ordinal, an entry without leading digits and an ordinal not below the number of
  GPUs are invalid.
* A UUID entry must start with exactly ``GPU-`` or ``MIG-`` (no white space before it, upper
  case). After that CUDA reads hexadecimal digits in either case, skipping dashes wherever they
  are; once it has all 32 digits of a UUID it ignores the rest of the entry. Any other character
  before that, or no digit at all (``"GPU-"``), makes the entry invalid. The digits read may be
  an abbreviation: they must begin the UUID of exactly one GPU; digits that begin none, or
  several, are invalid. ``MIG-<uuid>`` likewise names MIG devices, but the driver matches its
  digits against the GPUs' UUIDs too (``MIG-<digits of a GPU's UUID>`` names that GPU); a
  ``GPU-`` entry matches GPUs only. The legacy
  ``MIG-GPU-<uuid>/<gpu instance id>/<compute instance id>`` names a MIG device by its parent
  GPU and instance ids.
* The first invalid entry ends the list: the devices named before it stay visible.
* A device named twice (by the same or by different spellings, before the list ended) makes the
  whole variable invalid: no GPU is visible.
* Ordinals count GPUs in CUDA's order: PCI bus order when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
  otherwise ``FASTEST_FIRST``. The caller supplies the table already in that order.
* MIG: a CUDA process enumerates at most one MIG device. When the named devices include MIG
  devices, only the first of them is visible. Otherwise, when a named GPU has MIG mode enabled,
  its first MIG device is the only visible device (a MIG-enabled GPU with no MIG device shows
  nothing).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "ENV_CUDA_DEVICE_ORDER",
    "ENV_CUDA_VISIBLE_DEVICES",
    "CudaVisibleSpec",
    "EntryKind",
    "GpuRecord",
    "MigRecord",
    "Resolution",
    "VisibleEntry",
    "VisibleTarget",
    "is_pci_bus_order",
    "parse_cuda_visible_devices",
    "resolve_cuda_visible_devices",
    "uuid_digits",
]

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
"""The variable CUDA reads to select and order visible devices."""

ENV_CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
"""The variable that switches CUDA's ordinals from fastest-first to PCI bus order."""

_GPU_PREFIX = "GPU-"
_MIG_PREFIX = "MIG-"
_WHITESPACE = " \t\n\r\v\f"
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_UUID_DIGITS = 32


class EntryKind(str, enum.Enum):
    """What one entry of ``CUDA_VISIBLE_DEVICES`` names."""

    ORDINAL = "ordinal"
    """An integer index into CUDA's enumeration of the machine's GPUs."""
    GPU_UUID = "gpu-uuid"
    """A GPU UUID, ``GPU-…``, possibly abbreviated."""
    MIG_UUID = "mig-uuid"
    """A MIG device UUID, ``MIG-…``, possibly abbreviated (drivers R470 and later)."""
    MIG_LEGACY = "mig-legacy"
    """A MIG device as ``MIG-GPU-<uuid>/<gpu instance id>/<compute instance id>``."""


class VisibleEntry(NamedTuple):
    """One valid entry of ``CUDA_VISIBLE_DEVICES``.

    Attributes:
        kind: What the entry names.
        text: The entry as written.
        ordinal: For ``ORDINAL``, the index; else ``None``.
        uuid_prefix: For ``GPU_UUID`` and ``MIG_UUID``, the (possibly abbreviated) UUID as CUDA
            reads it: the ``GPU-``/``MIG-`` prefix, then up to 32 hexadecimal digits in lower
            case without dashes (``"GPU-8932f937d72c"``); for ``MIG_LEGACY``, the parent GPU's,
            read the same way.
        gpu_instance_id: For ``MIG_LEGACY``, the GPU instance id.
        compute_instance_id: For ``MIG_LEGACY``, the compute instance id.
    """

    kind: EntryKind
    text: str
    ordinal: int | None = None
    uuid_prefix: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class CudaVisibleSpec(NamedTuple):
    """``CUDA_VISIBLE_DEVICES`` parsed, before it is matched against the machine's GPUs.

    Attributes:
        raw: The variable's text, or ``None`` when it is unset.
        entries: The valid entries before the first invalid one, in order.
        stopped_at: The first invalid entry as written (the list ends there), or ``None`` when
            every entry was valid.
    """

    raw: str | None
    entries: tuple[VisibleEntry, ...]
    stopped_at: str | None = None

    @property
    def unset(self) -> bool:
        """``True`` when the variable is unset, so every GPU is visible."""
        return self.raw is None


class MigRecord(NamedTuple):
    """One MIG device of a GPU, as the resolver needs it.

    Attributes:
        uuid: Its ``MIG-…`` UUID.
        gpu_instance_id: Its GPU instance id, where known (for the legacy form).
        compute_instance_id: Its compute instance id, where known (for the legacy form).
    """

    uuid: str
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class GpuRecord(NamedTuple):
    """One physical GPU, as the resolver needs it.

    Attributes:
        nvml_index: Its NVML index.
        uuid: Its ``GPU-…`` UUID.
        mig_enabled: Whether MIG mode is currently enabled on it.
        mig_devices: Its MIG devices, in MIG index order (empty when MIG is off).
    """

    nvml_index: int
    uuid: str
    mig_enabled: bool = False
    mig_devices: tuple[MigRecord, ...] = ()


class VisibleTarget(NamedTuple):
    """One visible device, in visible-index order.

    Attributes:
        nvml_index: NVML index of the GPU (for a MIG device: of its parent GPU).
        uuid: The device's UUID: ``GPU-…`` for a whole GPU, ``MIG-…`` for a MIG device.
        mig: ``True`` for a MIG device.
    """

    nvml_index: int
    uuid: str
    mig: bool = False


class Resolution(NamedTuple):
    """The visible devices, and what the resolver noticed on the way.

    Attributes:
        targets: The visible devices; position ``i`` is visible index ``i``.
        notes: Sentences about entries that ended the list, duplicates or MIG rules, for
            ``accelplat info`` and error messages. Empty when the variable was applied plainly.
    """

    targets: tuple[VisibleTarget, ...]
    notes: tuple[str, ...] = ()


def is_pci_bus_order(order: str | None) -> bool:
    """Return whether ``CUDA_DEVICE_ORDER``'s value selects PCI bus order.

    Args:
        order: The variable's value, or ``None`` when unset.

    Returns:
        ``True`` only for ``"PCI_BUS_ID"`` (CUDA compares the value exactly); anything else,
        unset included, means CUDA's default ``FASTEST_FIRST``.
    """
    return order == "PCI_BUS_ID"


_ULONG_MAX = 2**64 - 1
"""The largest value ``strtoul`` reads (64-bit ``unsigned long``); beyond it, it overflows."""

_ORDINAL_MASK = 2**32 - 1
"""The driver stores the ordinal ``strtoul`` read in a 32-bit ``int``…"""

_INT_MAX = 2**31 - 1
"""…so a value whose low 32 bits are 2**31 or more is negative there: no device has it."""


def _decimal(digits: str) -> int | None:
    """Read ASCII decimal digits as ``strtoul`` would; ``None`` when the value overflows.

    Leading zeros are dropped before ``int()`` sees the digits, and an overflowing value is
    refused by its length first, so text of any length is read in bounded time and never meets
    ``int()``'s limit on the number of digits.
    """
    significant = digits.lstrip("0")
    if len(significant) > len(str(_ULONG_MAX)):
        return None
    value = int(significant or "0")
    return value if value <= _ULONG_MAX else None


def _parse_ordinal(text: str) -> int | None:
    """Read ``text`` as the driver does (``strtoul``, low 32 bits); ``None`` without digits."""
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

    Args:
        uuid: A UUID as NVML prints it, e.g. ``"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"``.

    Returns:
        E.g. ``"GPU-8932f937d72c4106c12f20bd9faed9f6"``, the form ``VisibleEntry.uuid_prefix``
        is compared with.
    """
    head = len(_GPU_PREFIX)
    return uuid[:head] + uuid[head:].replace("-", "").lower()


def _parse_uuid_entry(text: str) -> VisibleEntry | None:
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
    """Parse the text of ``CUDA_VISIBLE_DEVICES`` into entries.

    Pure: reads no environment and never raises for any text.

    Args:
        value: The variable's value, or ``None`` when it is unset.

    Returns:
        A :class:`CudaVisibleSpec` whose ``entries`` are the valid entries before the first
        invalid one. Whether an ordinal is in range, a UUID prefix is unique, or two entries
        name the same device is decided by :func:`resolve_cuda_visible_devices`.

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
        if uuid_form is None:
            uuid_form = text.startswith((_GPU_PREFIX, _MIG_PREFIX))
        entry: VisibleEntry | None
        if uuid_form:
            entry = _parse_uuid_entry(text)
        else:
            ordinal = _parse_ordinal(text.lstrip(_WHITESPACE))
            entry = None if ordinal is None else VisibleEntry(EntryKind.ORDINAL, text, ordinal)
        if entry is None:
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
    """Match ``CUDA_VISIBLE_DEVICES`` against the machine's GPUs, as the CUDA driver does.

    Pure: reads no environment and never raises for any text.

    Args:
        spec: A parsed spec, or the variable's text (``None`` when unset).
        gpus: Every GPU of the machine in CUDA's enumeration order (ordinal ``i`` is
            ``gpus[i]``), with their MIG devices.

    Returns:
        The visible devices (position = visible index) and notes on what was dropped and why.

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
            if key in seen:
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
