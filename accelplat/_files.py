"""The one reader of files that come from the operating system or a user.

Every sysfs, procfs and cgroup file, simulated spec and timeline trace is read here, as untrusted
input: a hostile tree can put a FIFO where an attribute should be (a plain read blocks for ever),
link it to ``/dev/zero`` (an unbounded read ends in ``MemoryError``), or write an id range with
ten billion members. So: regular files only (``stat``, then ``open`` with ``O_NONBLOCK``, then
``fstat``), reads bounded by a limit, id lists bounded by the kernel's own limits, and errors
(:class:`~accelplat.errors.NotARegularFileError`, :class:`~accelplat.errors.FileTooLargeError`,
both also ``OSError``) that name the path.

Host files go through the current :class:`HostFiles`, which a capture or a replay replaces
(:func:`set_host_files`); project and user files (:func:`read_live`) never do.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from accelplat.errors import ConfigurationError, FileTooLargeError, NotARegularFileError

PathLike = str | os.PathLike[str]
Kind = Literal["file", "dir", "other"]

ATTRIBUTE_LIMIT = 64 * 1024
"""Bytes a sysfs attribute may hold: one page (4 KiB on x86, up to 64 KiB on arm64/ppc64)."""

PROC_LIMIT = 16 * 1024 * 1024
"""Bytes a procfs or cgroup file may hold (``/proc/cpuinfo`` of 1,024 CPUs is ~1.5 MiB)."""

MAX_NUMA_NODES = 1 << 10
"""The kernel's largest node count (``NODES_SHIFT`` is at most 10)."""

MAX_CPUS = 1 << 13
"""The kernel's largest CPU count (``NR_CPUS`` is at most 8192)."""

KEPT_OPEN = frozenset({"/proc/meminfo"})
"""Files read many times a second (every host memory reading): read through a descriptor kept
open, from offset 0 each time, as ``free`` and ``top`` do."""

_CHUNK = 64 * 1024
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_FLAGS |= getattr(os, "O_NOCTTY", 0)


def _not_regular(path: str, mode: int) -> NotARegularFileError:
    if stat.S_ISDIR(mode):
        return NotARegularFileError(path, "is a directory, not a file")
    if stat.S_ISFIFO(mode):
        return NotARegularFileError(path, "is a FIFO, not a regular file; not read")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return NotARegularFileError(path, "is a device, not a regular file; not read")
    if stat.S_ISSOCK(mode):
        return NotARegularFileError(path, "is a socket, not a regular file; not read")
    return NotARegularFileError(path, "is not a regular file; not read")


