"""Device leases: a ``flock(2)`` per device identity, all or nothing, memory back first.

A lease holds whole devices (their locks held exclusively) or a share of their memory (held
shared, plus a share slot carrying the budget): two admissions behind one :class:`Lease`. Its
rooms: ``_locks`` (the lock directory, locks, holder documents), ``_queue`` (tickets and the
order rule), ``_shares`` (budgets, slots, the share rule); docs/leasing.md tells the whole.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from accelplat import _validate
from accelplat._leasing import _locks, _queue, _shares
from accelplat._leasing._locks import DOC, LOCK, Unit
from accelplat._leasing._locks import ENV_LEASE_DIR as ENV_LEASE_DIR
from accelplat._leasing._locks import LeaseRecord as LeaseRecord
from accelplat._leasing._shares import ENV_MEMORY_BYTES as ENV_MEMORY_BYTES
from accelplat._memory import resolve_platform, wait_for_memory_to_clear
from accelplat._owners import default_clock
from accelplat._platform import Platform, optional, subset_environment
from accelplat._types import MIB, DeviceInfo
from accelplat._util import Clock, format_bytes, set_environ
from accelplat.errors import (
    ConfigurationError,
    LeaseTimeoutError,
    LeaseUnsatisfiableError,
    MemoryNotSettledError,
)

DEFAULT_TIMEOUT_S = 600.0
RETURN_TOLERANCE_BYTES = 256 * MIB  # above the last hand-out figure, still "memory is back"
_POLL_FIRST_S, _POLL_MAX_S = 0.005, 0.05  # lock attempts: 5 ms, growing 1.5x to 50 ms


class Taken(NamedTuple):
    """What an admission took on one unit: its lock descriptors and where its document goes."""

    unit: Unit
    fds: tuple[int, ...]
    document: Path
    fields: dict[str, object]  # the holder document's own fields (a baseline, a budget)


Outcome = list[Taken] | str  # what one attempt took, or why it took nothing


class Whole:
    """Admission of whole devices: ``count`` locks held exclusively, then their memory back.

    It admits for ``lease``, whose minimums, preferred devices and clock it reads.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease  # its minimums, the devices it prefers, its clock
        wants = {"min_free_bytes": lease.min_free_bytes, "min_free_ratio": lease.min_free_ratio}
        self.wants = " and ".join(f"{k}={v}" for k, v in wants.items() if v is not None)
        self.unusable: dict[str, str] = {}  # lock key -> why it cannot be locked
        self.carried: dict[str, int] = {}  # lock key -> the idle figure kept for the next holder

    def limits(self, total: int) -> list[int]:
        """The largest usage at which a device of ``total`` meets each free-memory minimum."""
        least, ratio = self.lease.min_free_bytes, self.lease.min_free_ratio
        limits = [] if least is None else [total - least]
        if ratio is not None:
            limits.append(total - math.ceil(ratio * total))
        return limits

    def fits(self, total: int) -> bool:
        return all(limit >= 0 for limit in self.limits(total))

    def environ(self, units: Sequence[Unit]) -> dict[str, str | None]:
        return {}

    def attempt(self, lease: Lease, ahead: LeaseRecord | None, deadline: float) -> Outcome:
        """One try: lock ``count`` free devices (most free memory first), wait for their memory."""
        if ahead is not None:  # the order rule (_queue.kept_free): it keeps the whole device
            return f"an older request goes first ({_queue.waiting(ahead)})"
        pool, count, lock_dir = lease.pool, lease.count, lease.lock_dir
        rank = {key: i for i, key in enumerate(self.lease.prefer)}
        free = {u.key: u.memory().free for u in pool}
        got: list[tuple[Unit, int]] = []
        for unit in sorted(pool, key=lambda u: (rank.get(u.key, len(rank)), -free[u.key])):
            try:
                fd = _locks.try_lock(lock_dir / (unit.key + LOCK))
            except OSError as exc:  # another user's 0600 file, a link, a directory: skip it
                self.unusable[unit.key] = exc.strerror or str(exc)
                continue
            self.unusable.pop(unit.key, None)
            if fd is not None:
                got.append((unit, fd))
            if len(got) == count:
                if (reason := self._memory_back(lock_dir, got, deadline)) is None:
                    return [
                        Taken(u, (fd,), lock_dir / (u.key + DOC), self._base(u)) for u, fd in got
                    ]
                break
        else:
            reason = self._busy(pool, count, lock_dir)
        for _, fd in got:  # all or nothing: never sit on part of a set
            _locks.unlock(fd)
        return reason

    def _base(self, unit: Unit) -> dict[str, object]:
        """Its holder document's baseline: the used memory handed out (or the idle figure kept)."""
        return {"baseline_used_bytes": self.carried.get(unit.key, unit.memory().used)}

    def _busy(self, pool: Sequence[Unit], count: int, lock_dir: Path) -> str:
        held = []
        for unit in pool:
            if unit.key in self.unusable:
                lock = lock_dir / (unit.key + LOCK)
                held.append(f"{unit.label} cannot be locked ({lock}: {self.unusable[unit.key]})")
            elif sharing := _shares.promises(lock_dir / _shares.SHARES_DIR, unit.key):
                held.append(f"{unit.label} ({unit.key}) shared by {_shares.promised_to(sharing)}")
            else:
                holder = _locks.read_holder(lock_dir / (unit.key + DOC))
                held.append(f"{unit.label} ({unit.key}) held by {_locks.describe(holder)}")
        return (
            f"fewer than {count} of {len(pool)} usable device(s) were free at the last attempt "
            f"({'; '.join(held)})"
        )

    def _memory_back(
        self, lock_dir: Path, got: Sequence[tuple[Unit, int]], deadline: float
    ) -> str | None:
        """Wait until the locked devices' memory is back and the minimums are met; or say why."""
        for unit, _ in got:
            doc = _locks.read_holder(lock_dir / (unit.key + DOC))
            limits, base = self.limits(unit.memory().total), doc.baseline_used_bytes
            if base is not None and unit.key in self.lease.prefer and doc.pid == os.getpid():
                self.carried[unit.key] = base  # its own memory is not coming back: keep the
            elif base is not None:  # idle figure for whoever comes next
                limits.append(base + RETURN_TOLERANCE_BYTES)
            if not limits:
                continue
            release = unit.view.release
            try:
                wait_for_memory_to_clear(
                    [unit.device.index],
                    threshold_bytes=max(0, min(limits)),
                    timeout_s=max(0.0, deadline - self.lease.clock.monotonic()),
                    stable_duration_s=release.stable_duration_s if release.lazy else 0.0,
                    platform=unit.view,
                    clock=self.lease.clock,
                )
            except MemoryNotSettledError as exc:
                return f"device memory did not come back: {exc}"
        return None


