"""What the built-in backends share: host-file readers, PCI addresses, plausibility.

Files are read through :mod:`accelplat._files` (a FIFO in a tree is an error, not a hang);
:func:`checked_memory` is the one plausibility rule of every memory reading.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from accelplat import _files
from accelplat._types import MemoryInfo, ProbeResult
from accelplat._util import clip
from accelplat._vendor import vendor_int
from accelplat.errors import AccelplatError, BackendError, ImplausibleReadingError

if TYPE_CHECKING:
    from pathlib import Path

ENV_PROC_ROOT = "ACCELPLAT_PROC_ROOT"  # moves /proc (tests, chroots)
ENV_SYSFS_ROOT = "ACCELPLAT_SYSFS_ROOT"  # moves /sys for the CPU, ROCm and XPU backends

_KIB = 1024
_U64_MAX = 2**64 - 1
_U64_DIGITS = len(str(_U64_MAX))
_BDF = r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"  # domain:bus:dev.fn
_UNKNOWN_PCI = (1 << 32,)

ReadText = Callable[[str], str]  # how a backend reads one attribute's text (tests inject one)

# The note of an fp8 rule where vLLM says "supported" and no fp8 hardware exists: vLLM 0.33's
# supports_fp8() is true on every gfx9/RDNA ROCm target and every XPU (vllm/platforms/rocm.py,
# xpu.py). Not confirmed on those devices by accelplat (docs/report-your-hardware.md).
EMULATED_FP8 = "emulated: vLLM 0.33's supports_fp8(), not confirmed on hardware"


def read_or_empty(path: str | os.PathLike[str], *, limit: int = _files.ATTRIBUTE_LIMIT) -> str:
    """Return the text of a host file, or ``""`` when it cannot be read."""
    with contextlib.suppress(OSError):
        return _files.read_text(path, limit=limit)
    return ""


class SysfsReader:
    """Reads sysfs attributes; failures are ``BackendError``.

    The default reader is :func:`accelplat._files.read_text`: at most a page, regular files only.
    """

    def __init__(self, platform: str, read_text: ReadText | None = None) -> None:
        self._platform = platform
        self._read = read_text or _files.read_text

    def text(self, path: Path) -> str:
        """Return the stripped text of ``path``."""
        name = str(path)
        try:
            return self._read(name).strip()
        except FileNotFoundError:
            why = f"{name} is missing (was the GPU removed?)"
        except PermissionError:
            why = f"{name}: permission denied"
        except IsADirectoryError:
            why = f"{name} is a directory, not an attribute file"
        except OSError as exc:
            why = f"cannot read {name}: {exc.strerror or exc}"
        raise BackendError(self._platform, why) from None

    def integer(self, path: Path, *, base: int = 10) -> int:
        """Return the non-negative integer held in ``path``."""
        text = self.text(path)
        if not text:
            raise BackendError(self._platform, f"{path} is empty (truncated read?)")
        try:
            value = int(text, base)
        except ValueError:
            why = f"{path} holds {text[:40]!r}, not a number"
            raise BackendError(self._platform, why) from None
        if value < 0:
            raise BackendError(self._platform, f"{path} holds a negative value {value}")
        return value


def parse_kb_table(
    text: str, *, skip: int = 0, keys: frozenset[str] | None = None
) -> dict[str, int]:
    """Parse ``Key: value [kB]`` lines into bytes, less ``skip`` leading words; only ``keys``."""
    table: dict[str, int] = {}
    for line in text.splitlines():
        words = line.split()[skip:]
        if len(words) < 2 or not words[0].endswith(":"):
            continue
        key, number = words[0][:-1], words[1]
        if not (number.isascii() and number.isdigit()) or (keys is not None and key not in keys):
            continue
        unit = words[2].lower() if len(words) > 2 else ""
        # Over 20 digits saturates at 2**64 - 1 as the kernel's strtoull reads it: the
        # plausibility rule refuses it by name instead of int() parsing thousands of digits.
        value = int(number) if len(number) <= _U64_DIGITS else _U64_MAX
        table[key] = value * _KIB if unit == "kb" else value
    return table


def parse_key_values(text: str, *, sep: str | None = None) -> dict[str, str]:
    """Parse ``key<sep>value`` lines (``sep=None``: the first run of blanks); first key wins."""
    table: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(sep, 1)
        if len(parts) == 2 and (key := parts[0].strip()) and key not in table:
            table[key] = parts[1].strip()
    return table


def parse_int_values(table: Mapping[str, str]) -> dict[str, int]:
    """Return the entries of ``table`` whose value is a (possibly negative) ASCII integer."""
    digits = {k: v.removeprefix("-") for k, v in table.items()}
    return {k: int(table[k]) for k, d in digits.items() if d.isascii() and d.isdigit()}


class HostMemInfo(NamedTuple):
    """``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo`` in bytes, and the file read."""

    total: int
    available: int
    path: str


_MEMINFO_KEYS = frozenset({"MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached"})


def meminfo_path(root: str | os.PathLike[str] | None = None) -> str:
    """Return ``<proc root>/meminfo``: ``root``, else ``ACCELPLAT_PROC_ROOT``, else ``/proc``."""
    proc = os.fspath(root) if root else os.environ.get(ENV_PROC_ROOT) or "/proc"
    return os.path.join(proc, "meminfo")


def host_meminfo(root: str | os.PathLike[str] | None = None) -> HostMemInfo | None:
    """Read :func:`meminfo_path` (OSError naming it); ``None`` without a positive ``MemTotal``."""
    path = meminfo_path(root)
    table = parse_kb_table(_files.read_text(path, limit=_files.PROC_LIMIT), keys=_MEMINFO_KEYS)
    total = table.get("MemTotal", 0)
    if total <= 0:
        return None
    available = table.get("MemAvailable")
    if available is None:  # kernels before 3.14 have no MemAvailable
        available = table.get("MemFree", 0) + table.get("Buffers", 0) + table.get("Cached", 0)
    return HostMemInfo(total, available, path)


def pci_address(text: str | None) -> str | None:
    """Return ``text`` as a lower-case PCI address ``dddd:bb:dd.f``; ``None`` if it is not one.

    A domain written with more digits (NVML's ``00000000:3B:00.0``) is cut to its value's four.
    """
    key = pci_sort_key(text)
    return None if key == _UNKNOWN_PCI else "{:04x}:{:02x}:{:02x}.{:x}".format(*key)


def pci_sort_key(bus_id: str | None) -> tuple[int, ...]:
    """Return a sort key for a PCI address ``dddd:bb:dd.f``; unknown addresses sort last."""
    match = re.match(_BDF, (bus_id or "").strip())
    if match is None:
        return _UNKNOWN_PCI
    return tuple(int(g, 16) for g in match.groups())


_Cls = TypeVar("_Cls")
_REASON_LIMIT = 2000


def never_raises(probe: Callable[[_Cls], ProbeResult]) -> Callable[[_Cls], ProbeResult]:
    """Wrap a backend's ``probe`` (under ``@classmethod``) so that no error escapes it."""

    @functools.wraps(probe)
    def guarded(cls: _Cls) -> ProbeResult:
        try:
            return probe(cls)
        except Exception as exc:  # a probe never raises
            ours = isinstance(exc, AccelplatError)
            why = str(exc) if ours else f"probe failed: {type(exc).__name__}: {exc}"
            return ProbeResult(False, clip(why, _REASON_LIMIT))

    return guarded


def torch_reading(
    platform: str, fn: Callable[[int], Any], device: int, source: str, where: str
) -> MemoryInfo:
    """Return the checked reading of a framework's ``free, total = fn(device)`` (mem_get_info)."""
    name = source.partition(" (")[0]
    try:
        free, total = fn(device)
    except Exception as exc:
        why = f"{name} memory query for device {device} failed: {clip(str(exc), 400)}"
        raise BackendError(platform, why, type(exc).__name__) from exc
    free = vendor_int(platform, where, "free", free)
    total = vendor_int(platform, where, "total", total)
    used = max(0, total - free)
    return checked_memory(platform, where, free=free, total=total, used=used, source=source)


def vendor_cards(
    drm: Path, vendor: int, read: ReadText
) -> tuple[list[tuple[str, Path, str | None]], str]:
    """List ``drm``'s cards whose ``device/vendor`` is ``vendor``, and :func:`drm_cards`' note.

    Each card is ``(cardN, its device directory, its PCI address or None)``.
    """
    entries, note = drm_cards(drm)
    cards: list[tuple[str, Path, str | None]] = []
    for entry in entries:
        device = drm / entry / "device"
        with contextlib.suppress(OSError, ValueError):  # an unreadable vendor: not this vendor's
            if int(read(str(device / "vendor")).strip(), 16) == vendor:
                cards.append((entry, device, _card_pci(device, read)))
    return cards, note


def _card_pci(device: Path, read: ReadText) -> str | None:
    with contextlib.suppress(OSError):
        pci = pci_address(os.path.basename(_files.realpath(device)))
        uevent = "" if pci else read(str(device / "uevent"))
        return pci or pci_address(parse_key_values(uevent, sep="=").get("PCI_SLOT_NAME"))
    return None


AMD_VENDOR_ID = 0x1002
INTEL_VENDOR_ID = 0x8086

_CARD_RE = re.compile(r"^card(\d+)$")

DrmPath = str | os.PathLike[str]


def drm_cards(drm: DrmPath) -> tuple[list[str], str]:
    """List the ``cardN`` entries of ``drm`` (no connectors), sorted, and ``""``; or why not."""
    try:
        entries = sorted(_files.listdir(drm))
    except FileNotFoundError:
        return [], f"{drm} does not exist"
    except OSError as exc:
        return [], f"{drm} is not readable ({exc.strerror or exc})"
    return [e for e in entries if _CARD_RE.match(e)], ""


# A driver that answers can still answer nonsense: a u64 counter wrapped below zero (~16 EiB),
# reserved above total, more free than there is. Every backend's figures go through
# checked_memory as the source gave them, before anything bounds them, so a clamp never hides
# an impossible one.

MAX_PLAUSIBLE_BYTES = 2**63 - 1  # 8 EiB: above it, an unsigned counter has wrapped


def implausible(free: int, total: int, used: int, reserved: int = 0) -> str | None:
    """Return a phrase naming the first impossible figure of a reading, or ``None``."""
    checks = (
        *_ranged("total", total),
        *_ranged("used", used),
        *_ranged("reserved", reserved),
        ("total is zero", total == 0),
        ("used exceeds total", used > total),
        *_ranged("free", free),
        ("free exceeds total", free > total),
    )
    return next((why for why, failed in checks if failed), None)


def _ranged(name: str, value: int) -> tuple[tuple[str, bool], ...]:
    wrapped = f"{name} is above 8 EiB (a wrapped-around unsigned counter)"
    return (f"{name} is negative", value < 0), (wrapped, value > MAX_PLAUSIBLE_BYTES)


def checked_memory(
    platform: str, where: str, *, free: int, total: int, used: int, reserved: int = 0, source: str
) -> MemoryInfo:
    """Return a :class:`MemoryInfo` of these figures; ``ImplausibleReadingError`` if impossible."""
    # One chained comparison on the hot path; the explanation is built only on failure.
    if (
        0 <= free <= total <= MAX_PLAUSIBLE_BYTES
        and 0 <= used <= total
        and 0 <= reserved <= MAX_PLAUSIBLE_BYTES
        and total > 0
    ):
        return MemoryInfo(free, total, used, reserved, source)
    why = implausible(free, total, used, reserved)
    if why is not None:
        figures = {"free": free, "total": total, "used": used, "reserved": reserved}
        raise ImplausibleReadingError(platform, where, why, figures, source)
    return MemoryInfo(free, total, used, reserved, source)
