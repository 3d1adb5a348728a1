"""Device leases: a ``flock(2)`` per device identity, all or nothing, memory back first.

A lease is a whole device (the device's lock held exclusively) or a share of its memory (the
device's lock held shared, plus one share slot whose metadata carries the budget). Waiters queue
as ticket files, each locked by its waiter, so the oldest is served first (docs/leasing.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from accelplat import _files, _validate
from accelplat._memory import wait_for_memory_to_clear
from accelplat._owners import default_clock
from accelplat._platform import Platform, subset_environment
from accelplat._types import MIB, DeviceInfo, MemoryInfo
from accelplat._util import Clock, format_bytes, shown
from accelplat.errors import ConfigurationError, LeaseTimeoutError, MemoryNotSettledError

ENV_LEASE_DIR = "ACCELPLAT_LEASE_DIR"  # a (possibly shared) lock directory instead of the default
# set in a memory share's environment: its budget per device, and that budget as a fraction of
# the smallest leased device's total (for torch.cuda.set_per_process_memory_fraction)
ENV_MEMORY_BYTES = "ACCELPLAT_LEASE_MEMORY_BYTES"
ENV_MEMORY_FRACTION = "ACCELPLAT_LEASE_MEMORY_FRACTION"
MAX_SHARES = 64  # share slots per device and user
MIN_SHARE_BYTES = MIB  # a smaller int budget is a unit mistake (12 meant 12 GiB)
DEFAULT_TIMEOUT_S = 600.0
RETURN_TOLERANCE_BYTES = 256 * MIB  # above the last hand-out figure, still "memory is back"
MAX_METADATA_BYTES = 64 * 1024  # a bigger metadata file is ignored

_LOCK_SUFFIX = ".lock"
_META_SUFFIX = ".json"
_SHARES_DIR, _QUEUE_DIR = "shares", "queue"
_TICKET = re.compile(
    r"([A-Za-z0-9_.-]{1,64})~([0-9]{1,20})~([0-9]{1,7})~([0-9]{1,9})~([0-9]{1,20}|all)~([0-9]{1,6})\.ticket"
)
_MAX_TICKETS = 4096  # queue entries read per look; more are ignored
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_COMMAND_LIMIT = 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_POLL_FIRST_S, _POLL_MAX_S = 0.005, 0.05  # lock attempts: 5 ms, growing 1.5x to 50 ms
_PID_MAX = 2**22  # Linux's largest pid_max
_LAST_SECOND = 253_402_300_799.0  # 9999-12-31 23:59:59 UTC: later times overflow localtime()


@dataclass(frozen=True)
class LeaseRecord:
    """What a lock directory says about one device; ``None`` fields: unknown or out of range."""

    device_id: str  # the stable device identity the lock file is named after
    held: bool  # some process holds the lock now
    pid: int | None  # of the last holder
    command: str  # that holder's command line, or ""
    since: float | None  # when it was handed out, seconds since 1970
    released: bool  # the last holder let go itself (False and not held: it died holding it)
    platform: str  # recorded by the holder
    baseline_used_bytes: int | None  # used memory of the device when it was handed out
    path: str  # the lock file
    budget_bytes: int | None = None  # a memory share's budget; None: the whole device


def default_lease_dir() -> Path:
    """``$ACCELPLAT_LEASE_DIR``, else ``$XDG_RUNTIME_DIR/accelplat/leases``, else a temp one."""
    if configured := os.environ.get(ENV_LEASE_DIR, "").strip():
        return Path(configured)
    if (runtime := os.environ.get("XDG_RUNTIME_DIR", "").strip()) and os.path.isdir(runtime):
        return Path(runtime) / "accelplat" / "leases"
    return Path(tempfile.gettempdir()) / f"accelplat-{os.getuid()}" / "leases"


def _prepare_dir(lock_dir: str | os.PathLike[str] | None) -> Path:
    """Create (if needed) and check the lock directory; raise ConfigurationError naming it."""
    if lock_dir is not None and not isinstance(lock_dir, (str, os.PathLike)):
        raise ConfigurationError(f"lock_dir must be a path or None, got {lock_dir!r}")
    if lock_dir is not None and not os.fspath(lock_dir):
        raise ConfigurationError("the lock directory must not be empty (it means the working one)")
    path = Path(lock_dir) if lock_dir is not None else default_lease_dir()
    if lock_dir is None and not os.environ.get(ENV_LEASE_DIR, "").strip():
        # a given directory may be shared; the per-user default must be private: another user
        # who made it first could read the holders' command lines, hold the locks, plant links
        _private_dir(path.parent)
        _private_dir(path)
        return path
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        raise ConfigurationError(
            f"lease lock directory {path} cannot be created: {exc.strerror or exc}"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"lease lock directory {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"lease lock directory {path} is not writable by this user; set {ENV_LEASE_DIR} "
            "or pass lock_dir to use another"
        )
    return path


def _private_dir(path: Path) -> None:
    """Create ``path`` 0700, or refuse one that is a link, another user's, or writable by others."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        info = os.lstat(path)
    except OSError as exc:
        raise ConfigurationError(
            f"lease lock directory {path} cannot be created: {exc.strerror or exc}"
        ) from None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif info.st_uid != os.geteuid():
        problem = f"is owned by uid {info.st_uid}, not this user ({os.geteuid()})"
    elif info.st_mode & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    else:
        return
    raise ConfigurationError(
        f"lease lock directory {path} {problem}: the per-user default must be a directory of "
        f"this user that no one else can write; remove it, or set {ENV_LEASE_DIR} to a lock "
        "directory to share"
    )