def _open_regular(path: str, *, follow_links: bool) -> tuple[int, os.stat_result]:
    """Open the regular file ``path``; return the descriptor and its ``fstat``."""
    before = os.stat(path, follow_symlinks=follow_links)
    if not stat.S_ISREG(before.st_mode):
        raise _not_regular(path, before.st_mode)
    try:
        fd = os.open(path, _FLAGS | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO without a writer, swapped in
            raise NotARegularFileError(path, "is not a regular file; not read") from None
        raise
    try:
        after = os.fstat(fd)  # what was opened, not what stat saw: a swap in between is caught
        if not stat.S_ISREG(after.st_mode):
            raise _not_regular(path, after.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, after


def _read_open(path: str, fd: int, limit: int, *, at_offsets: bool) -> bytes:
    """Read all of ``fd`` (from its start with ``pread`` when ``at_offsets``), at most ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:  # never more than limit + 1 bytes
        want = min(_CHUNK, limit + 1 - size)
        chunk = os.pread(fd, want, size) if at_offsets else os.read(fd, want)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise FileTooLargeError(path, limit)
    return b"".join(chunks)


def _read_regular(path: str, limit: int, *, follow_links: bool) -> bytes:
    fd, _ = _open_regular(path, follow_links=follow_links)
    try:
        return _read_open(path, fd, limit, at_offsets=False)
    finally:
        os.close(fd)


class _KeptOpen:
    """The descriptors of :data:`KEPT_OPEN` files, one per file and process.

    Before each read ``fstat`` confirms the descriptor still names the file it was opened for: a
    number closed and reused by someone else is forgotten (never closed) and the file opened
    again. A forked child opens its own (sharing one would share the kernel's read position).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, int, int, int]] = {}  # path: pid, fd, st_dev, st_ino

    def after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread

    def read(self, path: str, limit: int) -> bytes:
        with self._lock:
            return _read_open(path, self._descriptor(path), limit, at_offsets=True)

    def _descriptor(self, path: str) -> int:
        kept = self._open.pop(path, None)
        if kept is not None:
            owner, fd, dev, ino = kept
            try:
                now = os.fstat(fd)
                ours = (now.st_dev, now.st_ino) == (dev, ino)
            except OSError:
                ours = False
            if ours and owner == os.getpid():
                self._open[path] = kept
                return fd
            if ours:
                os.close(fd)  # this process's copy of the parent's descriptor
        fd, st = _open_regular(path, follow_links=True)
        self._open[path] = (os.getpid(), fd, st.st_dev, st.st_ino)
        return fd


_kept_open = _KeptOpen()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_kept_open.after_fork)


class HostFiles:
    """The host's files: the four primitives every host read goes through.

    This one reads the real file system; a capture or a replay subclasses it.
    """

    def read_bytes(self, path: str, limit: int) -> bytes:
        """Return the contents of the regular file ``path`` (see :func:`read_bytes`)."""
        if path in KEPT_OPEN:
            return _kept_open.read(path, limit)
        return _read_regular(path, limit, follow_links=True)

    def listdir(self, path: str) -> list[str]:
        """Return the names in directory ``path`` (any order); ``OSError`` if there is none."""
        return os.listdir(path)

    def realpath(self, path: str) -> str:
        """Return ``path`` with every symbolic link resolved."""
        return os.path.realpath(path)

    def kind(self, path: str) -> Kind | None:
        """Return what ``path`` is (links followed), ``None`` if absent or a dangling link."""
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            return None
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


_current = HostFiles()


def host_files() -> HostFiles:
    """Return the :class:`HostFiles` every host read goes through now."""
    return _current


def set_host_files(files: HostFiles | None) -> HostFiles:
    """Install ``files`` as the process's reader of host files (``None``: the real ones).

    Returns:
        The reader it replaces.
    """
    global _current
    previous, _current = _current, files or HostFiles()
    return previous


@contextmanager
def use_host_files(files: HostFiles) -> Iterator[HostFiles]:
    """Install ``files`` as the reader of host files within a ``with`` block."""
    previous = set_host_files(files)
    try:
        yield files
    finally:
        set_host_files(previous)


def read_bytes(path: PathLike, *, limit: int = ATTRIBUTE_LIMIT) -> bytes:
    """Return the bytes of the regular host file ``path``.

    Args:
        path: The file.
        limit: The most bytes it may hold; by default one sysfs attribute.

    Raises:
        NotARegularFileError: A FIFO, device, socket or directory (never read).
        FileTooLargeError: More than ``limit`` bytes.
        OSError: Missing or unreadable; the error names the path.
    """
    return _current.read_bytes(os.fspath(path), limit)


def read_text(path: PathLike, *, limit: int = ATTRIBUTE_LIMIT) -> str:
    """Return the text of a host file, UTF-8 with bad bytes replaced (see :func:`read_bytes`)."""
    return read_bytes(path, limit=limit).decode("utf-8", errors="replace")


def read_document(path: PathLike, *, limit: int, what: str, limit_text: str | None = None) -> bytes:
    """Read a file a user names (a simulated spec, a timeline trace), as :func:`read_bytes`.

    Args:
        path: The file.
        limit: The most bytes it may hold.
        what: What the file is, for the message (``"trace"``).
        limit_text: The limit as the documentation states it (``"1 MiB"``).

    Raises:
        ConfigurationError: ``"cannot read <what> '<path>': <why>"`` for a file that is
            missing, unreadable, not a regular file, or larger than ``limit``.
    """
    where = f"cannot read {what} {os.fspath(path)!r}"
    try:
        return read_bytes(path, limit=limit)
    except FileTooLargeError:
        bound = limit_text or f"the limit of {limit} bytes"
        raise ConfigurationError(f"{where}: larger than {bound}") from None
    except OSError as exc:
        raise ConfigurationError(f"{where}: {exc.strerror or exc}") from None


def read_live(path: PathLike, *, limit: int, follow_links: bool = True) -> bytes:
    """Read a project or user file (a capability table, lease metadata) from this machine.

    Such a file is not part of the host a replay stands in for, so it never goes through the
    current :class:`HostFiles`; the rules are the same.

    Args:
        path: The file.
        limit: The most bytes it may hold.
        follow_links: ``False`` refuses a symbolic link (``ELOOP``), for directories that other
            users may write.

    Raises:
        NotARegularFileError: A FIFO, device, socket or directory (never read).
        FileTooLargeError: More than ``limit`` bytes.
        OSError: Missing, unreadable or a refused link; the error names it.
    """
    return _read_regular(os.fspath(path), limit, follow_links=follow_links)


def listdir(path: PathLike) -> list[str]:
    """Return the names in the host directory ``path``; ``OSError`` if there is none."""
    return _current.listdir(os.fspath(path))


def realpath(path: PathLike) -> str:
    """Return the host path ``path`` with its symbolic links resolved."""
    return _current.realpath(os.fspath(path))


def exists(path: PathLike) -> bool:
    """Return whether the host path ``path`` exists (following links)."""
    return _current.kind(os.fspath(path)) is not None


def is_file(path: PathLike) -> bool:
    """Return whether the host path ``path`` is a regular file (following links)."""
    return _current.kind(os.fspath(path)) == "file"


def is_dir(path: PathLike) -> bool:
    """Return whether the host path ``path`` is a directory (following links)."""
    return _current.kind(os.fspath(path)) == "dir"


def parse_id_list(text: str, *, limit: int, what: str = "id list") -> set[int]:
    """Parse a kernel id list such as ``0-3,8`` into ``{0, 1, 2, 3, 8}``.

    Args:
        text: The list (``Mems_allowed_list``, ``cpulist`` …); blanks around items are ignored.
        limit: Ids must be below this (:data:`MAX_NUMA_NODES`, :data:`MAX_CPUS`).
        what: What the list is, for the message.

    Raises:
        ConfigurationError: For a malformed item, a reversed range or an id at or above
            ``limit``; the message names ``what`` and the item.
    """
    ids: set[int] = set()
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            start = _id(lo, limit)
            end = _id(hi, limit) if sep else start
        except ValueError as exc:
            raise ConfigurationError(f"{what}: item {part[:40]!r}: {exc}") from None
        if end < start:
            raise ConfigurationError(f"{what}: item {part[:40]!r} is a reversed range")
        ids.update(range(start, end + 1))
    return ids


def _id(text: str, limit: int) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 12:
        raise ValueError("not a small non-negative decimal integer")
    value = int(digits)
    if value >= limit:
        raise ValueError(f"{value} is not below the kernel's limit of {limit}")
    return value


def write_text_atomic(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to a new file beside ``path``, then rename it over ``path``.

    A reader never sees a half-written file; on failure ``path`` is left as it was. The new
    file's permissions follow the umask.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: When the directory is not writable or the disk is full.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
