"""Memory shares: the budget, share slots, and the admission rule (what fits beside what).

A share holds its device's lock *shared* (shares coexist; a whole-device lease excludes them)
and one share slot, ``shares/<device>.<uid>-<n>.lock``, whose holder document carries its budget.
Admissions are made one at a time under ``queue/<platform>.admit``, tried without blocking.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from accelplat import _validate
from accelplat._leasing import _locks, _queue
from accelplat._leasing._locks import LOCK, LeaseRecord, Leasing, Outcome, Taken, Unit
from accelplat._owners import held_by_tree, sample
from accelplat._types import MIB, MemoryInfo
from accelplat._util import format_bytes, shown
from accelplat.errors import ConfigurationError

# set in a share's environment: its budget per device, and that budget as a fraction of the
# smallest leased device's total (for torch.cuda.set_per_process_memory_fraction)
ENV_MEMORY_BYTES = "ACCELPLAT_LEASE_MEMORY_BYTES"
ENV_MEMORY_FRACTION = "ACCELPLAT_LEASE_MEMORY_FRACTION"
SHARES_DIR = "shares"
MAX_SHARES = 64  # share slots per device and user
MIN_SHARE_BYTES = MIB  # a smaller int budget is a unit mistake (12 meant 12 GiB)
SLOT = re.compile(r"(.+)\.([0-9]{1,10}-[0-9]{1,6})\.lock")  # <device key>.<uid>-<n>.lock


def parse_budget(memory: object) -> int:
    """A share's budget in bytes: text with a unit, or an int of at least 1 MiB."""
    if isinstance(memory, int) and not isinstance(memory, bool) and 0 <= memory < MIN_SHARE_BYTES:
        hint = f"a size with a unit ('{memory}GiB') or an int of bytes ({memory} * accelplat.GIB)"
        raise ConfigurationError(f"memory={memory} is {memory} bytes, below 1 MiB: give {hint}")
    budget = _validate.parse_size(memory, argument="memory")  # type: ignore[arg-type]
    if not MIN_SHARE_BYTES <= budget <= _locks.MAX_BYTES:
        raise ConfigurationError(f"memory must be from 1MiB to 8EiB, got {shown(memory)}")
    return budget


def promises(shares: Path, key: str) -> list[LeaseRecord]:
    """The holder documents of device ``key``'s share slots that are held or cannot be told.

    A slot whose lock this user cannot open (another user's, made under a umask of 077 by an
    older version) may be held: it counts, with the budget its document says (the whole device
    when that cannot be read either).
    """
    try:
        names = os.listdir(shares)
    except OSError:
        return []
    slots = [m[0] for m in map(SLOT.fullmatch, sorted(names)) if m is not None and m[1] == key]
    live = [name for name in slots if _locks.held(shares / name) is not False]
    return [_locks.read_holder(shares / name.replace(LOCK, _locks.DOC)) for name in live]


def room(unit: Unit, info: MemoryInfo, live: Sequence[LeaseRecord], need: int) -> tuple[int, str]:
    """The bytes of ``unit`` a new share may take, and how they were counted (docs/leasing.md).

    The rule: other processes' memory (read live) plus, for each holder of shares, the larger of
    its budgets and what its process tree uses (the driver's holders) must leave room. Where the
    driver cannot tell the holders apart, the larger of used memory and the budgets counts (the
    rule before owners). The holders are read only where ``need`` lies between the two bounds.
    """
    budgets: dict[int | None, int] = {}  # per holder pid (an unreadable budget: the whole device)
    for p in live:
        budgets[p.pid] = budgets.get(p.pid, 0) + (p.budget_bytes or info.total)
    promised, note = sum(budgets.values()), ""
    low, left = info.total - info.used - promised, info.total - max(info.used, promised)
    if low < need <= left:  # only the holders can tell: read them
        index = unit.device.index
        reading = sample(unit.view, (index,), remember=False)
        info, holders = reading.memory[index], reading.holders.get(index)
        left = info.total - max(info.used, promised)
        if holders is not None and not reading.attribution[index].reason:
            uses = {pid: held_by_tree(holders, pid) if pid else 0 for pid in budgets}
            others = max(0, info.used - sum(uses.values()))
            left = info.total - others - sum(max(b, uses[pid]) for pid, b in budgets.items())
            note = f"; {format_bytes(others)} of it used by others"
    elif need <= low:  # it fits even if every holder used its budget beside what is used now
        left = low
    who = f" ({promised_to(live)})" if live else ""
    return left, (
        f"{format_bytes(max(left, 0))} room ({format_bytes(info.used)} used, "
        f"{format_bytes(promised)} promised{who}{note})"
    )


def promised_to(live: Sequence[LeaseRecord]) -> str:
    """``12.00 GiB to pid 42 (alice, since …): python t.py, …``."""
    return ", ".join(f"{format_bytes(p.budget_bytes)} to {_locks.describe(p)}" for p in live)


class Share:
    """Admission of a share: ``budget`` bytes on each of ``count`` units with room, all or none."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.wants = f"memory={format_bytes(budget)}"

    def fits(self, total: int) -> bool:
        return total >= self.budget

    def environ(self, units: Sequence[Unit]) -> dict[str, str | None]:
        """The budget's variables: bytes, and a fraction of the smallest unit's total."""
        fraction = min(1.0, self.budget / max(min(u.memory().total for u in units), 1))
        rounded = f"{math.floor(fraction * 1e6) / 1e6:.6f}"  # down: never more than the budget
        return {ENV_MEMORY_BYTES: str(self.budget), ENV_MEMORY_FRACTION: rounded}

    def attempt(self, lease: Leasing, ahead: LeaseRecord | None, deadline: float) -> Outcome:
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
            shares = _locks.directory(lease.lock_dir / SHARES_DIR, None)
            rows, why = [], []
            for rank, unit in enumerate(lease.pool):
                info = unit.memory()  # live, under the admission lock
                keep = _queue.kept_free(ahead, info.total)
                left, detail = room(unit, info, promises(shares, unit.key), self.budget + keep)
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
        for slot in range(MAX_SHARES):
            # each user has its own slots: in a shared (sticky) directory another user's holder
            # document could not be replaced, and its stale budget would be read for ours
            name = f"{unit.key}.{os.geteuid()}-{slot}"
            with contextlib.suppress(OSError):  # a planted non-lock: the next slot
                slot_fd = _locks.try_lock(shares / (name + LOCK))
                if slot_fd is not None:
                    doc = shares / (name + _locks.DOC)
                    return Taken(unit, (device_fd, slot_fd), doc, {"budget_bytes": self.budget})
        _locks.unlock(device_fd)
        return f"all {MAX_SHARES} share slots of this user are held"
