"""The one reader of files that come from the operating system or a user.

Every sysfs attribute, procfs and cgroup file, simulated spec and timeline trace accelplat reads
goes through this module. Such files are untrusted: a fake or hostile tree can put a FIFO where
an attribute should be (a plain ``open().read()`` then blocks for ever), link an attribute to
``/dev/zero`` (an unbounded read ends in ``MemoryError``), or write an id range with ten billion
members. The rules here:

* **Regular files only.** A path is checked with ``stat`` before it is opened and with ``fstat``
  after; it is opened with ``O_NONBLOCK`` so that even a FIFO swapped in between the two checks
  cannot block. A FIFO, device, socket or directory raises
  :class:`~accelplat.errors.NotARegularFileError` naming the path. The few kernel files read many
  times a second (:data:`KEPT_OPEN`: ``/proc/meminfo``) are opened once under these checks and
  then read from their start through the kept descriptor, whose identity ``fstat`` confirms
  before each read.
* **Bounded reads.** A sysfs attribute is at most a page (:data:`ATTRIBUTE_LIMIT`); procfs and
  cgroup files are bounded by :data:`PROC_LIMIT`; bigger files (specs, traces) pass their own
  limit. A file holding more raises :class:`~accelplat.errors.FileTooLargeError`; nothing more
  than ``limit + 1`` bytes is ever read.
* **Typed errors naming the path.** Both errors above are :class:`~accelplat.errors.AccelplatError`
  *and* ``OSError``, so a backend that treats an unreadable file as "no information" keeps doing
  so, and one that reports it names the file. Failures of the system calls themselves are the
  ordinary ``OSError`` subclasses (``FileNotFoundError`` …), which name the path too.
* **Bounded id lists.** :func:`parse_id_list` reads kernel lists such as ``0-3,8`` and refuses
  ids at or above the kernel's own limit (:data:`MAX_NUMA_NODES`, :data:`MAX_CPUS`), so a
  ``Mems_allowed_list`` of ``0-30000000000`` is an error, not a giant set.

The seam (capture and replay):
    All file-system access of the backends goes through one object, the current
    :class:`HostFiles` (:func:`host_files`). Its methods — :meth:`HostFiles.read_bytes`,
    :meth:`HostFiles.listdir`, :meth:`HostFiles.realpath` and :meth:`HostFiles.kind` — are the
    only places accelplat touches a host file. The module-level functions (:func:`read_text`,
    :func:`listdir`, :func:`exists`, …) delegate to it. A recorder or a replayer is a subclass
    installed with :func:`use_host_files` (a context manager) or :func:`set_host_files`; it sees
    every read, with the limit the caller asked for, at this one point.

Nothing here imports a vendor library or creates a device context.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

from accelplat import _boundary
from accelplat.errors import ConfigurationError, FileTooLargeError, NotARegularFileError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "ATTRIBUTE_LIMIT",
    "KEPT_OPEN",
    "MAX_CPUS",
    "MAX_NUMA_NODES",
    "PROC_LIMIT",
    "HostFiles",
    "exists",
    "host_files",
    "is_dir",
    "is_file",
    "listdir",
    "parse_id_list",
    "read_bytes",
    "read_document",
    "read_live",
    "read_text",
    "realpath",
    "set_host_files",
    "use_host_files",
    "write_text_atomic",
]

PathLike = str | os.PathLike[str]
Kind = Literal["file", "dir", "other"]

ATTRIBUTE_LIMIT = 64 * 1024
"""Bytes a sysfs attribute may hold: the kernel serves at most one page (4 KiB on x86, up to
64 KiB on arm64/ppc64 kernels with large pages)."""

PROC_LIMIT = 16 * 1024 * 1024
"""Bytes a procfs or cgroup file may hold (``/proc/cpuinfo`` of a 1,024-CPU machine is ~1.5 MiB)."""

MAX_NUMA_NODES = 1 << 10
"""The kernel's largest node count (``NODES_SHIFT`` is at most 10)."""

MAX_CPUS = 1 << 13
"""The kernel's largest CPU count (``NR_CPUS`` is at most 8192)."""

_CHUNK = 64 * 1024
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)) | getattr(
    os, "O_NOCTTY", 0
)


