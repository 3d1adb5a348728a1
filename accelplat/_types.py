"""Value types shared by every layer of accelplat.

All sizes are in bytes and all durations in seconds. Every type here is a frozen dataclass, so
values can be shared between threads, cached and compared freely: ``dataclasses.fields``,
``asdict`` and ``replace`` work on them, assigning to a field raises
``dataclasses.FrozenInstanceError``, and equality, hashing and ``repr`` are the field-wise ones
of ``@dataclass(frozen=True)``. They are built by ``value_type``, which compiles less code at
import (see :func:`_frozen_value_type` for why). This module imports nothing from the rest of
the package.
"""

from __future__ import annotations

import math
import operator
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = [
    "GIB",
    "MIB",
    "Candidate",
    "DeviceInfo",
    "FeatureRule",
    "GraphSupport",
    "MemoryInfo",
    "ProbeResult",
    "ReleaseProfile",
    "value_type",
]

MIB = 1024**2
"""Bytes in one mebibyte."""

GIB = 1024**3
"""Bytes in one gibibyte."""

_T = TypeVar("_T")


def _fields_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Return a function giving the tuple of the values of ``names`` of an object."""
    if len(names) >= 2:
        return operator.attrgetter(*names)
    if len(names) == 1:
        get_one = operator.attrgetter(names[0])
        return lambda obj: (get_one(obj),)
    return lambda obj: ()


def _frozen_value_type(cls: type[_T]) -> type[_T]:
    """Make ``cls`` a frozen dataclass, compiling only two of its methods.

    ``dataclass`` writes each method it adds as source text and compiles it: about 0.15 ms per
    method here, which made the value types a third of detection on a host without an
    accelerator. Here ``dataclass(frozen=True)`` records the fields (``fields``, ``asdict``,
    ``replace``, ``__match_args__`` and subclassing by a frozen dataclass work as for any
    frozen dataclass) and adds only the refusal to assign or delete a field; the class writes
    its own ``__init__`` (assigning with ``object.__setattr__`` and calling ``__post_init__``
    where it has one); equality, hashing and ``repr`` are functions shared by every value type
    that read its fields' names. The result compares, hashes, prints and refuses changes as
    the generated methods do; a test holds every value type against a
    ``@dataclass(frozen=True)`` twin.
    """
    cls = dataclass(init=False, repr=False, eq=False, frozen=True)(cls)
    own = fields(cls)  # type: ignore[arg-type]
    compared = _fields_getter(tuple(f.name for f in own if f.compare))
    hashed = _fields_getter(tuple(f.name for f in own if (f.compare if f.hash is None else f.hash)))
    shown = tuple(f.name for f in own if f.repr)

    def _eq(self: Any, other: object) -> object:
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented

    def _hash(self: Any) -> int:
        return hash(hashed(self))

    @reprlib.recursive_repr()
    def _repr(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{self.__class__.__qualname__}({inner})"

    for name, method in (("__eq__", _eq), ("__hash__", _hash), ("__repr__", _repr)):
        method.__name__ = name
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)
    return cls


if TYPE_CHECKING:
    # Type checkers see the value types as what they are: frozen dataclasses.
    from dataclasses import dataclass as value_type
else:

    def value_type(*, frozen: bool) -> Callable[[type[_T]], type[_T]]:
        """Class decorator of the value types, written ``@value_type(frozen=True)``.

        Args:
            frozen: Must be ``True``; spelled out so that the code says what type checkers see.

        Returns:
            The decorator, :func:`_frozen_value_type`.

        Raises:
            TypeError: For ``frozen`` other than ``True``.
        """
        if frozen is not True:
            raise TypeError("value types are frozen: write @value_type(frozen=True)")
        return _frozen_value_type


@value_type(frozen=True)
class MemoryInfo:
    """Memory of one device at one moment, in bytes.

    Attributes:
        free: Bytes a new allocation could still obtain.
        total: Bytes usable by applications (for NVIDIA: the NVML total less the driver's
            reserved memory, which equals what ``torch.cuda.mem_get_info`` calls total).
        used: Bytes held by applications and their contexts.
        reserved: Bytes the driver or firmware keeps for itself and never hands out; ``0`` where
            the vendor does not report it.
        source: Where the figures came from, e.g. ``"nvml-v2"``, ``"sysfs"``, ``"cgroup-v2"``.
    """

    free: int
    total: int
    used: int
    reserved: int = 0
    source: str = ""

    def __init__(
        self, free: int, total: int, used: int, reserved: int = 0, source: str = ""
    ) -> None:
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "used", used)
        object.__setattr__(self, "reserved", reserved)
        object.__setattr__(self, "source", source)

    @property
    def used_ratio(self) -> float:
        """Fraction of ``total`` in use, in ``[0, 1]``; ``0.0`` for a device of zero size."""
        if self.total <= 0:
            return 0.0
        return min(1.0, max(0.0, self.used / self.total))


def memory_info_fast(free: int, total: int, used: int, reserved: int, source: str) -> MemoryInfo:
    """Build a :class:`MemoryInfo` without the frozen-dataclass ``__init__``, for polling paths.

    The result is equal to, hashes like and behaves exactly as ``MemoryInfo(free, total, used,
    reserved, source)``; it skips the five ``object.__setattr__`` calls a frozen ``__init__``
    makes (about half a microsecond, a tenth of an NVML memory query). Arguments are trusted.
    """
    obj = object.__new__(MemoryInfo)
    obj.__dict__.update(free=free, total=total, used=used, reserved=reserved, source=source)
    return obj


@value_type(frozen=True)
class DeviceInfo:
    """Identity of one visible device.

    Attributes:
        index: The visible (logical) index, as torch numbers devices in this process.
        physical_index: The index the vendor's management library uses (NVML, sysfs card,
            Level Zero), after the visible-devices variable has been applied.
        name: Marketing name as the vendor reports it.
        uuid: Stable identifier where the vendor has one (``GPU-…``, ``MIG-…``), else ``None``.
        pci_bus_id: PCI bus address (``0000:3b:00.0``) where known, else ``None``.
        arch: Hardware architecture as its vendor's compilers name it: ``"sm_90"`` (NVIDIA),
            ``"gfx942"`` (AMD), an Intel GPU architecture (``"pvc"``, ``"bmg"``), or the
            CPU's instruction set (``"x86_64"``, ``"aarch64"``); ``None`` where it could not be
            read. Read without a device context.
        compute_capability: ``(major, minor)`` of an NVIDIA GPU (``(9, 0)`` on an H100/H200),
            ``None`` on every other platform or where unknown.
    """

    index: int
    physical_index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    arch: str | None = None
    compute_capability: tuple[int, int] | None = None

    def __init__(  # noqa: PLR0917 - positional, as the dataclass's own __init__ would be
        self,
        index: int,
        physical_index: int,
        name: str,
        uuid: str | None = None,
        pci_bus_id: str | None = None,
        arch: str | None = None,
        compute_capability: tuple[int, int] | None = None,
    ) -> None:
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "physical_index", physical_index)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "uuid", uuid)
        object.__setattr__(self, "pci_bus_id", pci_bus_id)
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "compute_capability", compute_capability)

    @property
    def stable_id(self) -> str | None:
        """An identity that no visible-devices variable or enumeration order can change.

        Returns:
            The UUID where the vendor has one, else the PCI bus address, else ``None`` (then
            only ``physical_index`` identifies the device, which is stable for one machine).
        """
        return self.uuid or self.pci_bus_id or None


@value_type(frozen=True)
class FeatureRule:
    """One condition under which a platform's device has a built-in capability, as data.

    A backend lists, per capability name, the rules under which its devices have it (its
    ``FEATURES`` table); the first rule a device meets decides, and a device that meets none
    lacks it. All set conditions must hold; a rule with none holds for every device.

    Attributes:
        min_compute_capability: Lowest NVIDIA compute capability, e.g. ``(8, 9)``.
        archs: Architectures (``"gfx942"``) or families (``"gfx12*"``) the device must be.
        value: The variant the rule gives, e.g. the fp8 format ``"e4m3fnuz"``.
        note: How it is provided, when worth saying (``"computed by torch on any CPU"``).
    """

    min_compute_capability: tuple[int, int] | None = None
    archs: tuple[str, ...] = ()
    value: str | None = None
    note: str = ""

    def __init__(
        self,
        min_compute_capability: tuple[int, int] | None = None,
        archs: tuple[str, ...] = (),
        value: str | None = None,
        note: str = "",
    ) -> None:
        object.__setattr__(self, "min_compute_capability", min_compute_capability)
        object.__setattr__(self, "archs", archs)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "note", note)


@value_type(frozen=True)
class ReleaseProfile:
    """How a platform gives device memory back, used by the settle algorithm as data.

    Attributes:
        lazy: ``True`` when memory returns some time after the holder released it (ROCm's
            deferred teardown, Level Zero's deferred frees), so the next user must wait.
        stable_duration_s: How long usage must stay within tolerance before it counts as settled.
        settle_timeout_s: Default time limit for a settle wait.
        idle_floor_bytes: Usage an idle device never drops below (firmware, display, runtime); a
            ratio threshold below this is raised to it.
    """

    lazy: bool
    stable_duration_s: float
    settle_timeout_s: float
    idle_floor_bytes: int = 0

    def __init__(
        self,
        lazy: bool,
        stable_duration_s: float,
        settle_timeout_s: float,
        idle_floor_bytes: int = 0,
    ) -> None:
        object.__setattr__(self, "lazy", lazy)
        object.__setattr__(self, "stable_duration_s", stable_duration_s)
        object.__setattr__(self, "settle_timeout_s", settle_timeout_s)
        object.__setattr__(self, "idle_floor_bytes", idle_floor_bytes)
        self.__post_init__()

    def __post_init__(self) -> None:
        for name in ("stable_duration_s", "settle_timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"ReleaseProfile.{name} must be finite and >= 0, got {value!r}")
        if self.idle_floor_bytes < 0:
            raise ValueError(
                f"ReleaseProfile.idle_floor_bytes must be >= 0, got {self.idle_floor_bytes!r}"
            )


@value_type(frozen=True)
class GraphSupport:
    """Whether the platform can capture and replay device graphs.

    This is *capability*, decided from installed versions without importing torch. Whether an
    engine has graphs *enabled* (vLLM's ``enforce_eager``) is a separate question.

    Attributes:
        available: ``True`` when graph capture can work here.
        api: The torch API that captures graphs (``"torch.cuda.CUDAGraph"``), or ``None``.
        reason: One sentence saying why, for skip messages and ``accelplat info``.
    """

    available: bool
    api: str | None
    reason: str

    def __init__(self, available: bool, api: str | None, reason: str) -> None:
        object.__setattr__(self, "available", available)
        object.__setattr__(self, "api", api)
        object.__setattr__(self, "reason", reason)


@value_type(frozen=True)
class ProbeResult:
    """Outcome of a platform's cheap availability probe.

    Attributes:
        available: ``True`` when the platform has at least one usable device here.
        reason: Why it is or is not available, in one sentence.
    """

    available: bool
    reason: str

    def __init__(self, available: bool, reason: str) -> None:
        object.__setattr__(self, "available", available)
        object.__setattr__(self, "reason", reason)


@value_type(frozen=True)
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

    def __init__(
        self, name: str, available: bool, chosen: bool, reason: str, builtin: bool = True
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "available", available)
        object.__setattr__(self, "chosen", chosen)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "builtin", builtin)
