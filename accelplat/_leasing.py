"""Device leases: a ``flock(2)`` per device identity, all or nothing, memory back first."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
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
from accelplat._memory import default_clock, wait_for_memory_to_clear
from accelplat._platform import Platform, subset_environment
from accelplat._types import MIB, DeviceInfo, MemoryInfo
from accelplat._util import Clock
from accelplat.errors import ConfigurationError, LeaseTimeoutError, MemoryNotSettledError

ENV_LEASE_DIR = "ACCELPLAT_LEASE_DIR"  # a (possibly shared) lock directory instead of the default
DEFAULT_TIMEOUT_S = 600.0
RETURN_TOLERANCE_BYTES = 256 * MIB  # above the last hand-out figure, still "memory is back"
MAX_METADATA_BYTES = 64 * 1024  # a bigger metadata file is ignored

_LOCK_SUFFIX = ".lock"
_META_SUFFIX = ".json"
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


def _try_lock(path: Path, *, shared: bool = False) -> int | None:
    """A descriptor holding the lock, or ``None`` when held; OSError for what cannot be a lock."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW  # O_NONBLOCK: a planted FIFO never blocks
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except PermissionError:  # another user's lock file in a shared directory: flock needs no write
        fd = os.open(path, os.O_RDONLY | flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
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


@dataclass(eq=False, repr=False)
class Lease:
    """Devices held exclusively by this process, and the environment that shows them.

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
        """Wait until ``count`` visible devices are free and their memory is back; take them.

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
        while True:
            candidates = self._candidates()
            got = self._lock_some(candidates)
            if got is not None:
                reason = self._wait_for_memory(got, max(0.0, deadline - clock.monotonic()))
                if reason is None:
                    self._take(got, start)
                    return self
                for _, _, fd in got:
                    _unlock(fd)
            else:
                reason = self._busy_reason(candidates)
            now = clock.monotonic()
            if now >= deadline:
                raise LeaseTimeoutError(self.count, self.timeout_s, reason)
            clock.sleep(min(delay, deadline - now))
            delay = min(delay * 1.5, _POLL_MAX_S)

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
            if all(limit >= 0 for limit in self._limits(info)):
                rows.append((device, key, info))
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

    def _take(self, got: Sequence[tuple[DeviceInfo, str, int]], start: float) -> None:
        self.devices = tuple(d for d, _, _ in got)
        self.environ = subset_environment(self.platform, self.devices)
        self.device_ids = tuple(k for _, k, _ in got)
        self._fds = [fd for _, _, fd in got]
        self.waited_s = self.clock.monotonic() - start
        try:  # this process's command line, read live, bounded
            raw = _files.read_live(f"/proc/{os.getpid()}/cmdline", limit=_files.PROC_LIMIT)
            command = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            command = " ".join(sys.argv)
        command, since = command[:_COMMAND_LIMIT], time.time()
        self._meta = []
        for device, key, _ in got:
            used = self._carried.get(key, self.platform.memory_info(device.index).used)
            meta: dict[str, object] = {
                "version": 1,
                "device_id": key,
                "platform": self.platform.name,
                "pid": os.getpid(),
                "command": command,
                "since": since,
                "released": False,
                "baseline_used_bytes": used,
            }
            path = self.lock_dir / (key + _META_SUFFIX)
            self._meta.append((path, meta))
            _write_metadata(path, meta)

    def release(self) -> None:
        """Let the devices go (idempotent); their metadata says they were released."""
        fds, self._fds = self._fds, []
        for path, meta in self._meta:
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
) -> Lease:
    """Claim ``count`` visible devices exclusively across the host's processes.

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

    Returns:
        A :class:`Lease`, not yet acquired.

    Raises:
        ConfigurationError: At once: bad arguments, more devices than visible or able to meet the
            minimums, or a lock directory that is empty, unwritable or (the default) not private.
    """
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
    )
    held._candidates()  # count and minimums against the visible devices, at once
    return held


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
    records: list[LeaseRecord] = []
    for entry in sorted(directory.glob("*" + _LOCK_SUFFIX)):
        key = entry.name[: -len(_LOCK_SUFFIX)]
        try:
            probe = _try_lock(entry, shared=True)
        except OSError:
            continue
        if probe is not None:
            _unlock(probe)
        meta, since = _read_metadata(directory / (key + _META_SUFFIX)), None
        with contextlib.suppress(ConfigurationError):
            since = _validate.number(meta.get("since"), "since", minimum=0, maximum=_LAST_SECOND)
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
            )
        )
    return records