def _describe_mode(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a regular file; not read"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file; not read"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file; not read"
    return "is not a regular file; not read"


def _open_regular(path: str, *, follow_links: bool) -> tuple[int, os.stat_result]:
    """Open the regular file ``path`` under the module's rules; return it and its ``fstat``."""
    before = os.stat(path, follow_symlinks=follow_links)
    if not stat.S_ISREG(before.st_mode):
        raise NotARegularFileError(path, _describe_mode(before.st_mode))
    try:
        fd = os.open(path, _OPEN_FLAGS | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket or a FIFO without a writer, swapped in
            raise NotARegularFileError(path, "is not a regular file; not read") from None
        raise
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode):
            raise NotARegularFileError(path, _describe_mode(after.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd, after


def _read_open(path: str, fd: int, limit: int, *, at_offsets: bool) -> bytes:
    """Read all of ``fd`` (from its start with ``pread`` when ``at_offsets``), at most ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
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
    """Read the regular file ``path`` under the module's rules (:meth:`HostFiles.read_bytes`)."""
    fd, _ = _open_regular(path, follow_links=follow_links)
    try:
        return _read_open(path, fd, limit, at_offsets=False)
    finally:
        os.close(fd)


KEPT_OPEN = frozenset({"/proc/meminfo"})
"""Kernel files read many times a second (every host memory reading, by waits, the leak check
and the timeline): read through a descriptor kept open, from offset 0 each time, as ``free``
and ``top`` read them, instead of ``stat``, ``open``, ``fstat`` and ``close`` on every read."""


class _KeptOpen:
    """Descriptors of :data:`KEPT_OPEN` files, one per file and process.

    A descriptor is checked with ``fstat`` before each read: if its number now names another
    file (closed by someone else and reused), it is forgotten, never closed, and the file is
    opened again under the module's rules. After a ``fork`` the child opens its own (the two
    processes would otherwise share one read position of the kernel's file).
    """

    __slots__ = ("_lock", "_open")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, int, int, int]] = {}  # path: pid, fd, st_dev, st_ino

    def after_fork(self) -> None:
        """Give the child a lock of its own (the parent's may have been held by another thread)."""
        self._lock = threading.Lock()

    def read(self, path: str, limit: int) -> bytes:
        """Return the contents of ``path`` (one of :data:`KEPT_OPEN`), at most ``limit`` bytes."""
        with self._lock:
            fd = self._descriptor(path)
            return _read_open(path, fd, limit, at_offsets=True)

    def _descriptor(self, path: str) -> int:
        pid = os.getpid()
        kept = self._open.pop(path, None)
        if kept is not None:
            owner, fd, dev, ino = kept
            try:
                now = os.fstat(fd)
            except OSError:
                now = None
            ours = now is not None and (now.st_dev, now.st_ino) == (dev, ino)
            if ours and owner == pid:
                self._open[path] = kept
                return fd
            if ours:
                os.close(fd)  # this process's copy of the parent's descriptor
        fd, st = _open_regular(path, follow_links=True)
        self._open[path] = (pid, fd, st.st_dev, st.st_ino)
        return fd


_kept_open = _KeptOpen()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_kept_open.after_fork)


class HostFiles:
    """Access to the host's files: the single point every read goes through.

    The default implementation reads the real file system under the rules in the module
    docstring. A capture or replay layer subclasses it and overrides the four primitives.
    """

    def read_bytes(self, path: str, limit: int) -> bytes:
        """Return the contents of the regular file ``path``, at most ``limit`` bytes.

        Args:
            path: The file.
            limit: The most bytes the file may hold.

        Returns:
            The whole contents.

        Raises:
            NotARegularFileError: ``path`` is a FIFO, device, socket or directory.
            FileTooLargeError: It holds more than ``limit`` bytes.
            OSError: It is missing or cannot be opened or read (the error names ``path``).

        Side effects:
            Opens, reads and closes the file; never blocks on a FIFO or device. A file of
            :data:`KEPT_OPEN` stays open and is read from its start each time.
        """
        if path in KEPT_OPEN:
            return _kept_open.read(path, limit)
        return _read_regular(path, limit, follow_links=True)

    def listdir(self, path: str) -> list[str]:
        """Return the names in directory ``path`` (any order).

        Raises:
            OSError: When it is missing or not a directory.
        """
        return os.listdir(path)

    def realpath(self, path: str) -> str:
        """Return ``path`` with every symbolic link resolved (``os.path.realpath``)."""
        return os.path.realpath(path)

    def kind(self, path: str) -> Kind | None:
        """Return ``"file"``, ``"dir"`` or ``"other"`` for what ``path`` is, ``None`` if absent.

        Links are followed; a dangling link is absent.
        """
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            return None
        if stat.S_ISREG(mode):
            return "file"
        if stat.S_ISDIR(mode):
            return "dir"
        return "other"


_current: HostFiles = HostFiles()


def _reader() -> HostFiles:
    """The current reader, once ``ACCELPLAT_REPLAY`` (if set) has been applied.

    A replay installs its own :class:`HostFiles`; consulting the boundary first means even a
    backend built directly, before any detection, reads the captured host's files.
    """
    _boundary.active()
    return _current


def host_files() -> HostFiles:
    """Return the :class:`HostFiles` every read goes through now."""
    return _current


def set_host_files(files: HostFiles | None) -> HostFiles:
    """Install ``files`` as the reader of host files (``None``: the real file system).

    Args:
        files: The new reader.

    Returns:
        The reader it replaces.

    Side effects:
        Process-wide: every later read of every backend goes through ``files``.
    """
    global _current
    previous = _current
    _current = files if files is not None else HostFiles()
    return previous


