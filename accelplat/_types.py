"""Value types shared by every layer of accelplat: devices, memory, holders, probe outcomes.

Sizes are in bytes, durations in seconds; every type is a frozen dataclass (shared between
threads, cached, compared freely). This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """Memory of one device at one moment, in bytes.

    Attributes:
        free: Bytes a new allocation could still obtain.
        total: Bytes usable by applications (NVIDIA: NVML's total less reserved, as torch's).
        used: Bytes held by applications and their contexts.
        reserved: Bytes the driver or firmware keeps and never hands out; ``0`` where unreported.
        source: Where the figures came from, e.g. ``"nvml-v2"``, ``"sysfs"``, ``"cgroup-v2"``.
    """

    free: int
    total: int
    used: int
    reserved: int = 0
    source: str = ""

    @property
    def used_ratio(self) -> float:
        """Fraction of ``total`` in use, in ``[0, 1]``; ``0.0`` for a device of zero size."""
        if self.total <= 0:
            return 0.0
        return min(1.0, max(0.0, self.used / self.total))


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Identity of one visible device.

    Attributes:
        index: The visible (logical) index, as torch numbers devices in this process.
        physical_index: The index the vendor's management library (NVML, sysfs, Level Zero) uses.
        name: Marketing name as the vendor reports it.
        uuid: Stable identifier where the vendor has one (``GPU-…``, ``MIG-…``), else ``None``.
        pci_bus_id: PCI bus address (``0000:3b:00.0``) where known, else ``None``.
        arch: As compilers name it (``"sm_90"``, ``"gfx942"``, ``"pvc"``, ``"x86_64"``) or ``None``.
        compute_capability: ``(major, minor)`` as torch reports it: NVIDIA's (``(9, 0)``: H100),
            or on ROCm the one HIP derives from the gfx target (``(9, 4)``: gfx942); ``None``
            elsewhere (XPU, CPU), as vLLM's ``get_device_capability()``.
    """

    index: int
    physical_index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    arch: str | None = None
    compute_capability: tuple[int, int] | None = None

    @property
    def stable_id(self) -> str | None:
        """An identity no visible-devices variable changes: UUID, else PCI address, else None."""
        return self.uuid or self.pci_bus_id or None


