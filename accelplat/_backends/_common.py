"""What the built-in backends share: host-file readers, quick absence checks, plausibility.

* Readers of sysfs attributes, ``/proc`` tables and PCI addresses, all through
  :mod:`accelplat._files` (a FIFO or ``/dev/zero`` in a tree is an error naming it, not a hang).
* Quick answers to "is this accelerator certainly absent?", asked by the registry before it
  imports a GPU backend (:func:`cuda_absent`, :func:`rocm_absent`, :func:`xpu_absent`); the
  reasons are the backends' own probe sentences, defined here once.
* One plausibility rule for every memory reading (:func:`checked_memory`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from accelplat import _boundary, _files
from accelplat._types import MemoryInfo
from accelplat.errors import BackendError, ImplausibleReadingError

ENV_PROC_ROOT = "ACCELPLAT_PROC_ROOT"
"""Variable that moves ``/proc`` (tests, chroots)."""

ENV_SYSFS_ROOT = "ACCELPLAT_SYSFS_ROOT"
"""Variable that moves ``/sys`` (tests, chroots) for the CPU, ROCm and XPU backends."""

_KIB = 1024
_U64_MAX = 2**64 - 1
_U64_DIGITS = len(str(_U64_MAX))
_BDF = r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"
"""A PCI address, ``domain:bus:device.function``."""
_UNKNOWN_PCI = (1 << 32,)

ReadText = Callable[[str], str]
"""How a backend reads one sysfs attribute's text (injectable for tests)."""


# -- host files --------------------------------------------------------------------------------


def read_attribute(path: str) -> str:
    """Return the text of one sysfs attribute (at most a page, regular files only).

    Raises:
        OSError: Missing, unreadable, not a regular file, or more than a page; naming the path.
    """
    return _files.read_text(path, limit=_files.ATTRIBUTE_LIMIT)


class SysfsReader:
    """Reads sysfs attribute files, turning every failure into a ``BackendError`` naming the file.

    Args:
        platform: The backend's platform name, for the errors.
        read_text: How to read a file's text; default :func:`read_attribute`.
    """

    def __init__(self, platform: str, read_text: ReadText | None = None) -> None:
        self._platform = platform
        self._read = read_text or read_attribute

    def text(self, path: Path) -> str:
        """Return the stripped text of ``path``.

        Raises:
            BackendError: When the file is missing, unreadable, not a regular file, too large
                for an attribute, or fails to read.
        """
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
        """Return the non-negative integer held in ``path``.

        Raises:
            BackendError: When the file cannot be read, is empty (a truncated read), or does not
                hold a non-negative integer.
        """
        text = self.text(path)
        if not text:
            raise BackendError(self._platform, f"{path} is empty (truncated read?)")
        try:
            value = int(text, base)
        except ValueError:
            raise BackendError(
                self._platform, f"{path} holds {text[:40]!r}, not a number"
            ) from None
        if value < 0:
            raise BackendError(self._platform, f"{path} holds a negative value {value}")
        return value


def parse_kb_table(
    text: str, *, skip: int = 0, keys: frozenset[str] | None = None
) -> dict[str, int]:
    """Parse ``Key: value [kB]`` lines (``/proc/meminfo``, node meminfo) into bytes.

    Args:
        text: File contents.
        skip: Leading words to drop from each line (2 for ``Node 0 MemTotal: …``).
        keys: Only these keys (names without a colon) are wanted; other lines are not split.

    Returns:
        Key to bytes; lines that do not parse, and negative values, are left out. A number of
        more than 20 digits saturates at ``2**64 - 1``, as the kernel's ``strtoull`` reads it,
        so the plausibility rule refuses it by name instead of ``int()`` parsing thousands of
        digits.
    """
    table: dict[str, int] = {}
    for line in text.splitlines():
        if keys is not None:
            head = line.partition(":")[0].split()
            if not head or head[-1] not in keys:
                continue
        words = line.split()[skip:]
        if len(words) < 2 or not words[0].endswith(":"):
            continue
        number = words[1]
        if not (number.isascii() and number.isdigit()):
            continue
        unit = words[2].lower() if len(words) > 2 else ""
        value = int(number) if len(number) <= _U64_DIGITS else _U64_MAX
        table[words[0][:-1]] = value * _KIB if unit == "kb" else value
    return table


def parse_key_values(text: str, *, sep: str | None = None) -> dict[str, str]:
    """Parse one ``key<sep>value`` pair a line (``uevent``: ``=``; ``memory.stat``: blanks).

    Args:
        text: File contents.
        sep: The separator; ``None`` splits on blanks and keeps lines of exactly two words.

    Returns:
        Key to value, both stripped; the first occurrence of a key wins.
    """
    table: dict[str, str] = {}
    for line in text.splitlines():
        if sep is None:
            words = line.split()
            if len(words) != 2:
                continue
            key, value = words
        else:
            key, found, value = line.partition(sep)
            if not found:
                continue
            key, value = key.strip(), value.strip()
        if key and key not in table:
            table[key] = value
    return table