def _device_key(platform: str, device: DeviceInfo, seen: dict[str, int]) -> str:
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


def _open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` (made if missing); OSError for what cannot be one."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW  # O_NONBLOCK: a planted FIFO never blocks
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except PermissionError:  # another user's lock file in a shared directory: flock needs no write
        fd = os.open(path, os.O_RDONLY | flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _try_lock(path: Path, *, shared: bool = False) -> int | None:
    """A descriptor holding the lock, or ``None`` when held; OSError for what cannot be a lock."""
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _try_lock_blocking(path: Path) -> int:
    """A descriptor holding ``path``'s lock exclusively, waiting for it (held only briefly)."""
    try:
        fd = _open_lock(path)
    except OSError as exc:
        raise ConfigurationError(f"lease admission lock {path} cannot be opened: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        os.close(fd)
        raise ConfigurationError(f"lease admission lock {path} cannot be locked: {exc}") from None
    return fd


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the last descriptor drops the flock


def _read_metadata(path: Path) -> dict[str, object]:
    """Read a metadata file (untrusted: maybe another user's); anything odd reads as ``{}``."""
    try:
        raw = _files.read_live(path, limit=MAX_METADATA_BYTES, follow_links=False)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}  # missing, a link, not a regular file, too large, not UTF-8 JSON
    return data if isinstance(data, dict) else {}


def _int_field(data: Mapping[str, object], key: str, maximum: int = 2**63 - 1) -> int | None:
    with contextlib.suppress(ConfigurationError):
        return _validate.integer(data.get(key), key, minimum=0, maximum=maximum)
    return None


def _str_field(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    text = value[:_COMMAND_LIMIT] if isinstance(value, str) else ""
    return "".join(c if c.isprintable() else "?" for c in text)


def _write_metadata(path: Path, data: Mapping[str, object]) -> None:
    """Replace the metadata file atomically; failures are ignored (metadata is advisory)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | _NOFOLLOW
        with os.fdopen(os.open(tmp, flags, 0o644), "w", encoding="utf-8") as fh:
            json.dump(dict(data), fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _subdir(parent: Path, name: str) -> Path:
    """``parent/name``, made with ``parent``'s mode if missing; refuse a link or a non-directory."""
    path = parent / name
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, stat.S_IMODE(os.stat(parent).st_mode))
            os.chmod(path, stat.S_IMODE(os.stat(parent).st_mode))  # the umask took bits off
        info = os.lstat(path)
    except OSError as exc:
        raise ConfigurationError(
            f"lease directory {path} cannot be created: {exc.strerror or exc}"
        ) from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"lease directory {path} is not a directory (or is a link)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigurationError(f"lease directory {path} is not writable by this user")
    return path


def _held(path: Path) -> bool | None:
    """Whether some process holds ``path``'s lock; ``None`` when it cannot be told."""
    try:
        fd = _try_lock(path, shared=True)
    except OSError:
        return None
    if fd is None:
        return True
    _unlock(fd)
    return False


@dataclass(frozen=True, order=True)
class Ticket:
    """A request waiting in the queue; older ones (smaller ``order``) are served first."""

    order: tuple[int, int, int]  # time_ns of entry, pid, the pid's sequence number
    budget_bytes: int | None  # per device; None: whole devices
    count: int
    name: str = field(compare=False)

    def describe(self) -> str:
        what = "whole device(s)" if self.budget_bytes is None else format_bytes(self.budget_bytes)
        return f"pid {self.order[1]} waiting since earlier for {what} on {self.count} device(s)"


_ticket_sequence = itertools.count()


def _read_queue(queue: Path, platform: str) -> list[Ticket]:
    """The live tickets of ``platform`` in ``queue``, oldest first; dead ones are removed."""
    try:
        names = sorted(os.listdir(queue))[:_MAX_TICKETS]
    except OSError:
        return []
    tickets = []
    for name in names:
        match = _TICKET.fullmatch(name)
        if match is None or match.group(1) != platform:
            continue
        held = _held(queue / name)
        if held is False:  # its waiter died waiting: nobody will lock this name again
            with contextlib.suppress(OSError):
                os.unlink(queue / name)
            continue
        if held is None:
            continue
        raw_budget, count = match.group(5), int(match.group(6))
        budget = None if raw_budget == "all" else int(raw_budget)
        order = (int(match.group(2)), int(match.group(3)), int(match.group(4)))
        if count >= 1 and (budget is None or budget >= 1):
            tickets.append(Ticket(order, budget, count, name))
    return sorted(tickets)


def _enter_queue(queue: Path, platform: str, budget: int | None, count: int) -> tuple[Ticket, int]:
    """Take a ticket: a file locked before it appears under its name (rename keeps the lock)."""
    order = (time.time_ns(), os.getpid(), next(_ticket_sequence))
    budget_text = "all" if budget is None else str(budget)
    name = f"{platform}~{order[0]}~{order[1]}~{order[2]}~{budget_text}~{count}.ticket"
    tmp = queue / f".{name}.tmp"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | _NOFOLLOW
    fd = os.open(tmp, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, queue / name)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Ticket(order, budget, count, name), fd


def _leave_queue(queue: Path, ticket: Ticket, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(queue / ticket.name)
    _unlock(fd)


def _share_key(key: str, slot: int) -> str:
    # each user has its own slots: in a shared (sticky) directory another user's metadata file
    # could not be replaced, and its stale budget would be read for ours
    return f"{key}.{os.geteuid()}-{slot}"


_SLOT = re.compile(r"([0-9]{1,10})-([0-9]{1,6})")


def _slot_files(shares: Path, key: str) -> list[str]:
    """The names (without suffix) of every user's share slots of device ``key``."""
    try:
        names = os.listdir(shares)
    except OSError:
        return []
    prefix, out = key + ".", []
    for name in names:
        stem = name[: -len(_LOCK_SUFFIX)] if name.endswith(_LOCK_SUFFIX) else ""
        if stem.startswith(prefix) and _SLOT.fullmatch(stem[len(prefix) :]):
            out.append(stem)
    return sorted(out)[: MAX_SHARES * 64]


def _command_line() -> str:
    """This process's command line, read live and bounded."""
    try:
        raw = _files.read_live(f"/proc/{os.getpid()}/cmdline", limit=_files.PROC_LIMIT)
        command = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        command = " ".join(sys.argv)
    return command[:_COMMAND_LIMIT]


@dataclass(eq=False, repr=False)
class Lease:
    """Devices held by this process (whole, or a share of their memory), and their environment.

    Made by :func:`lease`; acquired on ``with`` entry (or :meth:`acquire`) and released on exit
    (or :meth:`release`, or when the process ends however it ends).
    """

    count: int  # devices asked for
    _: KW_ONLY
    platform: Platform
    lock_dir: Path
    min_free_bytes: int | None
    min_free_ratio: float | None
    timeout_s: float
    clock: Clock
    prefer: tuple[str, ...] = ()
    memory_bytes: int | None = None  # a share of this much memory per device; None: whole devices
    # once held: the devices (visible indices, most free memory first), the variables to apply
    # in a child (None: remove it), the identities the locks are named after, seconds waited
    devices: tuple[DeviceInfo, ...] = field(default=(), init=False)
    environ: dict[str, str | None] = field(default_factory=dict, init=False)
    device_ids: tuple[str, ...] = field(default=(), init=False)
    waited_s: float = field(default=0.0, init=False)
    _fds: list[int] = field(default_factory=list, init=False)
    _meta: list[tuple[Path, dict[str, object]]] = field(default_factory=list, init=False)
    _carried: dict[str, int] = field(default_factory=dict, init=False)
    _unusable: dict[str, str] = field(default_factory=dict, init=False)  # lock key -> why not
    _ticket: tuple[Ticket, int] | None = field(default=None, init=False)  # while waiting
    _queue: Path | None = field(default=None, init=False)  # lock_dir/queue, once made

    @property
    def held(self) -> bool:
        """Whether the devices are held now."""
        return bool(self._fds)

    @property
    def lock_fds(self) -> tuple[int, ...]:
        """Descriptors holding the locks (``pass_fds`` them to a child to hold until it exits)."""
        return tuple(self._fds)

    def child_environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return a copy of ``base`` (default ``os.environ``) with the lease's variables applied."""
        env = dict(os.environ if base is None else base)
        self.apply(env)
        return env

    def apply(self, environ: MutableMapping[str, str] | None = None) -> Callable[[], None]:
        """Apply the variables to ``environ`` (default ``os.environ``) before any runtime starts.

        Returns:
            A function that puts the previous values back.
        """
        target: MutableMapping[str, str] = os.environ if environ is None else environ
        previous = {name: target.get(name) for name in self.environ}

        def put(values: Mapping[str, str | None]) -> None:
            for name, value in values.items():
                if value is None:
                    target.pop(name, None)
                else:
                    target[name] = value

        put(self.environ)
        return lambda: put(previous)

    def acquire(self) -> Lease:
        """Wait until ``count`` visible devices (or shares of them) are free; take them.

        A whole device must be free of other leases and shares, and its memory back; a share
        needs room for its budget beside the other shares and the memory in use. The oldest
        waiting request is served first: a newer one may not take the room it waits for.

        Returns:
            ``self``, holding the devices.

        Raises:
            ConfigurationError: Fewer than ``count`` devices visible or meeting the minimums; held.
            LeaseTimeoutError: The timeout passed first; the message says what was in the way.
        """
        if self._fds:
            raise ConfigurationError("this lease is held already; release it first")
        clock, delay = self.clock, _POLL_FIRST_S
        start = clock.monotonic()
        deadline = start + self.timeout_s
        try:
            while True:
                reason = self._attempt(self._candidates(), deadline)
                if reason is None:
                    self.waited_s = clock.monotonic() - start
                    return self
                now = clock.monotonic()
                if now >= deadline:
                    raise LeaseTimeoutError(self.count, self.timeout_s, reason)
                self._queue_up()
                clock.sleep(min(delay, deadline - now))
                delay = min(delay * 1.5, _POLL_MAX_S)
        finally:
            self._leave()

    def try_acquire(self) -> str | None:
        """Try once, without waiting: ``None`` when taken, else what was in the way.

        A refused lease keeps its place in the queue, so that a later try is served before
        newer requests, until it is taken or :meth:`release` is called. For schedulers that
        poll many leases from one thread (``timeout_s`` is not used).

        Raises:
            ConfigurationError: As :meth:`acquire`.
        """
        if self._fds:
            raise ConfigurationError("this lease is held already; release it first")
        reason = self._attempt(self._candidates(), self.clock.monotonic())
        if reason is None:
            self._leave()
        else:
            self._queue_up()
        return reason

    def _queue_up(self) -> None:
        if self._ticket is None:
            self._ticket = _enter_queue(
                self._queue_dir, self._platform_tag, self.memory_bytes, self.count
            )

    def _leave(self) -> None:
        if self._ticket is not None:
            _leave_queue(self._queue_dir, *self._ticket)
            self._ticket = None

    @property
    def _platform_tag(self) -> str:
        return _SAFE.sub("_", self.platform.name)[:64] or "_"

    @property
    def _queue_dir(self) -> Path:
        if self._queue is None:
            self._queue = _subdir(self.lock_dir, _QUEUE_DIR)
        return self._queue

    def _ahead(self) -> Ticket | None:
        """The oldest waiting request older than this one (any, when this one is not queued)."""
        mine = self._ticket[0] if self._ticket is not None else None
        for ticket in _read_queue(self._queue_dir, self._platform_tag):
            if mine is not None and ticket.name == mine.name:
                return None
            if mine is None or ticket < mine:
                return ticket
        return None

    def _attempt(
        self, candidates: Sequence[tuple[DeviceInfo, str, MemoryInfo]], deadline: float
    ) -> str | None:
        """One try to take what the lease asks for: ``None`` when taken, else why not."""
        ahead = self._ahead()
        if self.memory_bytes is not None:
            return self._admit_share(candidates, ahead)
        if ahead is not None:
            return f"an older request goes first ({ahead.describe()})"
        got = self._lock_some(candidates)
        if got is None:
            return self._busy_reason(candidates)
        reason = self._wait_for_memory(got, max(0.0, deadline - self.clock.monotonic()))
        if reason is None:
            self._take(got)
            return None
        for _, _, fd in got:
            _unlock(fd)
        return reason

    def _limits(self, info: MemoryInfo) -> list[int]:
        """The largest usage at which ``info``'s device meets each free-memory minimum given."""
        limits = [] if self.min_free_bytes is None else [info.total - self.min_free_bytes]
        if self.min_free_ratio is not None:
            limits.append(info.total - math.ceil(self.min_free_ratio * info.total))
        return limits

    def _candidates(self) -> list[tuple[DeviceInfo, str, MemoryInfo]]:
        """Visible devices that can meet the minimums, best first, with their lock keys."""
        devices, name = list(self.platform.devices()), self.platform.name
        if self.count > len(devices):
            raise ConfigurationError(
                f"cannot lease {self.count} device(s): {name} shows this process only "
                f"{len(devices)} (leases stay inside the visible set)"
            )
        seen: dict[str, int] = {}
        rows: list[tuple[DeviceInfo, str, MemoryInfo]] = []
        for device in devices:
            key = _device_key(name, device, seen)
            info = self.platform.memory_info(device.index)
            if self.memory_bytes is not None and info.total < self.memory_bytes:
                continue
            if all(limit >= 0 for limit in self._limits(info)):
                rows.append((device, key, info))
        if len(rows) < self.count and self.memory_bytes is not None:
            raise ConfigurationError(
                f"{name}: only {len(rows)} of {len(devices)} visible device(s) have "
                f"memory={format_bytes(self.memory_bytes)} in total; {self.count} asked for"
            )
        if len(rows) < self.count:
            minimums = []
            if self.min_free_bytes is not None:
                minimums.append(f"min_free_bytes={self.min_free_bytes}")
            if self.min_free_ratio is not None:
                minimums.append(f"min_free_ratio={self.min_free_ratio:g}")
            raise ConfigurationError(
                f"{name}: only {len(rows)} of {len(devices)} visible device(s) have enough "
                f"memory in total for {' and '.join(minimums)}; {self.count} asked for"
            )
        preferred = {key: rank for rank, key in enumerate(self.prefer)}
        rows.sort(key=lambda r: (preferred.get(r[1], len(preferred)), -r[2].free, r[0].index))
        return rows

    def _lock_some(
        self, candidates: Sequence[tuple[DeviceInfo, str, MemoryInfo]]
    ) -> list[tuple[DeviceInfo, str, int]] | None:
        got: list[tuple[DeviceInfo, str, int]] = []
        for device, key, _ in candidates:
            try:
                fd = _try_lock(self.lock_dir / (key + _LOCK_SUFFIX))
            except OSError as exc:  # another user's 0600 file, a link, a directory: skip it
                self._unusable[key] = exc.strerror or str(exc)
                continue
            self._unusable.pop(key, None)
            if fd is not None:
                got.append((device, key, fd))
            if len(got) == self.count:
                return got
        for _, _, fd in got:  # all or nothing: never sit on part of a set
            _unlock(fd)
        return None

    def _busy_reason(self, candidates: Sequence[tuple[DeviceInfo, str, MemoryInfo]]) -> str:
        held = []
        for device, key, _ in candidates:
            if key in self._unusable:
                lock, why = self.lock_dir / (key + _LOCK_SUFFIX), self._unusable[key]
                held.append(f"device {device.index} cannot be locked ({lock}: {why})")
                continue
            shares = self.lock_dir / _SHARES_DIR
            _, sharing = self._committed(shares, key, 0) if shares.is_dir() else (0, [])
            if sharing:  # memory shares hold it shared
                held.append(f"device {device.index} ({key}) shared by {', '.join(sharing)}")
                continue
            pid = _int_field(_read_metadata(self.lock_dir / (key + _META_SUFFIX)), "pid", _PID_MAX)
            who = f"pid {pid}" if pid is not None else "another process"
            held.append(f"device {device.index} ({key}) held by {who}")
        return (
            f"fewer than {self.count} of {len(candidates)} usable device(s) were free at the "
            f"last attempt ({'; '.join(held)})"
        )

    def _wait_for_memory(
        self, got: Sequence[tuple[DeviceInfo, str, int]], remaining: float
    ) -> str | None:
        """Wait until the locked devices' memory is back; return why not, or ``None``."""
        targets: dict[int, int] = {}
        for device, key, _ in got:
            limits = self._limits(self.platform.memory_info(device.index))
            meta = _read_metadata(self.lock_dir / (key + _META_SUFFIX))
            previous = _int_field(meta, "baseline_used_bytes")
            ours = key in self.prefer and _int_field(meta, "pid", _PID_MAX) == os.getpid()
            if previous is not None and ours:  # its own memory is not returning; keep the
                self._carried[key] = previous  # idle figure for whoever comes next
            elif previous is not None:
                limits.append(previous + RETURN_TOLERANCE_BYTES)
            if limits:
                targets[device.index] = max(0, min(limits))
        if not targets:
            return None
        profile = self.platform.release
        try:
            wait_for_memory_to_clear(
                sorted(targets),
                threshold_bytes=targets,
                timeout_s=remaining,
                stable_duration_s=profile.stable_duration_s if profile.lazy else 0.0,
                platform=self.platform,
                clock=self.clock,
            )
        except MemoryNotSettledError as exc:
            return f"device memory did not come back: {exc}"
        return None

    def _committed(self, shares: Path, key: str, total: int) -> tuple[int, list[str]]:
        """The budgets promised on device ``key`` by live share holders, and who they are."""
        committed, holders = 0, []
        for stem in _slot_files(shares, key):
            if not _held(shares / (stem + _LOCK_SUFFIX)):
                continue  # free (its holder let go or died), or not a lock to tell
            meta = _read_metadata(shares / (stem + _META_SUFFIX))
            budget = _int_field(meta, "budget_bytes")
            pid = _int_field(meta, "pid", _PID_MAX)
            if budget is None:  # a holder whose budget cannot be read: assume the whole device
                budget = total
            committed += budget
            holders.append(f"pid {pid if pid is not None else '?'}: {format_bytes(budget)}")
        return committed, holders

    def _admit_share(
        self, candidates: Sequence[tuple[DeviceInfo, str, MemoryInfo]], ahead: Ticket | None
    ) -> str | None:
        """Take a share on ``count`` devices with room for the budget, or say why not."""
        assert self.memory_bytes is not None
        budget, shares = self.memory_bytes, _subdir(self.lock_dir, _SHARES_DIR)
        admit = self._queue_dir / f"{self._platform_tag}.admit"
        guard = _try_lock_blocking(admit)  # one admission at a time: budgets are read, then taken
        try:
            rows, why = [], []
            for device, key, _ in candidates:
                info = self.platform.memory_info(device.index)  # live, under the admission lock
                committed, holders = self._committed(shares, key, info.total)
                room = info.total - max(info.used, committed)
                keep = 0
                if ahead is not None:  # leave the oldest waiter's budget (a whole one: all)
                    keep = info.total if ahead.budget_bytes is None else ahead.budget_bytes
                if room - budget >= keep:
                    rows.append((room, device, key))
                    continue
                detail = (
                    f"device {device.index}: {format_bytes(max(room, 0))} room "
                    f"({format_bytes(info.used)} used, {format_bytes(committed)} promised"
                    + (f" to {', '.join(holders)}" if holders else "")
                    + ")"
                )
                if ahead is not None and room >= budget:
                    detail += f", kept for an older request ({ahead.describe()})"
                why.append(detail)
            rows.sort(key=lambda r: (-r[0], r[1].index))
            got: list[tuple[DeviceInfo, str, int, int, int]] = []
            for _, device, key in rows:
                taken = self._take_slot(shares, device, key)
                if taken is None:
                    why.append(f"device {device.index}: leased whole, or all share slots held")
                    continue
                got.append((device, key, *taken))
                if len(got) == self.count:
                    self._take_share(shares, got)
                    return None
            for _, _, device_fd, slot_fd, _ in got:
                _unlock(slot_fd)
                _unlock(device_fd)
        finally:
            _unlock(guard)
        return (
            f"fewer than {self.count} device(s) had room for "
            f"memory={format_bytes(budget)} at the last attempt ({'; '.join(why)})"
        )

    def _take_slot(self, shares: Path, device: DeviceInfo, key: str) -> tuple[int, int, int] | None:
        """The device's lock held shared, a free share slot's lock and its number, or ``None``."""
        try:
            device_fd = _try_lock(self.lock_dir / (key + _LOCK_SUFFIX), shared=True)
        except OSError as exc:
            self._unusable[key] = exc.strerror or str(exc)
            return None
        if device_fd is None:
            return None  # a whole-device lease holds it
        for slot in range(MAX_SHARES):
            try:
                slot_fd = _try_lock(shares / (_share_key(key, slot) + _LOCK_SUFFIX))
            except OSError:
                continue
            if slot_fd is not None:
                return device_fd, slot_fd, slot
        _unlock(device_fd)
        return None

    def _take_share(
        self, shares: Path, got: Sequence[tuple[DeviceInfo, str, int, int, int]]
    ) -> None:
        assert self.memory_bytes is not None
        self.devices = tuple(d for d, *_ in got)
        self.device_ids = tuple(k for _, k, *_ in got)
        self._fds = [fd for _, _, device_fd, slot_fd, _ in got for fd in (device_fd, slot_fd)]
        smallest = min(self.platform.memory_info(d.index).total for d in self.devices)
        fraction = min(1.0, self.memory_bytes / max(smallest, 1))
        self.environ = {
            **subset_environment(self.platform, self.devices),
            ENV_MEMORY_BYTES: str(self.memory_bytes),
            # rounded down: the fraction never allows more than the budget
            ENV_MEMORY_FRACTION: f"{math.floor(fraction * 1e6) / 1e6:.6f}",
        }
        command, since = _command_line(), time.time()
        self._meta = []
        for _, key, _, _, slot in got:
            meta = self._metadata(key, command, since, budget_bytes=self.memory_bytes)
            path = shares / (_share_key(key, slot) + _META_SUFFIX)
            self._meta.append((path, meta))
            _write_metadata(path, meta)

    def _metadata(self, key: str, command: str, since: float, **extra: int) -> dict[str, object]:
        """What a holder's metadata file says (``docs/leasing.md``), plus ``extra``."""
        return {
            "version": 1,
            "device_id": key,
            "platform": self.platform.name,
            "pid": os.getpid(),
            "command": command,
            "since": since,
            "released": False,
            **extra,
        }

    def _take(self, got: Sequence[tuple[DeviceInfo, str, int]]) -> None:
        self.devices = tuple(d for d, _, _ in got)
        self.environ = subset_environment(self.platform, self.devices)
        self.device_ids = tuple(k for _, k, _ in got)
        self._fds = [fd for _, _, fd in got]
        command, since = _command_line(), time.time()
        self._meta = []
        for device, key, _ in got:
            used = self._carried.get(key, self.platform.memory_info(device.index).used)
            meta = self._metadata(key, command, since, baseline_used_bytes=used)
            path = self.lock_dir / (key + _META_SUFFIX)
            self._meta.append((path, meta))
            _write_metadata(path, meta)

    def release(self) -> None:
        """Let the devices go (idempotent); their metadata says they were released.

        A lease still waiting (after :meth:`try_acquire`) leaves the queue.
        """
        self._leave()
        fds, self._fds = self._fds, []
        written, self._meta = self._meta, []  # once: a later holder may have the file since
        for path, meta in written:
            _write_metadata(path, {**meta, "released": True, "released_at": time.time()})
        for fd in fds:
            _unlock(fd)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = f"devices={[d.index for d in self.devices]}" if self.held else "not held"
        return f"<Lease count={self.count} {state} lock_dir={str(self.lock_dir)!r}>"


def lease(
    count: int = 1,
    *,
    min_free_bytes: int | None = None,
    min_free_ratio: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    lock_dir: str | os.PathLike[str] | None = None,
    platform: Platform | None = None,
    clock: Clock | None = None,
    prefer: Sequence[str] = (),
    memory: str | int | None = None,
) -> Lease:
    """Claim ``count`` visible devices, or a share of each one's memory, across the host.

    Args:
        count: Devices wanted, ``>= 1`` and at most the number visible.
        min_free_bytes: Each device must have at least this much free memory when handed out.
        min_free_ratio: Each device must have at least this fraction of its total free.
        timeout_s: How long to wait for the devices and their memory (``0`` tries once).
        lock_dir: The lock directory; ``None`` means :func:`default_lease_dir`.
        platform: The platform; ``None`` means the current one.
        clock: Time source and sleeper; ``None`` means the platform's.
        prefer: :attr:`Lease.device_ids` to take first when free; one this process held last is
            not waited on for its memory (this process's own: it will not come back meanwhile).
        memory: A share of each device instead of the whole: a size with a unit (``"12GiB"``)
            or an int of bytes (at least 1 MiB). Shares of several holders coexist on a device
            while their budgets, and the memory used beyond them, fit in its total. The lease's
            environment adds ``ACCELPLAT_LEASE_MEMORY_BYTES`` and ``..._FRACTION``.

    Returns:
        A :class:`Lease`, not yet acquired.

    Raises:
        ConfigurationError: At once: bad arguments, more devices than visible or able to meet the
            minimums (or hold ``memory``), or a lock directory that is empty, unwritable or (the
            default) not private.
    """
    budget = None if memory is None else _memory_budget(memory)
    if budget is not None and (min_free_bytes is not None or min_free_ratio is not None):
        raise ConfigurationError(
            "memory= leases a share of a device; min_free_bytes and min_free_ratio are for whole "
            "devices: give one or the other"
        )
    wanted = _validate.integer(count, "count", minimum=1)
    if min_free_bytes is not None:
        _validate.integer(min_free_bytes, "min_free_bytes", minimum=0)
    if min_free_ratio is not None:
        _validate.number(min_free_ratio, "min_free_ratio", minimum=0, maximum=1)
    timeout = _validate.number(timeout_s, "timeout_s", minimum=0)
    if isinstance(prefer, (str, bytes)) or not all(isinstance(p, str) for p in prefer):
        raise ConfigurationError(f"prefer must be a sequence of device identities, got {prefer!r}")
    directory = _prepare_dir(lock_dir)
    if platform is None:
        from accelplat._registry import current_platform

        platform = current_platform()
    held = Lease(
        wanted,
        platform=platform,
        lock_dir=directory,
        min_free_bytes=min_free_bytes,
        min_free_ratio=None if min_free_ratio is None else float(min_free_ratio),
        timeout_s=timeout,
        clock=clock if clock is not None else default_clock(platform),
        prefer=tuple(prefer),
        memory_bytes=budget,
    )
    held._candidates()  # count and minimums against the visible devices, at once
    return held


def _memory_budget(memory: object) -> int:
    """A share's budget in bytes: text with a unit, or an int of at least 1 MiB."""
    if isinstance(memory, int) and not isinstance(memory, bool) and 0 <= memory < MIN_SHARE_BYTES:
        raise ConfigurationError(
            f"memory={memory} is {memory} bytes, below 1 MiB: give a size with a unit "
            f"('{memory}GiB') or an int of bytes ({memory} * accelplat.GIB)"
        )
    budget = _validate.parse_size(memory, argument="memory")  # type: ignore[arg-type]
    if budget < MIN_SHARE_BYTES:
        raise ConfigurationError(f"memory must be at least 1MiB, got {shown(memory)}")
    return budget


def lease_status(lock_dir: str | os.PathLike[str] | None = None) -> list[LeaseRecord]:
    """Say, for every device the lock directory knows, who holds it (or held it last).

    Returns:
        One :class:`LeaseRecord` per lock file that can be locked, sorted by device identity.

    Raises:
        ConfigurationError: As :func:`lease`, for the lock directory.

    Side effects:
        Takes each free lock for an instant (a shared lock) to learn whether it is held.
    """
    directory = _prepare_dir(lock_dir)
    records = _records(directory, share=False)
    if os.path.isdir(directory / _SHARES_DIR):
        records += _records(directory / _SHARES_DIR, share=True)
    return sorted(records, key=lambda r: (r.device_id, r.budget_bytes is not None, r.path))


def _records(where: Path, *, share: bool) -> list[LeaseRecord]:
    records: list[LeaseRecord] = []
    for entry in sorted(where.glob("*" + _LOCK_SUFFIX)):
        key = entry.name[: -len(_LOCK_SUFFIX)]
        try:
            probe = _try_lock(entry, shared=True)
        except OSError:
            continue
        if probe is not None:
            _unlock(probe)
        meta, since = _read_metadata(where / (key + _META_SUFFIX)), None
        with contextlib.suppress(ConfigurationError):
            since = _validate.number(meta.get("since"), "since", minimum=0, maximum=_LAST_SECOND)
        budget = None
        if share:  # a slot's name is the device's key, its user and its number
            key, _, slot = key.rpartition(".")
            if not _SLOT.fullmatch(slot) or not key:
                continue
            if not meta and probe is not None:
                continue
            budget = _int_field(meta, "budget_bytes") or 0
        records.append(
            LeaseRecord(
                device_id=key,  # the file's name, not what its metadata claims
                held=probe is None,
                pid=_int_field(meta, "pid", _PID_MAX),
                command=_str_field(meta, "command"),
                since=since,
                released=meta.get("released") is True,
                platform=_str_field(meta, "platform"),
                baseline_used_bytes=_int_field(meta, "baseline_used_bytes"),
                path=str(entry),
                budget_bytes=budget,
            )
        )
    return records
