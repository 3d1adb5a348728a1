"""Value types of memory use over time: snapshots, the result of a wait, and who holds memory.

They are what :mod:`accelplat._memory`, the leak check and the command line answer with, and what
a platform's ``memory_holders`` returns. Like the types of :mod:`accelplat._types` they are
frozen dataclasses made by ``value_type``; they live apart so that detection and a first memory
query, which need none of them, do not create them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import field

from accelplat._types import GIB, MemoryInfo, value_type

__all__ = ["HolderState", "MemoryHolder", "SettleResult", "UsageSnapshot"]


class HolderState(str, enum.Enum):
    """What is known about a process that holds device memory."""

    SELF = "self"
    """The calling process itself."""
    CHILD = "child"
    """A live descendant of the calling process."""
    ALIVE = "alive"
    """Some other live process."""
    ZOMBIE = "zombie"
    """Exited but not yet reaped; its memory may still be held."""
    GONE = "gone"
    """No such process any more (the driver still lists it, or its pid is in another namespace)."""


@value_type(frozen=True)
class MemoryHolder:
    """A process that holds memory on a device, where the vendor can tell.

    Attributes:
        pid: Process id as the driver reports it (a host pid, even inside a container).
        used_bytes: Bytes it holds, or ``None`` where the driver does not say.
        state: Whether the pid is this process, a child, alive, a zombie or gone.
        name: Process name where it could be read, else ``""``.
    """

    pid: int
    used_bytes: int | None
    state: HolderState
    name: str = ""

    def __init__(
        self, pid: int, used_bytes: int | None, state: HolderState, name: str = ""
    ) -> None:
        object.__setattr__(self, "pid", pid)
        object.__setattr__(self, "used_bytes", used_bytes)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "name", name)


@value_type(frozen=True)
class UsageSnapshot:
    """Memory of several devices sampled together.

    Attributes:
        timestamp: ``time.monotonic()`` when the sample was taken.
        wall_time: ``time.time()`` of the same moment, for logs.
        memory: Per visible device index, its ``MemoryInfo``.
        holders: Per visible device index, the processes holding memory there; a device missing
            from this mapping means the vendor cannot tell. Empty when not given (or ``None``).
    """

    timestamp: float
    wall_time: float
    memory: Mapping[int, MemoryInfo]
    holders: Mapping[int, tuple[MemoryHolder, ...]] = field(default_factory=dict)

    def __init__(
        self,
        timestamp: float,
        wall_time: float,
        memory: Mapping[int, MemoryInfo],
        holders: Mapping[int, tuple[MemoryHolder, ...]] | None = None,
    ) -> None:
        object.__setattr__(self, "timestamp", timestamp)
        object.__setattr__(self, "wall_time", wall_time)
        object.__setattr__(self, "memory", memory)
        object.__setattr__(self, "holders", {} if holders is None else holders)

    def used_gib(self) -> dict[int, tuple[float, float]]:
        """Return per device ``(used GiB, total GiB)``, the shape vLLM's test helpers use."""
        return {d: (m.used / GIB, m.total / GIB) for d, m in self.memory.items()}

    def describe(self) -> str:
        """Return one line such as ``"0=1.25/139.81 GiB; 1=0.00/139.81 GiB"``."""
        return "; ".join(
            f"{d}={m.used / GIB:.2f}/{m.total / GIB:.2f} GiB"
            for d, m in sorted(self.memory.items())
        )


@value_type(frozen=True)
class SettleResult:
    """What a memory wait did.

    Attributes:
        waited_s: Seconds from the call to its return.
        polls: Number of samples taken, the first included.
        snapshot: The last sample, which met the target.
        already_settled: ``True`` when the first sample met the target and no waiting happened.
        targets: Per device, the usage in bytes at or below which it counts as clear; empty
            when not given (or ``None``).
    """

    waited_s: float
    polls: int
    snapshot: UsageSnapshot
    already_settled: bool
    targets: Mapping[int, int] = field(default_factory=dict)

    def __init__(
        self,
        waited_s: float,
        polls: int,
        snapshot: UsageSnapshot,
        already_settled: bool,
        targets: Mapping[int, int] | None = None,
    ) -> None:
        object.__setattr__(self, "waited_s", waited_s)
        object.__setattr__(self, "polls", polls)
        object.__setattr__(self, "snapshot", snapshot)
        object.__setattr__(self, "already_settled", already_settled)
        object.__setattr__(self, "targets", {} if targets is None else targets)