def parse_int_values(table: Mapping[str, str]) -> dict[str, int]:
    """Return the entries of ``table`` whose value is a (possibly negative) ASCII integer."""
    return {
        k: int(v)
        for k, v in table.items()
        if v.removeprefix("-").isascii() and v.removeprefix("-").isdigit()
    }


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
    """Read ``MemTotal``/``MemAvailable`` from :func:`meminfo_path`.

    Returns:
        The figures, or ``None`` when the file has no positive ``MemTotal``.

    Raises:
        OSError: When the file cannot be read; the error names the path.
    """
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
    """Return ``text`` as a lower-case PCI address ``dddd:bb:dd.f``; ``None`` if it is not one."""
    candidate = (text or "").strip()
    return candidate.lower() if re.match(_BDF, candidate) else None


def pci_sort_key(bus_id: str | None) -> tuple[int, ...]:
    """Return a sort key for a PCI address ``dddd:bb:dd.f``; unknown addresses sort last."""
    match = re.match(_BDF, (bus_id or "").strip())
    if match is None:
        return _UNKNOWN_PCI
    return tuple(int(g, 16) for g in match.groups())


# -- quick absence checks ----------------------------------------------------------------------
# Each returns the reason the backend's own probe() gives, word for word, or None whenever
# anything could make the backend available (then the registry loads it and runs its probe).
# While a capture records or a replay answers, each returns None: the captured host decides.

ENV_LEVEL_ZERO_LIB = "ACCELPLAT_LEVEL_ZERO_LIB"
"""Variable naming the Level Zero loader library to load instead of :data:`LEVEL_ZERO_LOADER`."""

LEVEL_ZERO_LOADER = "libze_loader.so.1"
AMDSMI_NOT_INSTALLED = "amdsmi is not installed"
ROCM_TORCH_NOT_IMPORTED = "torch is not imported by the caller (accelplat never imports it on ROCm)"
AMD_VENDOR_ID = 0x1002
INTEL_VENDOR_ID = 0x8086

_CARD_RE = re.compile(r"^card(\d+)$")

DrmPath = str | os.PathLike[str]


def no_amd_gpu(drm: DrmPath) -> str:
    """The ROCm probe's first reason when ``drm`` holds no usable AMD card."""
    return f"no AMD GPU with VRAM files under {drm}"


def no_intel_gpu(drm: DrmPath) -> str:
    """The XPU probe's reason when ``drm`` holds no Intel card bound to xe or i915."""
    return f"no Intel GPU bound to xe or i915 under {drm}"


def level_zero_loader_name() -> str:
    """The Level Zero loader to load: ``ACCELPLAT_LEVEL_ZERO_LIB``, else the standard one."""
    return os.environ.get(ENV_LEVEL_ZERO_LIB) or LEVEL_ZERO_LOADER


def level_zero_not_found(name: str, exc: BaseException) -> str:
    """The XPU probe's reason when the Level Zero loader ``name`` cannot be loaded."""
    return f"Level Zero loader {name} not found ({exc})"


def drm_cards(drm: DrmPath) -> tuple[list[str], str]:
    """List the ``cardN`` entries of a DRM class directory, sorted.

    Returns:
        The entries (connectors such as ``card0-DP-1`` and render nodes left out) and ``""``;
        or no entries and a note saying why none could be listed (missing, unreadable).
    """
    try:
        entries = sorted(_files.listdir(drm))
    except FileNotFoundError:
        return [], f"{drm} does not exist"
    except OSError as exc:
        return [], f"{drm} is not readable ({exc.strerror or exc})"
    return [e for e in entries if _CARD_RE.match(e)], ""


def _sysfs_drm() -> DrmPath:
    return Path(os.environ.get(ENV_SYSFS_ROOT) or "/sys") / "class" / "drm"


def _may_hold_vendor(drm: DrmPath, cards: list[str], vendor: int) -> bool:
    """Whether any card may be of ``vendor``; an unreadable vendor file counts as maybe."""
    for card in cards:
        try:
            found = int(_files.read_text(os.path.join(drm, card, "device", "vendor")).strip(), 16)
        except (OSError, ValueError):
            return True
        if found == vendor:
            return True
    return False


def cuda_absent() -> str | None:
    """Return why CUDA is certainly unavailable here (NVML's library does not load), or ``None``.

    Side effects:
        May load ``libnvidia-ml.so.1`` (see :func:`accelplat._vendor.nvml.library_missing`).
    """
    from accelplat._vendor import nvml

    return nvml.unavailable_before_import()


