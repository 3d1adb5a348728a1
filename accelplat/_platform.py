"""The :class:`Platform` protocol every backend satisfies, and an optional base class.

A platform answers, for one kind of accelerator, the questions ML test suites ask: which devices
this process sees, how much memory each has free and used, whether memory returns lazily, whether
graphs can be captured, what memory utilization to default to and which process start method is
safe. Built-in backends live in :mod:`accelplat._backends`; third parties register their own
through the ``accelplat.platforms`` entry-point group (see :mod:`accelplat._registry`).

A platform *class* (or zero-argument factory) may also offer ``probe() -> ProbeResult``, a cheap
availability check that imports no framework and creates no device context. Detection calls it
before constructing the platform.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, runtime_checkable

from accelplat import _validate
from accelplat._types import (
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat._util import Clock
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:
    from accelplat._usage import MemoryHolder

__all__ = [
    "BasePlatform",
    "Platform",
    "StartMethod",
    "default_subset_environment",
    "subset_environment",
]

StartMethod = Literal["fork", "spawn", "forkserver"]


@runtime_checkable
class Platform(Protocol):
    """What every accelplat backend provides.

    Device arguments are *visible* (logical) indices, numbered as torch numbers them in this
    process; backends map them to physical devices themselves.

    Attributes:
        name: Registered name, e.g. ``"cuda"``, ``"rocm"``, ``"xpu"``, ``"cpu"``.
        device_type: The torch device type (``"cuda"`` for both CUDA and ROCm).
        visible_devices_env: The variable that selects visible devices, or ``None``.
        release: How memory comes back (lazy or not, stability window, timeout, idle floor).
        graph: Whether graph capture is possible, decided without importing torch.
        default_memory_utilization: Fraction of device memory an engine should aim to use.
        preferred_start_method: ``"fork"`` where forking after device use is safe, else ``"spawn"``.
        context_free: ``False`` when the backend must create a device context or import a
            framework to answer memory queries (the conformance kit then skips that check).
    """

    @property
    def name(self) -> str:
        """Registered platform name."""
        ...

    @property
    def device_type(self) -> str:
        """Torch device type string."""
        ...

    @property
    def visible_devices_env(self) -> str | None:
        """Name of the visible-devices environment variable, if any."""
        ...

    @property
    def release(self) -> ReleaseProfile:
        """Release behaviour of device memory."""
        ...

    @property
    def graph(self) -> GraphSupport:
        """Graph-capture capability."""
        ...

    @property
    def default_memory_utilization(self) -> float:
        """Default engine memory utilization, in ``(0, 1]``."""
        ...

    @property
    def preferred_start_method(self) -> StartMethod:
        """Process start method that is safe on this platform."""
        ...

    @property
    def context_free(self) -> bool:
        """Whether memory queries avoid device contexts and framework imports."""
        ...

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


class BasePlatform:
    """Convenience base class for backends; satisfying :class:`Platform` does not require it.

    Besides the :class:`Platform` protocol it declares the extension points a backend may
    provide, each with its default: :meth:`probe` (available), :attr:`clock` (real time),
    :attr:`visible_devices_empty_hides_all` (unknown), :meth:`visible_devices_environment`
    (:attr:`visible_devices_env` naming the devices), :meth:`driver_version` (unknown) and
    :attr:`FEATURES` (no capability rules). Code that accepts any :class:`Platform` reads them
    with a default, as a plugin need not derive from this class.

    Subclasses set the class attributes (``RELEASE`` and ``GRAPH`` give the defaults of the
    ``release`` and ``graph`` properties) and implement :meth:`devices` and :meth:`_memory_info`.
    The base class validates device indices, so every backend raises the same
    :class:`~accelplat.errors.DeviceNotFoundError` for a bad index.
    """

    name: ClassVar[str] = "base"
    device_type: ClassVar[str] = "cpu"
    visible_devices_env: ClassVar[str | None] = None
    default_memory_utilization: ClassVar[float] = 0.92
    preferred_start_method: ClassVar[StartMethod] = "fork"
    context_free: ClassVar[bool] = True
    RELEASE: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0
    )
    GRAPH: ClassVar[GraphSupport] = GraphSupport(False, None, "this platform has no graph capture")
    visible_devices_empty_hides_all: ClassVar[bool | None] = None
    """Extension point: whether setting :attr:`visible_devices_env` to the empty string hides
    every device (CUDA and HIP do). ``None``: not known; the conformance kit then does not check
    it."""

    clock: Clock | None = None
    """Extension point: the clock waits on this platform read and sleep on (the simulated
    platform's virtual clock); ``None`` means real time (:data:`accelplat._util.REAL_CLOCK`)."""

    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {}
    """Optional extension point: per built-in capability (``"bf16"``, ``"fp8"``, ``"fp4"``,
    ``"mxfp4"``), the rules under which this platform's devices have it
    (see :mod:`accelplat.capabilities`). A capability missing here is unavailable."""

    @property
    def release(self) -> ReleaseProfile:
        """Release behaviour of device memory (the class's ``RELEASE`` by default)."""
        return self.RELEASE

    @property
    def graph(self) -> GraphSupport:
        """Graph-capture capability (the class's ``GRAPH`` by default)."""
        return self.GRAPH

    @classmethod
    def probe(cls) -> ProbeResult:
        """Return whether this platform is usable here; cheap, no framework, no context.

        Returns:
            A :class:`ProbeResult`. The default says available.
        """
        return ProbeResult(True, "always available")

    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible devices in visible-index order.

        Raises:
            NotImplementedError: Subclasses must implement it.
        """
        raise NotImplementedError

    def driver_version(self) -> str | None:
        """Extension point: the vendor driver's version, for reports; ``None`` when unknown.

        Returns:
            ``None`` by default.
        """
        return None

    def device_count(self) -> int:
        """Return the number of visible devices (``len(self.devices())``)."""
        return len(self.devices())

    def check_device(self, device: object) -> int:
        """Validate a visible device index.

        Args:
            device: The index a caller passed; ``bool`` and non-integers are rejected.

        Returns:
            The index as an ``int``.

        Raises:
            DeviceNotFoundError: If it is not an integer in ``range(device_count())``.
        """
        return _validate.device_index(device, self.device_count(), self.name)

    def memory_info(self, device: int) -> MemoryInfo:
        """Return memory of visible device ``device`` in bytes.

        Args:
            device: Visible device index.

        Returns:
            The device's :class:`MemoryInfo`.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        return self._memory_info(self.check_device(device))

    def _memory_info(self, device: int) -> MemoryInfo:
        raise NotImplementedError

    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return processes holding memory on ``device``; the default says unknown (``None``).

        Args:
            device: Visible device index.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        self.check_device(device)
        return None

    def visible_devices_environment(self, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
        """Return the environment that makes exactly ``devices`` visible to a child process.

        Device leases (:func:`accelplat.lease`) apply it. The default names each device by its
        UUID, else its physical index, in :attr:`visible_devices_env`; a backend whose vendor
        stacks several variables overrides this (see :func:`subset_environment`).

        Args:
            devices: Devices of this platform, as :meth:`devices` returned them.

        Returns:
            Variable name to value; ``None`` means "remove the variable".
        """
        return default_subset_environment(self.visible_devices_env, devices)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


def default_subset_environment(
    variable: str | None, devices: Sequence[DeviceInfo]
) -> dict[str, str | None]:
    """Name ``devices`` in one visible-devices variable: by UUID, else by physical index.

    Args:
        variable: The platform's visible-devices variable; ``None`` gives an empty mapping (a
            platform without one, such as the CPU, cannot hide devices from a child).
        devices: The devices to make visible, in the order wanted.

    Returns:
        ``{variable: "id,id,…"}``, or ``{}``.
    """
    if variable is None:
        return {}
    return {variable: ",".join(d.uuid or str(d.physical_index) for d in devices)}


def subset_environment(platform: Platform, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
    """Return the environment that shows a child process exactly ``devices`` of ``platform``.

    Calls the platform's ``visible_devices_environment`` where it has one (every
    :class:`BasePlatform` does; it is an optional member of :class:`Platform`), else
    :func:`default_subset_environment` of its ``visible_devices_env``.

    Args:
        platform: The platform the devices belong to.
        devices: The devices, as ``platform.devices()`` returned them.

    Returns:
        Variable name to value; ``None`` means "remove the variable".

    Raises:
        ConfigurationError: When the platform's answer is not a mapping of names to text or
            ``None``.
    """
    method = getattr(platform, "visible_devices_environment", None)
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
    """Check that a memory utilization is a finite number in ``(0, 1]``.

    Args:
        value: The utilization to check.
        argument: The argument name used in the error message.

    Returns:
        ``value`` as a float.

    Raises:
        ValueError: Naming ``argument`` and the accepted range.
    """
    return _validate.number(
        value,
        argument,
        above=0,
        maximum=1,
        expected="in (0, 1]",
        not_a_number="a number in (0, 1]",
        error=ValueError,
    )
