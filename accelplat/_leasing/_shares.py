"""Memory shares: the budget, share slots, and the admission rule (what fits beside what).

A share holds its device's lock *shared* (shares coexist; a whole-device lease excludes them)
and one share slot, ``shares/<device>.<uid>-<n>.lock``, whose holder document carries its budget.
The admission itself (:class:`accelplat._leasing.Share`) reads these rules.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from accelplat import _validate
from accelplat._leasing import _locks
from accelplat._leasing._locks import LOCK, LeaseRecord, Unit
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