def rocm_absent() -> str | None:
    """Return why ROCm is certainly unavailable here, or ``None`` when only its probe can tell.

    Side effects:
        Lists ``<sysfs>/class/drm``, reads its cards' ``vendor`` files and asks the import system
        whether ``amdsmi`` is installed (without importing it).
    """
    if _boundary.active() is not None or "amdsmi" in sys.modules or "torch" in sys.modules:
        return None
    drm = _sysfs_drm()
    cards, note = drm_cards(drm)
    if _may_hold_vendor(drm, cards, AMD_VENDOR_ID):
        return None
    import importlib.util

    try:
        if importlib.util.find_spec("amdsmi") is not None:
            return None
    except (ImportError, ValueError):
        return None
    reasons = (no_amd_gpu(drm), note, AMDSMI_NOT_INSTALLED, ROCM_TORCH_NOT_IMPORTED)
    return "; ".join(r for r in reasons if r)


def xpu_absent() -> str | None:
    """Return why XPU is certainly unavailable here, or ``None`` when only its probe can tell.

    Side effects:
        Lists ``<sysfs>/class/drm``, reads its cards' ``vendor`` files and loads the Level Zero
        loader when present (the backend would load it next).
    """
    if _boundary.active() is not None:
        return None
    drm = _sysfs_drm()
    cards, note = drm_cards(drm)
    if _may_hold_vendor(drm, cards, INTEL_VENDOR_ID):
        return None
    import ctypes

    name = level_zero_loader_name()
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return f"{note or no_intel_gpu(drm)}; {level_zero_not_found(name, exc)}"
    return None


# -- plausibility ------------------------------------------------------------------------------
# A driver that answers can still answer nonsense: a u64 counter wrapped below zero (~16 EiB),
# reserved above total, more free than there is. Every backend's figures go through
# checked_memory as the source gave them, before anything bounds them, so a clamp never hides
# an impossible one.

MAX_PLAUSIBLE_BYTES = 2**63 - 1
"""The largest byte count taken as real (8 EiB): above it, an unsigned counter has wrapped."""


def implausible(free: int, total: int, used: int, reserved: int = 0) -> str | None:
    """Return a phrase naming the first impossible figure of a reading, or ``None``.

    The rule: every figure lies in ``[0, MAX_PLAUSIBLE_BYTES]``; ``total`` (already less
    ``reserved``) is above zero; ``free`` and ``used`` are each at most ``total``.
    """
    for name, value in (("total", total), ("used", used), ("reserved", reserved)):
        why = _out_of_range(name, value)
        if why is not None:
            return why
    if total == 0:
        return "total is zero"
    if used > total:
        return "used exceeds total"
    why = _out_of_range("free", free)
    if why is not None:
        return why
    if free > total:
        return "free exceeds total"
    return None


def _out_of_range(name: str, value: int) -> str | None:
    if value < 0:
        return f"{name} is negative"
    if value > MAX_PLAUSIBLE_BYTES:
        return f"{name} is above 8 EiB (a wrapped-around unsigned counter)"
    return None


def require_plausible(
    platform: str,
    where: str,
    *,
    free: int,
    total: int,
    used: int,
    reserved: int = 0,
    source: str,
) -> None:
    """Check that these figures are possible, building nothing (pure arithmetic: hot path).

    For figures judged as read but not returned as they are (a host's own figures before a
    cgroup limit bounds them); :func:`checked_memory` checks and builds in one step.

    Args:
        platform: The platform's name, for the error.
        where: What was read, e.g. ``"cuda device 0 (GPU-…)"``, for the error.
        free: Bytes free.
        total: Bytes usable by applications (less ``reserved``).
        used: Bytes in use.
        reserved: Bytes the driver keeps for itself.
        source: ``MemoryInfo.source``.

    Raises:
        ImplausibleReadingError: When :func:`implausible` finds something impossible; the
            message names every figure and the source.
    """
    # One chained comparison on the hot path; the explanation is built only on failure.
    why = (
        None
        if 0 <= free <= total <= MAX_PLAUSIBLE_BYTES
        and 0 <= used <= total
        and 0 <= reserved <= MAX_PLAUSIBLE_BYTES
        and total > 0
        else implausible(free, total, used, reserved)
    )
    if why is not None:
        raise ImplausibleReadingError(
            platform,
            where,
            why,
            {"free": free, "total": total, "used": used, "reserved": reserved},
            source,
        )


def checked_memory(
    platform: str,
    where: str,
    *,
    free: int,
    total: int,
    used: int,
    reserved: int = 0,
    source: str,
) -> MemoryInfo:
    """Return a :class:`MemoryInfo` of these figures, after :func:`require_plausible`."""
    require_plausible(
        platform, where, free=free, total=total, used=used, reserved=reserved, source=source
    )
    return MemoryInfo(free, total, used, reserved, source)
