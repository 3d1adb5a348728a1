"""The lock directory: its rules, ``flock(2)`` locks on its files, and the holder document.

Every lease file lives there: a lock per device identity (``<key>.lock``) beside its holder
document (``<key>.json``), share slots (``shares/``) and queue tickets (``queue/``). Files are
made with an explicit mode whatever the umask (others lock and read them in a shared directory),
links are never followed, and what is read back is untrusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelplat import _files, _validate
from accelplat._platform import Platform
from accelplat._types import DeviceInfo, MemoryInfo
from accelplat._util import clip
from accelplat._vendor.procs import process_details
from accelplat.errors import ConfigurationError

ENV_LEASE_DIR = "ACCELPLAT_LEASE_DIR"  # a (possibly shared) lock directory instead of the default
LOCK, DOC = ".lock", ".json"
FILE_MODE = 0o644  # others open a lock read-only to flock it, and read the holder documents
MAX_DOCUMENT_BYTES = 64 * 1024  # a bigger holder document is ignored
MAX_BYTES = 2**63 - 1  # the largest byte count a document, variable or argument may carry
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_COMMAND_LIMIT = 1024
_PID_MAX = 2**22  # Linux's largest pid_max
_LAST_SECOND = 253_402_300_799.0  # 9999-12-31 23:59:59 UTC: later times overflow localtime()


def default_lease_dir() -> Path:
    """``$ACCELPLAT_LEASE_DIR``, else ``$XDG_RUNTIME_DIR/accelplat/leases``, else a temp one."""
    if configured := os.environ.get(ENV_LEASE_DIR, "").strip():
        return Path(configured)
    if (runtime := os.environ.get("XDG_RUNTIME_DIR", "").strip()) and os.path.isdir(runtime):
        return Path(runtime) / "accelplat" / "leases"
    return Path(tempfile.gettempdir()) / f"accelplat-{os.getuid()}" / "leases"


def prepare_dir(lock_dir: str | os.PathLike[str] | None) -> Path:
    """Create (if needed) and check the lock directory; raise ConfigurationError naming it."""
    if lock_dir is not None and not isinstance(lock_dir, (str, os.PathLike)):
        raise ConfigurationError(f"lock_dir must be a path or None, got {lock_dir!r}")
    if lock_dir is not None and not os.fspath(lock_dir):
        raise ConfigurationError("the lock directory must not be empty (it means the working one)")
    path = Path(lock_dir) if lock_dir is not None else default_lease_dir()
    if lock_dir is None and not os.environ.get(ENV_LEASE_DIR, "").strip():
        # a given directory may be shared; the per-user default must be private: another user
        # who made it first could read the holders' command lines, hold the locks, plant links
        directory(path.parent, 0o700, private=True)
        return directory(path, 0o700, private=True)
    return directory(path, 0o700, follow=True)


def directory(path: Path, mode: int | None, *, private: bool = False, follow: bool = False) -> Path:
    """``path``, made with ``mode`` (``None``: its parent's) if missing, whatever the umask.

    Refused (ConfigurationError naming it) unless a directory this user can write: not a link
    unless ``follow``; when ``private``, this user's and writable by no one else.
    """
    try:
        mode = stat.S_IMODE(os.stat(path.parent).st_mode) if mode is None else mode
        if follow:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
            os.chmod(path, mode)  # the umask took bits off
        info = os.stat(path, follow_symlinks=follow)
    except OSError as exc:
        raise ConfigurationError(
            f"lease lock directory {path} cannot be created: {exc.strerror or exc}"
        ) from None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif private and info.st_uid != os.geteuid():
        problem = f"is owned by uid {info.st_uid}, not this user ({os.geteuid()})"
    elif private and info.st_mode & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    elif not os.access(path, os.W_OK | os.X_OK):
        problem = "is not writable by this user"
    else:
        return path
    remedy = f"{'remove it, or ' if private else ''}set {ENV_LEASE_DIR} (or lock_dir) to another"
    raise ConfigurationError(f"lease lock directory {path} {problem}: {remedy}")


def platform_tag(platform: Platform) -> str:
    """The platform's name as the queue's file names carry it."""
    return _SAFE.sub("_", platform.name)[:64] or "_"


def device_key(platform: str, device: DeviceInfo, seen: dict[str, int]) -> str:
    """File-name-safe identity of ``device`` (stable id, else physical index)."""
    raw = f"{platform}.{device.stable_id or f'physical-{device.physical_index}'}"
    count = seen.get(raw, 0)
    seen[raw] = count + 1
    if count:  # several visible devices share one identity (tiles of one card)
        raw = f"{raw}#{count}"
    safe = _SAFE.sub("_", raw)[:120]
    if safe != raw:  # keep distinct identities distinct after the substitution
        safe += "-" + hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return safe


@dataclass(frozen=True)
class Unit:
    """One thing a lease can hold: a visible device, or a platform's lease unit (a MIG slice)."""

    device: DeviceInfo  # as the process given it sees it (a unit's: index 0 of its view)
    key: str  # the lock files' name
    view: Platform  # reads its memory: the platform, or the unit's restricted view
    value: str | None  # a lease unit's visible-devices value; None: a visible device
    label: str  # how messages name it

    def memory(self) -> MemoryInfo:
        """Its memory, read now."""
        return self.view.memory_info(self.device.index)


def create(path: Path, flags: int) -> int:
    """Open ``path`` (never through a link), made with :data:`FILE_MODE` whatever the umask."""
    fd = os.open(path, flags | os.O_CLOEXEC | _NOFOLLOW, FILE_MODE)
    info = os.fstat(fd)
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != FILE_MODE:
        with contextlib.suppress(OSError):
            os.fchmod(fd, FILE_MODE)  # the umask took bits off (or an older version made it)
    return fd


def open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` (made if missing); OSError for what cannot be one."""
    try:  # O_NONBLOCK: a planted FIFO never blocks
        fd = create(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
    except PermissionError:  # another user's lock file in a shared directory: flock needs no write
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | _NOFOLLOW)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def try_lock(path: Path, *, shared: bool = False) -> int | None:
    """A descriptor holding the lock, or ``None`` when held; OSError for what cannot be a lock.

    Never blocks: a waiter tries again in its poll loop, up to its deadline.
    """
    fd = open_lock(path)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the last descriptor drops the flock


def held(path: Path) -> bool | None:
    """Whether some process holds ``path``'s lock; ``None`` when it cannot be told (no access).

    What is no lock at all (a directory, a link, a FIFO, nothing) reads as not held.
    """
    try:
        fd = try_lock(path, shared=True)
    except PermissionError:
        return None
    except OSError:
        return False
    if fd is not None:
        unlock(fd)
    return fd is None


def lock_holder(path: Path) -> str:
    """Name the process holding a ``flock`` on ``path``, as ``/proc/locks`` lists it (Linux)."""
    try:
        info = os.stat(path, follow_symlinks=False)
        text = _files.read_live("/proc/locks", limit=_files.PROC_LIMIT).decode("ascii", "replace")
    except OSError:
        return "another process"
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for fields in map(str.split, text.splitlines()):
        # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:5678 0 EOF"; a blocked waiter's line has "->"
        if fields[1:2] == ["FLOCK"] and fields[5:6] == [inode] and fields[4].isdigit():
            user, argv = process_details(int(fields[4]))
            return f"pid {fields[4]} ({user or '?'}): {clip(' '.join(argv), 80) or '?'}"
    return "another process"


@dataclass(frozen=True)
class LeaseRecord:
    """A holder document as read back: who holds a device (or held it last), or waits for one.

    One format for every lease file that says something: a device lock's, a memory share's slot
    and a queue ticket (docs/leasing.md). Untrusted; ``None`` fields: unknown or out of range.
    """

    device_id: str = ""  # the stable device identity the lock file is named after
    held: bool = False  # some process holds the lock now (memory shares hold their device's)
    pid: int | None = None  # of the last holder
    command: str = ""  # that holder's command line, or ""
    since: float | None = None  # when it was handed out (or queued), seconds since 1970
    released: bool = False  # the last holder let go itself (False and not held: it died holding it)
    platform: str = ""  # recorded by the holder
    baseline_used_bytes: int | None = None  # used memory of the device when it was handed out
    path: str = ""  # the lock file
    budget_bytes: int | None = None  # a memory share's budget; None: the whole device
    user: str = ""  # the holder's user (the document's owner), or ""


def describe(record: LeaseRecord) -> str:
    """``pid 42 (alice, since 2026-12-08 10:00:00): python serve.py``."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.since)) if record.since else "?"
    who = f"pid {record.pid}" if record.pid is not None else "a process"
    return f"{who} ({record.user or '?'}, since {when}): {clip(record.command or '?', 80)}"


def read_holder(path: Path) -> LeaseRecord:
    """Read a holder document (untrusted: maybe another user's); anything odd reads as empty."""
    try:
        data = json.loads(_files.read_live(path, limit=MAX_DOCUMENT_BYTES, follow_links=False))
        uid = os.lstat(path).st_uid
    except (OSError, ValueError, RecursionError):
        return LeaseRecord()  # missing, a link, not a regular file, too large, not UTF-8 JSON
    if not isinstance(data, dict):
        return LeaseRecord()

    def number(key: str, maximum: float = MAX_BYTES, kind: Any = _validate.integer) -> Any:
        with contextlib.suppress(ConfigurationError):  # None when missing or out of range
            return kind(data.get(key), key, minimum=0, maximum=maximum)
        return None

    def text(key: str) -> str:
        value = data[key][:_COMMAND_LIMIT] if isinstance(data.get(key), str) else ""
        return "".join(c if c.isprintable() else "?" for c in value)

    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid {uid}"
    return LeaseRecord(
        pid=number("pid", _PID_MAX) or None,
        command=text("command"),
        since=number("since", _LAST_SECOND, _validate.number),
        released=data.get("released") is True,
        platform=text("platform"),
        baseline_used_bytes=number("baseline_used_bytes"),
        budget_bytes=number("budget_bytes"),
        user=user,
    )


def holder_document(platform: str, **fields: object) -> dict[str, object]:
    """This process's holder document (docs/leasing.md), with ``fields`` added."""
    command = clip(" ".join(process_details(os.getpid())[1]), _COMMAND_LIMIT)  # live, bounded
    doc = {"version": 1, "platform": platform, "pid": os.getpid(), "command": command}
    return {**doc, "since": time.time(), "released": False, **fields}


def write_holder(path: Path, doc: dict[str, object]) -> None:
    """Replace a holder document atomically; failures are ignored (documents are advisory)."""
    with contextlib.suppress(OSError):  # a directory or FIFO in its place is never replaced
        _files.write_text_atomic(path, json.dumps(doc), mode=FILE_MODE)
