"""Device leases: hand each process on a host its own devices, through OS file locks.

``lease(count)`` claims ``count`` of the devices this process can see, exclusively among every
process on the host that leases through the same lock directory: one ``flock(2)`` per stable
device identity (dropped by the kernel when the holder dies), all or nothing (never sitting on
part of a set), and the previous holder's memory back before hand-out. The design, the lock
directory and the environment of each platform: docs/leasing.md.
"""

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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from accelplat import _files, _validate
from accelplat._memory import default_clock, wait_for_memory_to_clear
from accelplat._platform import Platform, subset_environment
from accelplat._types import MIB, DeviceInfo, MemoryInfo
from accelplat._util import Clock
from accelplat.errors import ConfigurationError, LeaseTimeoutError, MemoryNotSettledError

ENV_LEASE_DIR = "ACCELPLAT_LEASE_DIR"
"""Variable naming the lock directory; overrides the per-user default."""

DEFAULT_TIMEOUT_S = 600.0

RETURN_TOLERANCE_BYTES = 256 * MIB
"""Usage above the previous holder's hand-out figure that still counts as "memory is back"."""

MAX_METADATA_BYTES = 64 * 1024
"""Largest lease metadata file read; a bigger one is ignored."""

_LOCK_SUFFIX = ".lock"
_META_SUFFIX = ".json"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_COMMAND_LIMIT = 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_POLL_FIRST_S, _POLL_MAX_S = 0.005, 0.05  # lock attempts: 5 ms, growing 1.5x to 50 ms


@dataclass(frozen=True)
class LeaseRecord:
    """What a lock directory says about one device.

    Attributes:
        device_id: The stable device identity the lock is named after.
        held: Whether some process holds the lock now.
        pid: Process id of the last holder, or ``None`` when unknown.
        command: That holder's command line, or ``""``.
        since: Wall-clock time (seconds since 1970) it was handed out, or ``None``.
        released: Whether the last holder let go itself; ``False`` with ``held=False`` means it
            died holding it.
        platform: Platform name recorded by the holder.
        baseline_used_bytes: Used memory of the device when it was handed out, or ``None``.
        path: The lock file.
    """

    device_id: str
    held: bool
    pid: int | None
    command: str
    since: float | None
    released: bool
    platform: str
    baseline_used_bytes: int | None
    path: str


# -- the lock directory -----------------------------------------------------------------------


def default_lease_dir() -> Path:
    """Return the lock directory leases use when none is given.

    Returns:
        ``$ACCELPLAT_LEASE_DIR`` when set, else ``$XDG_RUNTIME_DIR/accelplat/leases`` when that
        runtime directory exists, else ``<tempdir>/accelplat-<uid>/leases``.
    """
    configured = os.environ.get(ENV_LEASE_DIR, "").strip()
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "accelplat" / "leases"
    return Path(tempfile.gettempdir()) / f"accelplat-{os.getuid()}" / "leases"