class Share:
    """Admission of a share: ``budget`` bytes on each of ``count`` units with room, all or none.

    Admissions are made one at a time under ``queue/<platform>.admit``, tried without blocking.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.wants = f"memory={format_bytes(budget)}"

    def fits(self, total: int) -> bool:
        return total >= self.budget

    def environ(self, units: Sequence[Unit]) -> dict[str, str | None]:
        """The budget's variables: bytes, and a fraction of the smallest unit's total."""
        fraction = min(1.0, self.budget / max(min(u.memory().total for u in units), 1))
        rounded = f"{math.floor(fraction * 1e6) / 1e6:.6f}"  # down: never more than the budget
        return {_shares.ENV_MEMORY_BYTES: str(self.budget), _shares.ENV_MEMORY_FRACTION: rounded}

    def attempt(self, lease: Lease, ahead: LeaseRecord | None, deadline: float) -> Outcome:
        """One try under the admission lock (never waited for): what was taken, or why not."""
        admit = lease.queue_dir / f"{lease.tag}.admit"  # one admission at a time
        try:
            guard = _locks.try_lock(admit)
        except OSError as exc:  # made for its owner alone (umask 077) by an older version
            cause = f"{admit} cannot be opened: {exc.strerror or exc}; its owner may remove it"
            raise ConfigurationError(f"lease admission lock {cause}") from None
        if guard is None:
            holder = _locks.lock_holder(admit)
            return f"another lease is being admitted: {admit} is held by {holder}"
        try:
            shares = _locks.directory(lease.lock_dir / _shares.SHARES_DIR, None)
            rows, why = [], []
            for rank, unit in enumerate(lease.pool):
                info = unit.memory()  # live, under the admission lock
                keep = _queue.kept_free(ahead, info.total)
                sharing = _shares.promises(shares, unit.key)
                left, detail = _shares.room(unit, info, sharing, self.budget + keep)
                if left - self.budget >= keep:
                    rows.append((-left, rank, unit))
                    continue
                if ahead is not None and left >= self.budget:
                    detail += f", kept for an older request ({_queue.waiting(ahead)})"
                why.append(f"{unit.label}: {detail}")
            got: list[Taken] = []
            for _, _, unit in sorted(rows, key=lambda r: r[:2]):
                taken = self._take_slot(lease.lock_dir, shares, unit)
                if isinstance(taken, str):
                    why.append(f"{unit.label}: {taken}")
                    continue
                got.append(taken)
                if len(got) == lease.count:
                    return got
        finally:
            _locks.unlock(guard)
        for taken in got:
            for fd in taken.fds:
                _locks.unlock(fd)
        return (
            f"fewer than {lease.count} device(s) had room for {self.wants} at the last attempt "
            f"({'; '.join(why)})"
        )

    def _take_slot(self, lock_dir: Path, shares: Path, unit: Unit) -> Taken | str:
        """The device's lock held shared and a free slot of this user's, or why not."""
        lock = lock_dir / (unit.key + LOCK)
        try:
            device_fd = _locks.try_lock(lock, shared=True)
        except OSError as exc:
            return f"cannot be locked ({lock}: {exc.strerror or exc})"
        if device_fd is None:
            return "leased whole"
        for slot in range(_shares.MAX_SHARES):
            # each user has its own slots: in a shared (sticky) directory another user's holder
            # document could not be replaced, and its stale budget would be read for ours
            name = f"{unit.key}.{os.geteuid()}-{slot}"
            with contextlib.suppress(OSError):  # a planted non-lock: the next slot
                slot_fd = _locks.try_lock(shares / (name + LOCK))
                if slot_fd is not None:
                    doc = shares / (name + _locks.DOC)
                    return Taken(unit, (device_fd, slot_fd), doc, {"budget_bytes": self.budget})
        _locks.unlock(device_fd)
        return f"all {_shares.MAX_SHARES} share slots of this user are held"


@dataclass(eq=False, repr=False)
class Lease:
    """Devices held by this process (whole, or a share of their memory), and their environment.

    Made by :func:`lease`; acquired on ``with`` entry (or :meth:`acquire`) and released on exit
    (or :meth:`release`, or when the process ends however it ends).
    """

    count: int  # devices asked for
    platform: Platform
    lock_dir: Path
    min_free_bytes: int | None
    min_free_ratio: float | None
    timeout_s: float
    clock: Clock
    prefer: tuple[str, ...] = ()
    memory_bytes: int | None = None  # a share of this much memory per device; None: whole devices
    # once held: the devices (most free memory, or most room, first; a lease unit's as its view
    # shows it), the variables to apply in a child (None: remove it), the identities the locks are
    # named after, seconds waited
    devices: tuple[DeviceInfo, ...] = field(default=(), init=False)
    environ: dict[str, str | None] = field(default_factory=dict, init=False)
    device_ids: tuple[str, ...] = field(default=(), init=False)
    waited_s: float = field(default=0.0, init=False)
    pool: list[Unit] = field(init=False)  # the devices (or lease units) that could serve it
    tag: str = field(init=False)
    queue_dir: Path = field(init=False)
    _admission: Whole | Share = field(init=False)
    _fds: list[int] = field(default_factory=list, init=False)
    _written: list[tuple[Path, dict[str, object]]] = field(default_factory=list, init=False)
    _ticket: tuple[_queue.Ticket, int] | None = field(default=None, init=False)  # while waiting

    def __post_init__(self) -> None:
        self.tag = _locks.platform_tag(self.platform)  # the queue's name for the platform
        self.queue_dir = _locks.directory(self.lock_dir / _queue.QUEUE_DIR, None)
        self._admission = Whole(self) if self.memory_bytes is None else Share(self.memory_bytes)
        self.pool = _pool(self)  # checked at once: LeaseUnsatisfiableError

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
        return set_environ(self.environ, environ)

    def acquire(self, *, on_wait: Callable[[float, str], None] | None = None) -> Lease:
        """Wait until ``count`` devices (or shares of them) are free; take them.

        A whole device must be free of other leases and shares, and its memory back; a share
        needs room for its budget (docs/leasing.md, "What fits"). The oldest waiting request is
        served first: a newer one may not take the room it waits for.

        Args:
            on_wait: Called after each refused attempt with the seconds waited and what is in
                the way (the holders named), for a display.

        Returns:
            ``self``, holding the devices.

        Raises:
            ConfigurationError: Held already; an admission lock that cannot be opened.
            LeaseTimeoutError: The timeout passed first; the message says what was in the way.
        """
        clock, delay = self.clock, _POLL_FIRST_S
        start = clock.monotonic()
        deadline = start + self.timeout_s
        try:
            while (reason := self._try(deadline)) is not None:
                now = clock.monotonic()
                if now >= deadline:
                    raise LeaseTimeoutError(self.count, self.timeout_s, reason)
                if on_wait is not None:
                    on_wait(now - start, reason)
                clock.sleep(min(delay, deadline - now))
                delay = min(delay * 1.5, _POLL_MAX_S)
            self.waited_s = clock.monotonic() - start
            return self
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
        return self._try(self.clock.monotonic())

    def _try(self, deadline: float) -> str | None:
        if self._fds:
            raise ConfigurationError("this lease is held already; release it first")
        mine = self._ticket[0] if self._ticket is not None else None
        ahead = _queue.ahead_of(self.queue_dir, self.tag, mine)
        got = self._admission.attempt(self, ahead, deadline)
        if isinstance(got, str):
            if self._ticket is None:
                said = _locks.holder_document(self.platform.name, budget_bytes=self.memory_bytes)
                self._ticket = _queue.enter(self.queue_dir, self.tag, said)
            return got
        self._leave()
        units = [t.unit for t in got]
        self.devices = tuple(u.device for u in units)
        self.device_ids = tuple(u.key for u in units)
        self._fds = [fd for t in got for fd in t.fds]
        if (env := self.platform.visible_devices_env) and units[0].value:  # lease units
            self.environ = {env: ",".join(u.value or "" for u in units)}
        else:
            self.environ = subset_environment(self.platform, self.devices)
        self.environ.update(self._admission.environ(units))
        base = _locks.holder_document(self.platform.name)
        self._written = [(t.document, {**base, "device_id": t.unit.key, **t.fields}) for t in got]
        for path, doc in self._written:
            _locks.write_holder(path, doc)
        return None

    def _leave(self) -> None:
        if self._ticket is not None:
            _queue.leave(self.queue_dir, *self._ticket)
            self._ticket = None

    def release(self) -> None:
        """Let the devices go (idempotent); their documents say they were released.

        A lease still waiting (after :meth:`try_acquire`) leaves the queue.
        """
        self._leave()
        fds, self._fds = self._fds, []
        written, self._written = self._written, []  # once: a later holder may have the file since
        for path, doc in written:
            _locks.write_holder(path, {**doc, "released": True, "released_at": time.time()})
        for fd in fds:
            _locks.unlock(fd)

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
    """Claim ``count`` devices, or a share of each one's memory, across the host.

    The devices are the visible ones, or the platform's lease units where it has them (each MIG
    slice of a MIG-enabled GPU, docs/leasing.md).

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
            or an int of bytes (at least 1 MiB), on each of ``count`` devices. Shares of several
            holders coexist on a device while they fit (docs/leasing.md, "What fits"). The lease's
            environment adds ``ACCELPLAT_LEASE_MEMORY_BYTES`` and ``..._FRACTION``.

    Returns:
        A :class:`Lease`, not yet acquired.

    Raises:
        LeaseUnsatisfiableError: At once: more devices than visible, or than could ever meet the
            minimums or hold ``memory``.
        ConfigurationError: At once: bad arguments, or a lock directory that is empty,
            unwritable or (the default) not private.
    """
    budget = None if memory is None else _shares.parse_budget(memory)
    if budget is not None and (min_free_bytes is not None or min_free_ratio is not None):
        raise ConfigurationError(
            "memory= leases a share of a device; min_free_bytes and min_free_ratio are for whole "
            "devices: give one or the other"
        )
    wanted = _validate.integer(count, "count", minimum=1)
    if min_free_bytes is not None:
        _validate.integer(min_free_bytes, "min_free_bytes", minimum=0, maximum=_locks.MAX_BYTES)
    if min_free_ratio is not None:
        min_free_ratio = _validate.number(min_free_ratio, "min_free_ratio", minimum=0, maximum=1)
    timeout = _validate.number(timeout_s, "timeout_s", minimum=0)
    if isinstance(prefer, (str, bytes)) or not all(isinstance(p, str) for p in prefer):
        raise ConfigurationError(f"prefer must be a sequence of device identities, got {prefer!r}")
    directory, plat = _locks.prepare_dir(lock_dir), resolve_platform(platform)
    clock = clock if clock is not None else default_clock(plat)
    ratio, prefers = min_free_ratio, tuple(prefer)
    return Lease(wanted, plat, directory, min_free_bytes, ratio, timeout, clock, prefers, budget)


def _pool(held: Lease) -> list[Unit]:
    """The units ``held`` may take: the platform's lease units, else its visible devices."""
    platform, seen = held.platform, dict[str, int]()
    values = tuple((optional(platform, "lease_units") or tuple)())
    views = [(optional(platform, "restricted")(v), v) for v in values]
    if not all(isinstance(v, str) and len(view.devices()) == 1 for view, v in views):
        raise ConfigurationError(f"{platform.name}: restricted() must show exactly one device")
    pairs = [(view, view.devices()[0], v) for view, v in views] or [
        (platform, d, None) for d in platform.devices()
    ]
    units = [
        Unit(d, _locks.device_key(platform.name, d, seen), view, v, v or f"device {d.index}")
        for view, d, v in pairs
    ]
    what = " lease units" if values else ""
    if held.count > len(units):
        raise LeaseUnsatisfiableError(
            f"cannot lease {held.count} device(s): {platform.name} shows this process only "
            f"{len(units)}{what} (leases stay inside the visible set)"
        )
    fits = [u for u in units if held._admission.fits(u.memory().total)]
    if len(fits) < held.count:
        raise LeaseUnsatisfiableError(
            f"{platform.name}: only {len(fits)} of {len(units)} visible device(s){what} have "
            f"enough memory in total for {held._admission.wants}; {held.count} asked for"
        )
    return fits