@dataclass(frozen=True, slots=True)
class FeatureRule:
    """One condition under which a platform's device has a built-in capability, as data.

    In a backend's ``FEATURES``, the first rule a device meets decides (none met: it lacks it).

    Attributes:
        min_compute_capability: Lowest compute capability (:attr:`DeviceInfo.compute_capability`).
        archs: Architectures (``"gfx942"``) or families (``"gfx12*"``) the device must be.
        value: The variant the rule gives, e.g. the fp8 format ``"e4m3fnuz"``.
        note: How it is provided, when worth saying (``"computed by torch on any CPU"``).
    """

    min_compute_capability: tuple[int, int] | None = None
    archs: tuple[str, ...] = ()
    value: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseProfile:
    """How a platform gives device memory back, used by the settle algorithm as data.

    Attributes:
        lazy: ``True`` when memory returns some time after its release (ROCm, Level Zero).
        stable_duration_s: How long usage must stay within tolerance before it counts as settled.
        settle_timeout_s: Default time limit for a settle wait.
        idle_floor_bytes: Usage an idle device never drops below; lower thresholds are raised.

    Raises:
        ValueError: For a negative or non-finite duration or floor.
    """

    lazy: bool
    stable_duration_s: float
    settle_timeout_s: float
    idle_floor_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("stable_duration_s", "settle_timeout_s", "idle_floor_bytes"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"ReleaseProfile.{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class GraphSupport:
    """Whether the platform can capture and replay device graphs (not whether an engine does).

    Attributes:
        available: ``True`` when graph capture can work here.
        api: The torch API that captures graphs (``"torch.cuda.CUDAGraph"``), or ``None``.
        reason: One sentence saying why, for skip messages and ``accelplat info``.
    """

    available: bool
    api: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Outcome of a platform's cheap availability probe.

    Attributes:
        available: ``True`` when the platform has at least one usable device here.
        reason: Why it is or is not available, in one sentence.
    """

    available: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """One platform considered by detection, and what became of it.

    Attributes:
        name: Registered platform name.
        available: Whether its probe found it usable.
        chosen: Whether detection selected it.
        reason: The probe's reason, or why loading it failed.
        builtin: ``False`` for platforms that come from plugins or ``register_platform``.
    """

    name: str
    available: bool
    chosen: bool
    reason: str
    builtin: bool = True


class HolderState(str, enum.Enum):
    """What is known about a process that holds device memory."""

    SELF = "self"
    CHILD = "child"  # a live descendant of the calling process
    ALIVE = "alive"
    ZOMBIE = "zombie"  # exited, not yet reaped: its memory may still be held
    GONE = "gone"  # the driver still lists it, or its pid is in another namespace


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Attribution:
    """Whose memory one device's used bytes are, where the driver tells per-process memory.

    Attributes:
        used: The device's used bytes (``MemoryInfo.used``) at the same sample.
        self_bytes: Bytes this process holds (its device context included); ``None``: unknown.
        children: Holders that are this process's descendants, alive or exited but still listed.
        others: Every other holder: co-tenants, and exited processes not known to be ours.
        reason: Empty when attributed; else why not (holders unlisted, bytes unreported, a pid
            namespace, the host CPU), and the device-wide rules apply.
    """

    used: int
    self_bytes: int | None
    children: tuple[MemoryHolder, ...] = ()
    others: tuple[MemoryHolder, ...] = ()
    reason: str = ""

    @property
    def available(self) -> bool:
        """Whether per-process attribution holds (``reason`` is empty)."""
        return not self.reason

    @property
    def children_bytes(self) -> int:
        """Bytes the listed descendants hold (``0`` for a holder whose bytes are unreported)."""
        return sum(h.used_bytes or 0 for h in self.children)

    @property
    def others_bytes(self) -> int:
        """Bytes other processes hold, as listed (unreported bytes count ``0``)."""
        return sum(h.used_bytes or 0 for h in self.others)

    @property
    def ours_bytes(self) -> int | None:
        """This process's bytes and its descendants'; ``None`` when not attributed."""
        if not self.available or self.self_bytes is None:
            return None
        return self.self_bytes + self.children_bytes

    def describe(self) -> str:
        """Return one line: ``"self 0.51 GiB, children 0.00 GiB, others 20.50 GiB (pid 7 …)"``."""
        if not self.available:
            return f"attribution unavailable: {self.reason}"
        shown = sorted(self.others, key=lambda h: -(h.used_bytes or 0))[:3]
        names = ", ".join(
            f"pid {h.pid}{f' {h.name!r}' if h.name else ''} {(h.used_bytes or 0) / GIB:.2f} GiB"
            for h in shown
        )
        more = f", +{len(self.others) - 3} more" if len(self.others) > 3 else ""
        return (
            f"self {(self.self_bytes or 0) / GIB:.2f} GiB, children {self.children_bytes / GIB:.2f}"
            f" GiB, others {self.others_bytes / GIB:.2f} GiB"
            + (f" ({names}{more})" if names else "")
        )


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """Memory of several devices sampled together.

    Attributes:
        timestamp: ``time.monotonic()`` when the sample was taken.
        wall_time: ``time.time()`` of the same moment, for logs.
        memory: Per visible device index, its ``MemoryInfo``.
        holders: Per visible device index, the processes holding memory (missing: cannot tell).
        attribution: Per visible device index, whose memory it is (asked with holders).
    """

    timestamp: float
    wall_time: float
    memory: Mapping[int, MemoryInfo]
    holders: Mapping[int, tuple[MemoryHolder, ...]] = field(default_factory=dict)
    attribution: Mapping[int, Attribution] = field(default_factory=dict)

    def used_gib(self) -> dict[int, tuple[float, float]]:
        """Return per device ``(used GiB, total GiB)``, the shape vLLM's test helpers use."""
        return {d: (m.used / GIB, m.total / GIB) for d, m in self.memory.items()}

    def describe(self) -> str:
        """Return one line such as ``"0=1.25/139.81 GiB; 1=0.00/139.81 GiB"``."""
        return "; ".join(
            f"{d}={m.used / GIB:.2f}/{m.total / GIB:.2f} GiB"
            for d, m in sorted(self.memory.items())
        )


@dataclass(frozen=True, slots=True)
class SettleResult:
    """What a memory wait did.

    Attributes:
        waited_s: Seconds from the call to its return.
        polls: Number of samples taken, the first included.
        snapshot: The last sample, which met the target.
        already_settled: ``True`` when the first sample met the target and no waiting happened.
        targets: Per device, the usage in bytes at or below which it counts as clear.
        raised_targets: The ``targets`` the platform's idle floor raised, per device.
        owners: ``"all"`` when the wait judged whole devices; ``"ours"`` when it judged only the
            memory of this process and its descendants (``snapshot.attribution`` says whose).
        note: Why an owner-aware wait fell back to whole devices, or the co-tenants it did not
            wait for; ``""`` when there is nothing to say.
    """

    waited_s: float
    polls: int
    snapshot: UsageSnapshot
    already_settled: bool
    targets: Mapping[int, int] = field(default_factory=dict)
    raised_targets: Mapping[int, int] = field(default_factory=dict)
    owners: str = "all"
    note: str = ""
