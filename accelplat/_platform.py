"""The :class:`Platform` protocol every backend satisfies, and the :class:`BasePlatform` ABC.

Built-in backends subclass :class:`BasePlatform`; plugins may satisfy :class:`Platform` alone.
The members a plugin may leave out are listed once, with their defaults, in
:data:`OPTIONAL_MEMBERS`; read them with :func:`optional`.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from accelplat import _validate
from accelplat._types import (
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat._util import Clock
from accelplat.errors import ConfigurationError

StartMethod = Literal["fork", "spawn", "forkserver"]

_F = TypeVar("_F", bound=Callable[..., Any])

if sys.version_info >= (3, 12):
    from typing import override as override  # noqa: PLC0414 (the backends import it from here)
elif TYPE_CHECKING:
    from typing_extensions import override as override  # noqa: PLC0414 (as above)
else:
    # ``@override`` matters to the type checker only. Before Python 3.12 its one home is
    # typing_extensions, whose import costs a tenth of detection on a CPU host; at run time
    # the decorator is the identity here (it does not set ``__override__``).
    def override(method: _F) -> _F:
        """Return ``method`` unchanged: it overrides a base class's member (checked by mypy)."""
        return method


# Members of a platform beyond Platform, each with the value meant when it is absent.
OPTIONAL_MEMBERS: Mapping[str, Any] = {
    "is_accelerator": True,  # the devices are accelerators, not the host CPU
    "clock": None,  # the Clock waits read and sleep on; None: real time
    "FEATURES": {},  # per built-in capability, its FeatureRules (docs/capabilities.md)
    "driver_version": None,  # a method returning the vendor driver's version
    "visible_devices_empty_hides_all": None,  # an empty variable hides all (CUDA's does)?
    # (devices) -> {variable: value or None}, showing a child exactly those devices
    "visible_devices_environment": None,
    "visible_devices_shadowed_by": (),  # variables that win when set (ROCm: HIP_VISIBLE_DEVICES)
    # memory_holders names processes by host pid (drivers do): unmatched inside a pid namespace
    "holder_pids_are_host_pids": False,
    "holders_note": "",  # why memory_holders answers None here, when the backend knows better
    # () -> visible-devices values, one per unit a scheduler may hand a child, where the units
    # differ from this process's visible devices (MIG instances of a bare-metal host); absent or
    # (): the visible devices are the units
    "lease_units": None,
    # (value) -> this platform as a child started with visible_devices_env=value would see it
    "restricted": None,
}


def optional(platform: object, name: str) -> Any:
    """Return the optional member ``name`` of ``platform``, or its default when it has none."""
    return getattr(platform, name, OPTIONAL_MEMBERS[name])


@runtime_checkable
class Platform(Protocol):
    """What every accelplat backend provides.

    Devices are *visible* indices, numbered as torch numbers them in this process; a method given
    one that is not visible raises :class:`~accelplat.errors.DeviceNotFoundError`.

    Attributes:
        name: Registered name, e.g. ``"cuda"``, ``"rocm"``, ``"xpu"``, ``"cpu"``.
        device_type: The torch device type (``"cuda"`` for both CUDA and ROCm).
        visible_devices_env: The variable that selects visible devices, or ``None``.
        release: How memory comes back (lazy or not, stability window, timeout, idle floor).
        graph: Whether graph capture is possible, decided without importing torch.
        default_memory_utilization: Fraction of device memory an engine should aim to use.
        preferred_start_method: ``"fork"`` where forking after device use is safe, else ``"spawn"``.
        context_free: ``False`` when memory queries need a device context or a framework.
    """

    @property
    def name(self) -> str: ...

    @property
    def device_type(self) -> str: ...

    @property
    def visible_devices_env(self) -> str | None: ...

    @property
    def release(self) -> ReleaseProfile: ...

    @property
    def graph(self) -> GraphSupport: ...

    @property
    def default_memory_utilization(self) -> float: ...

    @property
    def preferred_start_method(self) -> StartMethod: ...

    @property
    def context_free(self) -> bool: ...

    def device_count(self) -> int:
        """Return the number of visible devices."""
        ...

    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible devices in visible-index order."""
        ...

    def memory_info(self, device: int) -> MemoryInfo:
        """Return memory of visible device ``device`` in bytes."""
        ...

    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return processes holding memory on ``device``, or ``None`` when unknown."""
        ...