def _prepare_dir(lock_dir: str | os.PathLike[str] | None) -> Path:
    """Create (if needed) and check the lock directory; raise ConfigurationError naming it."""
    if lock_dir is not None and not isinstance(lock_dir, (str, os.PathLike)):
        raise ConfigurationError(f"lock_dir must be a path or None, got {lock_dir!r}")
    path = Path(lock_dir) if lock_dir is not None else default_lease_dir()
    if str(path) == "":
        raise ConfigurationError("lock_dir must not be empty")
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
    """Return a descriptor holding the lock, or ``None`` when another holder has it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW, 0o666)
    except PermissionError:  # another user's lock file in a shared directory: flock needs no write
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _NOFOLLOW)
    except OSError as exc:
        raise ConfigurationError(
            f"lease lock {path} cannot be opened: {exc.strerror or exc}"
        ) from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise ConfigurationError(
            f"lease lock {path} cannot be locked: {exc.strerror or exc}"
        ) from None
    return fd


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the last descriptor drops the flock


# -- metadata (untrusted: another user's process may have written it) -------------------------


def _read_metadata(path: Path) -> dict[str, object]:
    """Read a metadata file: regular files only, bounded; anything odd reads as ``{}``."""
    try:
        raw = _files.read_live(path, limit=MAX_METADATA_BYTES, follow_links=False)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}  # missing, a link, not a regular file, too large, not UTF-8 JSON
    return data if isinstance(data, dict) else {}


def _int_field(data: Mapping[str, object], key: str) -> int | None:
    try:
        return _validate.integer(data.get(key), key, minimum=0, maximum=2**63 - 1)
    except ConfigurationError:
        return None


def _float_field(data: Mapping[str, object], key: str) -> float | None:
    try:
        return _validate.number(data.get(key), key, minimum=0)
    except ConfigurationError:
        return None


def _str_field(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else "?" for c in value[:_COMMAND_LIMIT])


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


def _command_line() -> str:
    """This process's command line (read live, bounded), else ``sys.argv``; shortened."""
    try:
        raw = _files.read_live(f"/proc/{os.getpid()}/cmdline", limit=_files.PROC_LIMIT)
        text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        text = " ".join(sys.argv)
    return text[:_COMMAND_LIMIT]


def _needed_used(info: MemoryInfo, min_free: int | None, ratio: float | None) -> int | None:
    """Largest usage at which ``info``'s device meets the free-memory minimums, or ``None``."""
    limits: list[int] = []
    if min_free is not None:
        limits.append(info.total - min_free)
    if ratio is not None:
        limits.append(info.total - math.ceil(ratio * info.total))
    return min(limits) if limits else None


# -- the lease --------------------------------------------------------------------------------