def lease_status(lock_dir: str | os.PathLike[str] | None = None) -> list[LeaseRecord]:
    """Say, for every device the lock directory knows, who holds it (or held it last).

    Returns:
        One :class:`LeaseRecord` per lock file that can be locked, sorted by device identity;
        a memory share is a record of its device with its ``budget_bytes``, and a device its
        shares hold is ``held``.

    Raises:
        ConfigurationError: As :func:`lease`, for the lock directory.

    Side effects:
        Takes each free lock for an instant (a shared lock) to learn whether it is held.
    """
    directory = _locks.prepare_dir(lock_dir)
    shares = _records(directory / _shares.SHARES_DIR, share=True)
    shared = {r.device_id for r in shares if r.held}
    devices = _records(directory, share=False)
    records = [replace(r, held=r.held or r.device_id in shared) for r in devices]
    return sorted(records + shares, key=lambda r: (r.device_id, r.budget_bytes is not None, r.path))


def _records(where: Path, *, share: bool) -> list[LeaseRecord]:
    records: list[LeaseRecord] = []
    for entry in sorted(where.glob("*" + LOCK)):
        slot = _shares.SLOT.fullmatch(entry.name)  # a slot: the device's key, user and number
        try:
            probe = _locks.try_lock(entry, shared=True)
        except OSError:
            continue
        if probe is not None:
            _locks.unlock(probe)
        doc = _locks.read_holder(entry.with_suffix(DOC))
        if share and (slot is None or (doc.pid is None and probe is not None)):
            continue  # a free slot of nobody's
        key = slot.group(1) if share and slot else entry.name.removesuffix(LOCK)
        doc = replace(doc, device_id=key, held=probe is None, path=str(entry))
        records.append(replace(doc, budget_bytes=(doc.budget_bytes or 0) if share else None))
    return records