class BasePlatform(ABC):
    """Base class of accelplat's backends: the protocol, its optional members and their defaults.

    A subclass sets the class attributes (``RELEASE``, ``GRAPH``) and implements :meth:`probe`,
    :meth:`devices` and :meth:`_memory_info`, which :meth:`memory_info` calls with a checked index.
    """

    name: ClassVar[str] = "base"
    device_type: ClassVar[str] = "cpu"
    visible_devices_env: ClassVar[str | None] = None
    default_memory_utilization: ClassVar[float] = 0.92
    preferred_start_method: ClassVar[StartMethod] = "fork"
    context_free: ClassVar[bool] = True
    is_accelerator: ClassVar[bool] = True
    RELEASE: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0
    )
    GRAPH: ClassVar[GraphSupport] = GraphSupport(False, None, "this platform has no graph capture")
    visible_devices_empty_hides_all: ClassVar[bool | None] = None
    visible_devices_shadowed_by: ClassVar[tuple[str, ...]] = ()
    clock: Clock | None = None
    holder_pids_are_host_pids: ClassVar[bool] = False
    holders_note: ClassVar[str] = ""
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {}

    @property
    def release(self) -> ReleaseProfile:
        """Release behaviour of device memory (the class's ``RELEASE``)."""
        return self.RELEASE

    @property
    def graph(self) -> GraphSupport:
        """Graph-capture capability (the class's ``GRAPH``)."""
        return self.GRAPH

    @classmethod
    @abstractmethod
    def probe(cls) -> ProbeResult:
        """Return whether this platform is usable here; cheap, no framework, no device context."""

    @abstractmethod
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible devices in visible-index order."""

    @abstractmethod
    def _memory_info(self, device: int) -> MemoryInfo:
        """Return memory of visible device ``device``, an index :meth:`check_device` accepted."""

    def driver_version(self) -> str | None:
        """Return the vendor driver's version, for reports; ``None`` (the default) when unknown."""
        return None

    def lease_units(self) -> tuple[str, ...]:
        """Return units a scheduler may hand a child beyond the visible devices; ``()``: none."""
        return ()

    def restricted(self, value: str) -> BasePlatform:
        """Return this platform as a child started with ``visible_devices_env=value`` sees it.

        Raises:
            ConfigurationError: Always, here: a platform without lease units has no such view.
        """
        raise ConfigurationError(f"the {self.name} platform has no lease unit {value!r}")

    def device_count(self) -> int:
        """Return the number of visible devices (``len(self.devices())`` by default)."""
        return len(self.devices())

    def check_device(self, device: object) -> int:
        """Return ``device`` as an ``int``; DeviceNotFoundError unless it is a visible index."""
        return _validate.device_index(device, self.device_count(), self.name)

    def memory_info(self, device: int) -> MemoryInfo:
        """Return memory of visible device ``device`` in bytes.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        return self._memory_info(self.check_device(device))

    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return processes holding memory on ``device``; the default says unknown (``None``).

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        self.check_device(device)
        return None

    def visible_devices_environment(self, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
        """Return the environment (``None``: unset) showing a child only ``devices``."""
        return default_subset_environment(self.visible_devices_env, devices)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


def default_subset_environment(
    variable: str | None, devices: Sequence[DeviceInfo]
) -> dict[str, str | None]:
    """Name ``devices`` in ``variable`` by UUID, else physical index; ``{}`` without a variable."""
    if variable is None:
        return {}
    return {variable: ",".join(d.uuid or str(d.physical_index) for d in devices)}


def subset_environment(platform: Platform, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
    """Return the environment (``None``: unset) showing a child only ``devices`` of ``platform``."""
    method = optional(platform, "visible_devices_environment")
    if method is None:
        return default_subset_environment(platform.visible_devices_env, devices)
    answer = method(devices)
    if not isinstance(answer, Mapping) or not all(
        isinstance(k, str) and k and (v is None or isinstance(v, str)) for k, v in answer.items()
    ):
        raise ConfigurationError(
            f"{platform.name}: visible_devices_environment must return a mapping of variable "
            f"names to text or None, got {answer!r}"
        )
    return dict(answer)


def validate_utilization(value: float, *, argument: str = "gpu_memory_utilization") -> float:
    """Return a memory utilization as a float, raising ValueError unless it is in ``(0, 1]``."""
    return _validate.number(value, argument, above=0, maximum=1, error=ValueError)
