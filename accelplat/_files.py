"""The one reader of files that come from the operating system or a user, as untrusted input.

A hostile tree can put a FIFO where an attribute should be (a read blocks for ever), link it to
``/dev/zero`` (``MemoryError``) or write an id range of ten billion: so regular files only
(``stat``, ``open`` with ``O_NONBLOCK``, ``fstat``), bounded reads and id lists, errors naming the
path. Host files go through the current :class:`HostFiles` (a capture or a replay replaces it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
from typing import TYPE_CHECKING, Any, Literal

from accelplat.errors import ConfigurationError, FileTooLargeError, NotARegularFileError

if TYPE_CHECKING:
    from pathlib import Path  # imported when writing: it costs detection ~5 ms

PathLike = str | os.PathLike[str]
Kind = Literal["file", "dir", "other"]

ATTRIBUTE_LIMIT = 64 * 1024  # bytes of a sysfs attribute: one page (4 KiB x86, 64 KiB arm64/ppc64)
PROC_LIMIT = 16 * 1024 * 1024  # bytes of a procfs or cgroup file (1,024 CPUs' cpuinfo: ~1.5 MiB)
MAX_NUMA_NODES = 1 << 10  # the kernel's largest node count (NODES_SHIFT is at most 10)
KEPT_OPEN = frozenset({"/proc/meminfo"})  # read many times a second: kept open, as free/top do

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


class _KeptOpen:
    # Before each read fstat confirms the descriptor still names its file: a number closed and
    # reused by someone else is forgotten (never closed). A forked child opens its own (sharing
    # one would share the kernel's read position).

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
    """The four primitives every host read goes through, on the real file system."""

    def read_bytes(self, path: str, limit: int) -> bytes:
        if path in KEPT_OPEN:
            return _kept_open.read(path, limit)
        return read_live(path, limit=limit)

    def listdir(self, path: str) -> list[str]:
        """Return the names in directory ``path`` (any order); ``OSError`` if there is none."""
        return os.listdir(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def kind(self, path: str) -> Kind | None:
        """Return what ``path`` is (links followed), ``None`` if absent or a dangling link."""
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            return None
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


_current = HostFiles()


def set_host_files(files: HostFiles | None) -> HostFiles:
    """Install ``files`` (``None``: the real ones) as the reader of host files; return the old."""
    global _current
    previous, _current = _current, files or HostFiles()
    return previous


def read_bytes(path: PathLike, *, limit: int = ATTRIBUTE_LIMIT) -> bytes:
    """Return the bytes of the regular host file ``path`` (``OSError`` subtypes name it).

    Raises ``NotARegularFileError`` (never read) or ``FileTooLargeError`` (over ``limit``).
    """
    return _current.read_bytes(os.fspath(path), limit)


def read_text(path: PathLike, *, limit: int = ATTRIBUTE_LIMIT) -> str:
    """Return the text of a host file, UTF-8 with bad bytes replaced (see :func:`read_bytes`)."""
    return read_bytes(path, limit=limit).decode("utf-8", errors="replace")


def read_document(path: PathLike, *, limit: int, what: str, limit_text: str | None = None) -> bytes:
    """Read a user's file (``what``: ``"trace"``); ``ConfigurationError`` names it and why."""
    where = f"cannot read {what} {os.fspath(path)!r}"
    try:
        return read_bytes(path, limit=limit)
    except FileTooLargeError:
        bound = limit_text or f"the limit of {limit} bytes"
        raise ConfigurationError(f"{where}: larger than {bound}") from None
    except OSError as exc:
        raise ConfigurationError(f"{where}: {exc.strerror or exc}") from None


def read_live(path: PathLike, *, limit: int, follow_links: bool = True) -> bytes:
    """Read a project or user file (no part of a replayed host) as :func:`read_bytes` does.

    ``follow_links=False`` refuses a symbolic link (``ELOOP``), for directories others may write.
    """
    name = os.fspath(path)
    fd, _ = _open_regular(name, follow_links=follow_links)
    try:
        return _read_open(name, fd, limit, at_offsets=False)
    finally:
        os.close(fd)


def listdir(path: PathLike) -> list[str]:  # OSError if there is no such directory
    return _current.listdir(os.fspath(path))


def realpath(path: PathLike) -> str:
    return _current.realpath(os.fspath(path))


def exists(path: PathLike) -> bool:  # these three follow links
    return _current.kind(os.fspath(path)) is not None


def is_file(path: PathLike) -> bool:
    return _current.kind(os.fspath(path)) == "file"


def is_dir(path: PathLike) -> bool:
    return _current.kind(os.fspath(path)) == "dir"


def parse_id_list(text: str, *, limit: int, what: str = "id list") -> set[int]:
    """Parse ``0-3,8`` into ``{0, 1, 2, 3, 8}``, ids below ``limit`` (``ConfigurationError``)."""
    ids: set[int] = set()
    for part in filter(None, (raw.strip() for raw in text.split(","))):
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


def write_text_atomic(path: PathLike, text: str | bytes, *, mode: int = 0o644) -> Path:
    """Write ``text`` beside ``path``, then rename it over ``path``; return ``Path(path)``.

    A reader never sees half a file; a ``path`` that is not a regular file (a FIFO, ``/dev/null``)
    raises ``NotARegularFileError`` and is never replaced. The file gets ``mode``, whatever the
    umask.
    """
    from pathlib import Path

    target = os.fspath(path)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.stat(target).st_mode):
            raise NotARegularFileError(target, "exists and is not a regular file; not replaced")
    head, name = os.path.split(target)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return Path(target)


def parse_toml(text: str) -> dict[str, Any]:
    """Parse ``text`` as TOML with the standard library's reader (``tomli`` before Python 3.11).

    Raises:
        ValueError: Not valid TOML (``TOMLDecodeError`` is one).
        RecursionError: Nested deeper than the reader recurses.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    table: dict[str, Any] = tomllib.loads(text)
    return table
