"""Helpers the built-in backends share: sysfs attributes, ``/proc`` tables and PCI addresses.

Each parser here existed in two or three backends before; now there is one. All file access goes
through :mod:`accelplat._files` (regular files only, bounded reads), so a FIFO or a ``/dev/zero``
link in a sysfs or procfs tree is an error naming the path, never a hang.

Nothing here imports a vendor library or creates a device context.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from accelplat import _files
from accelplat.errors import BackendError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "ENV_PROC_ROOT",
    "ReadText",
    "SysfsReader",
    "host_meminfo",
    "parse_kb_table",
    "parse_key_values",
    "pci_address",
    "pci_sort_key",
    "read_attribute",
]

ENV_PROC_ROOT = "ACCELPLAT_PROC_ROOT"
"""Variable that moves ``/proc`` (tests, chroots)."""

_KIB = 1024
_U64_MAX = 2**64 - 1
_U64_DIGITS = len(str(_U64_MAX))
_BDF = r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"
"""A PCI address, ``domain:bus:device.function``; compiled (and cached by ``re``) on first use."""
_UNKNOWN_PCI = (1 << 32,)

ReadText = Callable[[str], str]
"""How a backend reads one sysfs attribute's text (injectable for tests)."""


def read_attribute(path: str) -> str:
    """Return the text of one sysfs attribute (at most a page, regular files only).

    Args:
        path: The attribute file.

    Returns:
        Its text, undecodable bytes replaced.

    Raises:
        OSError: Missing, unreadable, not a regular file, or more than a page (the last two
            as :class:`~accelplat.errors.UnreadableFileError`); the error names the path.
    """
    return _files.read_text(path, limit=_files.ATTRIBUTE_LIMIT)


class SysfsReader:
    """Reads sysfs attribute files, turning every failure into a ``BackendError`` naming the file.

    Args:
        platform: The backend's platform name, for the errors.
        read_text: How to read a file's text (injectable for tests); default
            :func:`read_attribute`.
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
            raise BackendError(
                self._platform, f"{name} is missing (was the GPU removed?)"
            ) from None
        except PermissionError:
            raise BackendError(self._platform, f"{name}: permission denied") from None
        except IsADirectoryError:
            raise BackendError(
                self._platform, f"{name} is a directory, not an attribute file"
            ) from None
        except OSError as exc:
            raise BackendError(
                self._platform, f"cannot read {name}: {exc.strerror or exc}"
            ) from None

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
        keys: Only these keys (names without a colon) are wanted; other lines are passed over
            without being split, which makes a polled reading several times cheaper.

    Returns:
        Key to bytes; lines that do not parse, and negative values, are left out. A number of
        more than 20 digits (beyond any 64-bit counter) saturates at ``2**64 - 1``, as the
        kernel's ``strtoull`` would read it, so the plausibility rule refuses it by name instead
        of ``int()`` failing on thousands of digits.
    """
    table: dict[str, int] = {}
    # Without leading words to skip, a wanted line starts with its key and a colon: one C-level
    # test a line passes over the rest (a polled /proc/meminfo has ~55 lines, 5 wanted).
    prefixes = _line_prefixes(keys) if keys is not None and skip == 0 else None
    for line in text.splitlines():
        if prefixes is not None:
            if not line.lstrip().startswith(prefixes):
                continue
        elif keys is not None:
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


def _line_prefixes(keys: frozenset[str]) -> tuple[str, ...]:
    """``"Key:"`` for each wanted key, built once per key set (it is asked on every poll)."""
    prefixes = _PREFIXES.get(keys)
    if prefixes is None:
        prefixes = _PREFIXES[keys] = tuple(f"{k}:" for k in keys)
    return prefixes


_PREFIXES: dict[frozenset[str], tuple[str, ...]] = {}


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
    out: dict[str, int] = {}
    for key, value in table.items():
        digits = value[1:] if value[:1] == "-" else value
        if digits.isascii() and digits.isdigit():
            out[key] = int(value)
    return out


class HostMemInfo:
    """``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``, in bytes.

    Attributes:
        total: ``MemTotal``.
        available: ``MemAvailable``, or (kernels before 3.14) ``MemFree + Buffers + Cached``.
        path: The file read.
    """

    __slots__ = ("available", "path", "total")

    def __init__(self, *, total: int, available: int, path: str) -> None:
        self.total = total
        self.available = available
        self.path = path


_MEMINFO_KEYS = frozenset({"MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached"})
"""The ``/proc/meminfo`` lines :func:`host_meminfo` reads."""


def proc_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return where ``/proc`` is: ``explicit``, else ``ACCELPLAT_PROC_ROOT``, else ``/proc``."""
    from pathlib import Path  # the CPU backend's queries use the text form and skip pathlib

    return Path(_proc_root_text(explicit))


def _proc_root_text(explicit: str | os.PathLike[str] | None) -> str:
    return os.fspath(explicit) if explicit else os.environ.get(ENV_PROC_ROOT) or "/proc"


def host_meminfo(root: str | os.PathLike[str] | None = None) -> HostMemInfo | None:
    """Read ``MemTotal``/``MemAvailable`` from ``<proc root>/meminfo``.

    Args:
        root: The ``/proc`` root; default :func:`proc_root`.

    Returns:
        The figures, or ``None`` when the file has no positive ``MemTotal``.

    Raises:
        OSError: When the file cannot be read (missing, not a regular file, too large); the
            error names the path.
    """
    # A string path, not a Path: this runs on every CPU memory query (pytest's leak check and
    # timeline read several times per test).
    path = os.path.join(_proc_root_text(root), "meminfo")
    table = parse_kb_table(_files.read_text(path, limit=_files.PROC_LIMIT), keys=_MEMINFO_KEYS)
    total = table.get("MemTotal", 0)
    if total <= 0:
        return None
    available = table.get("MemAvailable")
    if available is None:  # kernels before 3.14
        available = table.get("MemFree", 0) + table.get("Buffers", 0) + table.get("Cached", 0)
    return HostMemInfo(total=total, available=available, path=path)


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