@contextmanager
def use_host_files(files: HostFiles) -> Iterator[HostFiles]:
    """Install ``files`` as the reader of host files within a ``with`` block.

    Args:
        files: The reader to use.

    Yields:
        ``files``.
    """
    previous = set_host_files(files)
    try:
        yield files
    finally:
        set_host_files(previous)


def read_bytes(path: PathLike, *, limit: int = ATTRIBUTE_LIMIT) -> bytes:
    """Return the bytes of the regular file ``path``, refusing more than ``limit`` bytes.

    Args:
        path: The file.
        limit: The most bytes it may hold; default one sysfs attribute (:data:`ATTRIBUTE_LIMIT`).

    Returns:
        Its contents.

    Raises:
        NotARegularFileError: A FIFO, device, socket or directory (never read).
        FileTooLargeError: More than ``limit`` bytes.
        OSError: Missing or unreadable; the error names the path.
    """
    return _reader().read_bytes(os.fspath(path), limit)


def read_document(path: PathLike, *, limit: int, what: str, limit_text: str | None = None) -> bytes:
    """Read a file a user names (a simulated spec, a timeline trace) for a command or a test.

    As :func:`read_bytes`, with every failure turned into the error a user sees for bad input.

    Args:
        path: The file.
        limit: The most bytes it may hold.
        what: What the file is, for the message (``"trace"``, ``"simulated spec"``).
        limit_text: The limit as the document's documentation states it (``"1 MiB"``);
            by default ``"the limit of <limit> bytes"``.

    Returns:
        Its contents.

    Raises:
        ConfigurationError: Worded ``"cannot read <what> '<path>': <why>"``, for a file that is
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
    """Read a project or user file (a capability table, a test file, lease metadata).

    Such a file belongs to this machine's project, not to the host a replay stands in for: it is
    read from the live file system, never through the current :class:`HostFiles`, under the
    same rules (regular files only, at most ``limit`` bytes, never blocking on a FIFO).

    Args:
        path: The file.
        limit: The most bytes it may hold.
        follow_links: ``False`` refuses a symbolic link (``ELOOP``), for files in directories
            that other users may write.

    Returns:
        Its contents.

    Raises:
        NotARegularFileError: A FIFO, device, socket or directory (never read).
        FileTooLargeError: More than ``limit`` bytes.
        OSError: Missing, unreadable or (``follow_links=False``) a link; the error names it.
    """
    return _read_regular(os.fspath(path), limit, follow_links=follow_links)


def read_text(path: PathLike, *, limit: int = ATTRIBUTE_LIMIT) -> str:
    """Return the text of the regular file ``path``, decoded as UTF-8 (bad bytes replaced).

    Args:
        path: The file.
        limit: The most bytes it may hold; default one sysfs attribute.

    Returns:
        Its text.

    Raises:
        NotARegularFileError: A FIFO, device, socket or directory.
        FileTooLargeError: More than ``limit`` bytes.
        OSError: Missing or unreadable.
    """
    return read_bytes(path, limit=limit).decode("utf-8", errors="replace")


def listdir(path: PathLike) -> list[str]:
    """Return the names in the directory ``path``.

    Raises:
        OSError: When it is missing, unreadable or not a directory.
    """
    return _reader().listdir(os.fspath(path))


def realpath(path: PathLike) -> str:
    """Return ``path`` with its symbolic links resolved."""
    return _reader().realpath(os.fspath(path))


def exists(path: PathLike) -> bool:
    """Return whether ``path`` exists (following links)."""
    return _reader().kind(os.fspath(path)) is not None


def is_file(path: PathLike) -> bool:
    """Return whether ``path`` is a regular file (following links)."""
    return _reader().kind(os.fspath(path)) == "file"


def is_dir(path: PathLike) -> bool:
    """Return whether ``path`` is a directory (following links)."""
    return _reader().kind(os.fspath(path)) == "dir"


def parse_id_list(text: str, *, limit: int, what: str = "id list") -> set[int]:
    """Parse a kernel id list such as ``0-3,8`` into ``{0, 1, 2, 3, 8}``.

    Args:
        text: The list (``Mems_allowed_list``, ``cpulist`` …); blanks around items are ignored.
        limit: Ids must be below this (:data:`MAX_NUMA_NODES`, :data:`MAX_CPUS`), so the set
            never holds more than ``limit`` members.
        what: What the list is, for the message.

    Returns:
        The ids.

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

    A reader never sees a half-written file; on any failure the temporary file is removed and
    ``path`` is left as it was. The file gets the permissions of any newly created file (the
    umask applies).

    Args:
        path: The file to create or replace.
        text: Its new contents.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: When the directory is not writable or the disk is full.
    """
    from pathlib import Path  # only writers need it: readers stay free of pathlib

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