class Lease:
    """Devices held exclusively by this process, and the environment that shows them.

    Made by :func:`lease`; acquired on ``with`` entry (or :meth:`acquire`) and released on exit
    (or :meth:`release`, or when the process ends however it ends).

    Attributes:
        count: Devices asked for.
        platform: The platform the devices belong to.
        lock_dir: The lock directory.
        devices: The leased devices (visible indices of this process), most free memory first;
            empty until acquired.
        environ: Variables to apply in a child (``None`` values mean "remove"); empty until
            acquired.
        device_ids: The stable identities the locks are named after.
        waited_s: Seconds :meth:`acquire` took.
    """

    def __init__(
        self,
        count: int,
        *,
        platform: Platform,
        lock_dir: Path,
        min_free_bytes: int | None,
        min_free_ratio: float | None,
        timeout_s: float,
        clock: Clock,
        prefer: Sequence[str] = (),
    ) -> None:
        self.count = count
        self.platform = platform
        self.lock_dir = lock_dir
        self.min_free_bytes = min_free_bytes
        self.min_free_ratio = min_free_ratio
        self.timeout_s = timeout_s
        self.devices: tuple[DeviceInfo, ...] = ()
        self.environ: dict[str, str | None] = {}
        self.device_ids: tuple[str, ...] = ()
        self.waited_s = 0.0
        self._clock = clock
        self._prefer = tuple(prefer)
        self._fds: list[int] = []
        self._paths: list[Path] = []
        self._meta: list[dict[str, object]] = []
        self._carried: dict[str, int] = {}

    @property
    def held(self) -> bool:
        """Whether the devices are held now."""
        return bool(self._fds)

    @property
    def lock_fds(self) -> tuple[int, ...]:
        """Descriptors holding the locks (``pass_fds`` them to a child to hold until it exits)."""
        return tuple(self._fds)

    def child_environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return ``base`` (default ``os.environ``) with the lease's variables applied.

        Args:
            base: The environment to start from.

        Returns:
            A new mapping for ``subprocess`` ``env=``.
        """
        env = dict(os.environ if base is None else base)
        self.apply(env)
        return env

    def apply(self, environ: MutableMapping[str, str] | None = None) -> Callable[[], None]:
        """Apply the lease's variables to ``environ`` (default ``os.environ``) in place.

        Do this before anything in the process starts a device runtime, which reads the
        variables once.

        Args:
            environ: The mapping to change.

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
            ConfigurationError: When fewer than ``count`` devices are visible, or fewer than
                ``count`` could ever meet the free-memory minimums, or the lease is held already.
            LeaseTimeoutError: When the timeout passes first; the message says what was in the
                way (holders of the locks, or memory that did not come back).

        Side effects:
            Creates lock and metadata files in the lock directory; sleeps while waiting.
        """
        if self._fds:
            raise ConfigurationError("this lease is held already; release it first")
        clock = self._clock
        start = clock.monotonic()
        deadline = start + self.timeout_s
        delay = _POLL_FIRST_S
        while True:
            candidates = self._candidates()
            got = self._lock_some(candidates)
            if got is None:
                reason = self._busy_reason(candidates)
            else:
                outcome = self._wait_for_memory(got, max(0.0, deadline - clock.monotonic()))
                if outcome is None:
                    self._take(got, start)
                    return self
                reason = outcome
                for _, _, fd in got:
                    _unlock(fd)
            now = clock.monotonic()
            if now >= deadline:
                raise LeaseTimeoutError(self.count, self.timeout_s, reason)
            clock.sleep(min(delay, deadline - now))
            delay = min(delay * 1.5, _POLL_MAX_S)

    def _candidates(self) -> list[tuple[DeviceInfo, str, MemoryInfo]]:
        """Visible devices that can meet the minimums, best first, with their lock keys."""
        devices = list(self.platform.devices())
        name = self.platform.name
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
            limit = _needed_used(info, self.min_free_bytes, self.min_free_ratio)
            if limit is None or limit >= 0:
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
        preferred = {key: rank for rank, key in enumerate(self._prefer)}
        rows.sort(key=lambda r: (preferred.get(r[1], len(preferred)), -r[2].free, r[0].index))
        return rows

    def _lock_some(
        self, candidates: Sequence[tuple[DeviceInfo, str, MemoryInfo]]
    ) -> list[tuple[DeviceInfo, str, int]] | None:
        got: list[tuple[DeviceInfo, str, int]] = []
        for device, key, _ in candidates:
            fd = _try_lock(self.lock_dir / (key + _LOCK_SUFFIX))
            if fd is None:
                continue
            got.append((device, key, fd))
            if len(got) == self.count:
                return got
        for _, _, fd in got:  # all or nothing: never sit on part of a set
            _unlock(fd)
        return None

    def _busy_reason(self, candidates: Sequence[tuple[DeviceInfo, str, MemoryInfo]]) -> str:
        held = []
        for device, key, _ in candidates:
            pid = _int_field(_read_metadata(self.lock_dir / (key + _META_SUFFIX)), "pid")
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
            info = self.platform.memory_info(device.index)
            needed = _needed_used(info, self.min_free_bytes, self.min_free_ratio)
            limits = [] if needed is None else [needed]
            meta = _read_metadata(self.lock_dir / (key + _META_SUFFIX))
            previous = _int_field(meta, "baseline_used_bytes")
            ours = key in self._prefer and _int_field(meta, "pid") == os.getpid()
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
                clock=self._clock,
            )
        except MemoryNotSettledError as exc:
            return f"device memory did not come back: {exc}"
        return None

    def _take(self, got: Sequence[tuple[DeviceInfo, str, int]], start: float) -> None:
        self.devices = tuple(d for d, _, _ in got)
        self.environ = subset_environment(self.platform, self.devices)
        self.device_ids = tuple(k for _, k, _ in got)
        self._fds = [fd for _, _, fd in got]
        self._paths = [self.lock_dir / (k + _META_SUFFIX) for _, k, _ in got]
        self.waited_s = self._clock.monotonic() - start
        command, since = _command_line(), time.time()
        self._meta = []
        for (device, key, _), path in zip(got, self._paths, strict=True):
            meta: dict[str, object] = {
                "version": 1,
                "device_id": key,
                "platform": self.platform.name,
                "pid": os.getpid(),
                "command": command,
                "since": since,
                "released": False,
                "baseline_used_bytes": self._carried.get(
                    key, self.platform.memory_info(device.index).used
                ),
            }
            self._meta.append(meta)
            _write_metadata(path, meta)

    def release(self) -> None:
        """Let the devices go (idempotent); their metadata says they were released."""
        fds, self._fds = self._fds, []
        for path, meta in zip(self._paths, self._meta, strict=True):
            _write_metadata(path, {**meta, "released": True, "released_at": time.time()})
        for fd in fds:
            _unlock(fd)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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

    Use it as a context manager; the devices are taken on entry and let go on exit::

        with accelplat.lease(2, min_free_bytes=40 * GIB, timeout_s=600) as held:
            subprocess.run(cmd, env=held.child_environ(), check=True)

    Args:
        count: Devices wanted, ``>= 1`` and at most the number visible.
        min_free_bytes: Each device must have at least this much free memory when handed out.
        min_free_ratio: Each device must have at least this fraction of its total free.
        timeout_s: How long to wait for the devices and their memory (``0`` tries once).
        lock_dir: The lock directory; ``None`` means :func:`default_lease_dir`.
        platform: The platform; ``None`` means the current one.
        clock: Time source and sleeper; ``None`` means the platform's.
        prefer: Device identities (:attr:`Lease.device_ids` of an earlier lease) to take first
            when free. Such a device that this process held last is not waited on for the memory
            it used: that memory is this process's own and will not come back while it runs.

    Returns:
        A :class:`Lease`, not yet acquired.

    Raises:
        ConfigurationError: At once, before any waiting: for a ``count`` that is not a whole
            number ``>= 1`` or exceeds the visible devices, negative or malformed minimums,
            minimums no ``count`` visible devices could meet even when empty, a bad timeout, or
            a lock directory that cannot be created or written (the message names it).

    Side effects:
        Detects the platform and reads device memory; creates the lock directory.
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
        prefer=prefer,
    )
    held._candidates()  # count and minimums against the visible devices, at once
    return held


def lease_status(lock_dir: str | os.PathLike[str] | None = None) -> list[LeaseRecord]:
    """Say, for every device the lock directory knows, who holds it (or held it last).

    Args:
        lock_dir: The lock directory; ``None`` means :func:`default_lease_dir`.

    Returns:
        One :class:`LeaseRecord` per lock file, sorted by device identity.

    Raises:
        ConfigurationError: When the directory cannot be created or written.

    Side effects:
        Takes each free lock for an instant (a shared lock) to learn whether it is held.
    """
    directory = _prepare_dir(lock_dir)
    records: list[LeaseRecord] = []
    for entry in sorted(directory.glob("*" + _LOCK_SUFFIX)):
        key = entry.name[: -len(_LOCK_SUFFIX)]
        try:
            if not stat.S_ISREG(entry.lstat().st_mode):
                continue
            probe = _try_lock(entry, shared=True)
        except (OSError, ConfigurationError):
            continue
        if probe is not None:
            _unlock(probe)
        meta = _read_metadata(directory / (key + _META_SUFFIX))
        records.append(
            LeaseRecord(
                device_id=_str_field(meta, "device_id") or key,
                held=probe is None,
                pid=_int_field(meta, "pid"),
                command=_str_field(meta, "command"),
                since=_float_field(meta, "since"),
                released=meta.get("released") is True,
                platform=_str_field(meta, "platform"),
                baseline_used_bytes=_int_field(meta, "baseline_used_bytes"),
                path=str(entry),
            )
        )
    return records
