"""The ``simulated`` platform: devices whose used memory follows a scripted timeline.

It exists for tests and demos of everything that waits on memory: a timeline says how a device's
usage moves over time (a step, a linear release, a lazy release with an exponential tail, a holder
that never lets go), the release profile and graph capability make it behave like an eager
CUDA-like or a lazy ROCm-like platform, and an injectable clock makes every wait instantaneous and
deterministic.

Select it with ``ACCELPLAT_PLATFORM=simulated`` and ``ACCELPLAT_SIMULATED_SPEC=<file>`` (JSON, or
TOML when the name ends in ``.toml``); :meth:`SimulatedPlatform.probe` is available exactly when
that variable names a readable, valid spec. In Python, build it from a mapping, a file or a
:class:`SimulatedSpec`::

    clock = SimulatedClock()
    platform = SimulatedPlatform.from_spec(
        {"devices": [{"total": "80GiB", "used": "60GiB",
                      "timeline": [{"at": 1.0, "used": "2GiB"}]}]},
        clock=clock,
    )

The spec format is described in ``docs/memory.md``. Specs are treated as untrusted input: files
over :data:`MAX_SPEC_BYTES`, deep nesting, unknown keys, non-finite or enormous numbers, negative
sizes and timelines that would use more than a device's total are rejected with a
:class:`~accelplat.errors.ConfigurationError` naming the offending field.

Time on a timeline is seconds since the platform was constructed, read from its clock (the real
clock by default, so demos unfold in real time). Imports no framework; touches no device.

The code is split by job: the virtual clock (:mod:`accelplat._backends._sim_clock`), the model of
segments, holders, devices and specs with their checks (:mod:`accelplat._backends._sim_model`),
reading spec files and mappings (:mod:`accelplat._backends._sim_spec`), and the platform here,
which re-exports the public names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from typing_extensions import override

from accelplat._backends._readings import checked_memory
from accelplat._backends._sim_clock import SimulatedClock
from accelplat._backends._sim_model import (
    MAX_DEVICES,
    MAX_SPEC_BYTES,
    LazyRelease,
    Linear,
    Segment,
    SimulatedDevice,
    SimulatedHolder,
    SimulatedSpec,
    Step,
)
from accelplat._backends._sim_spec import load_spec, spec_from_mapping
from accelplat._platform import BasePlatform, StartMethod
from accelplat._types import DeviceInfo, GraphSupport, MemoryInfo, ProbeResult, ReleaseProfile
from accelplat._usage import MemoryHolder
from accelplat._util import Clock, RealClock
from accelplat.errors import ConfigurationError

__all__ = [
    "ENV_SPEC",
    "ENV_VISIBLE",
    "MAX_DEVICES",
    "MAX_SPEC_BYTES",
    "LazyRelease",
    "Linear",
    "RealClock",
    "Segment",
    "SimulatedClock",
    "SimulatedDevice",
    "SimulatedHolder",
    "SimulatedPlatform",
    "SimulatedSpec",
    "Step",
    "load_spec",
]

ENV_SPEC = "ACCELPLAT_SIMULATED_SPEC"
"""Variable naming the spec file that ``SimulatedPlatform()`` and its probe load."""

ENV_VISIBLE = "ACCELPLAT_SIMULATED_VISIBLE_DEVICES"
"""Comma-separated UUIDs (``SIM-0`` …) or spec indices of the devices this process sees; unset
means all of them. Parsed like ``CUDA_VISIBLE_DEVICES``: an unknown entry ends the list."""


_SPEC_CACHE_SIZE = 16
_spec_cache: dict[str, tuple[tuple[int, int, int], SimulatedSpec]] = {}
_spec_cache_lock = threading.Lock()


def _load_spec_once(path: str | os.PathLike[str]) -> SimulatedSpec:
    """Return :func:`load_spec` of ``path``, reading and validating each version of a file once.

    Detection probes the spec named by ``ACCELPLAT_SIMULATED_SPEC`` and then constructs the
    platform from it; both get the one validated :class:`SimulatedSpec` (it is immutable). A file
    whose inode, size or modification time changed is read again.

    Raises:
        ConfigurationError: As :func:`load_spec`.
    """
    name = os.fspath(path)
    try:
        st = os.stat(name)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):
        return load_spec(name)  # the reader names the problem
    with _spec_cache_lock:
        hit = _spec_cache.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    spec = load_spec(name)
    with _spec_cache_lock:
        if len(_spec_cache) >= _SPEC_CACHE_SIZE:
            _spec_cache.clear()
        _spec_cache[name] = (key, spec)
    return spec


# --------------------------------------------------------------------------------------------
# the platform


class SimulatedPlatform(BasePlatform):
    """A platform of scripted devices, for tests and demos.

    Args:
        spec: A :class:`SimulatedSpec`, a mapping in the spec format, or a path to a spec file;
            ``None`` loads the file named by ``ACCELPLAT_SIMULATED_SPEC``.
        clock: The clock timelines run on and waits sleep on (exposed as :attr:`clock`);
            ``None`` means the spec's choice (a :class:`RealClock` or a fresh
            :class:`SimulatedClock`). Timeline time 0 is the clock's reading at construction.

    Raises:
        ConfigurationError: For an invalid spec, or ``spec=None`` without the variable.

    Side effects:
        Reads the spec file; imports no framework; touches no device.
    """

    context_free: ClassVar[bool] = True

    def __init__(
        self,
        spec: SimulatedSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        if spec is None:
            path = os.environ.get(ENV_SPEC, "").strip()
            if not path:
                raise ConfigurationError(
                    f"SimulatedPlatform() needs a spec: set {ENV_SPEC} to a JSON or TOML spec "
                    "file, or pass one"
                )
            spec = path
        if isinstance(spec, SimulatedSpec):
            resolved = spec
        elif isinstance(spec, Mapping):
            resolved = spec_from_mapping(spec, source="mapping")
        elif isinstance(spec, (str, os.PathLike)):
            resolved = _load_spec_once(spec)
        else:
            raise ConfigurationError(
                f"spec must be a SimulatedSpec, a mapping or a path, got {type(spec).__name__}"
            )
        if clock is None:
            clock = SimulatedClock() if resolved.clock == "virtual" else RealClock()
        elif not (
            callable(getattr(clock, "monotonic", None)) and callable(getattr(clock, "sleep", None))
        ):
            raise ConfigurationError(f"clock must have monotonic() and sleep(), got {clock!r}")
        self._spec = resolved
        self.clock: Clock = clock
        """The clock of the timelines; memory waits sleep on it by default."""
        self._t0 = clock.monotonic()

    @classmethod
    def from_spec(
        cls,
        spec: SimulatedSpec | Mapping[str, Any] | str | os.PathLike[str],
        *,
        clock: Clock | None = None,
    ) -> SimulatedPlatform:
        """Build a simulated platform from a spec (see the class for the arguments)."""
        return cls(spec, clock=clock)

    @classmethod
    @override
    def probe(cls) -> ProbeResult:
        """Say whether ``ACCELPLAT_SIMULATED_SPEC`` names a readable, valid spec.

        Returns:
            Available with the device count, or unavailable with the reason.

        Side effects:
            Reads and validates the spec file.
        """
        path = os.environ.get(ENV_SPEC, "").strip()
        if not path:
            return ProbeResult(
                False, f"{ENV_SPEC} is not set (point it at a JSON or TOML simulated spec)"
            )
        try:
            spec = _load_spec_once(path)
        except ConfigurationError as exc:
            return ProbeResult(False, str(exc))
        return ProbeResult(True, f"{len(spec.devices)} simulated device(s) from {path}")

    @property
    def spec(self) -> SimulatedSpec:
        """The spec this platform follows."""
        return self._spec

    @property
    def name(self) -> str:  # type: ignore[override]
        """Platform name from the spec (``"simulated"`` by default)."""
        return self._spec.name

    @property
    def device_type(self) -> str:  # type: ignore[override]
        """Torch device type the spec pretends to be."""
        return self._spec.device_type

    @property
    def default_memory_utilization(self) -> float:  # type: ignore[override]
        """Default engine memory utilization from the spec."""
        return self._spec.default_memory_utilization

    @property
    def preferred_start_method(self) -> StartMethod:  # type: ignore[override]
        """Process start method from the spec."""
        return self._spec.preferred_start_method

    @property
    @override
    def release(self) -> ReleaseProfile:
        """Release profile from the spec."""
        return self._spec.release

    @property
    @override
    def graph(self) -> GraphSupport:
        """Graph capability from the spec."""
        return self._spec.graph

    def elapsed(self) -> float:
        """Return timeline time: seconds on :attr:`clock` since construction."""
        return self.clock.monotonic() - self._t0

    @property
    def visible_devices_env(self) -> str | None:  # type: ignore[override]
        """``ACCELPLAT_SIMULATED_VISIBLE_DEVICES``: the simulated devices this process sees."""
        return ENV_VISIBLE

    def _visible(self) -> list[int]:
        """Spec indices of the visible devices, in visible-index order (see :data:`ENV_VISIBLE`)."""
        everything = list(range(len(self._spec.devices)))
        raw = os.environ.get(ENV_VISIBLE)
        if raw is None:
            return everything
        uuids = [self._uuid(i) for i in everything]
        chosen: list[int] = []
        for token in (t.strip() for t in raw.split(",")):
            if token in uuids:
                index = uuids.index(token)
            elif token.isdecimal() and len(token) <= 6 and int(token) < len(uuids):
                index = int(token)
            else:  # as CUDA does: an unknown entry ends the list
                break
            if index in chosen:
                raise ConfigurationError(f"{ENV_VISIBLE}={raw!r} names device {token} twice")
            chosen.append(index)
        return chosen

    def _uuid(self, index: int) -> str:
        uuid = self._spec.devices[index].uuid
        return uuid if uuid is not None else f"SIM-{index}"

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible simulated devices in visible-index order.

        Every device of the spec is visible unless ``ACCELPLAT_SIMULATED_VISIBLE_DEVICES`` lists
        some, by UUID or spec index; ``physical_index`` is the index in the spec.

        Raises:
            ConfigurationError: When the variable names a device twice.
        """
        return [
            DeviceInfo(
                index=i,
                physical_index=spec_index,
                name=self._spec.devices[spec_index].name,
                uuid=self._uuid(spec_index),
            )
            for i, spec_index in enumerate(self._visible())
        ]

    @override
    def device_count(self) -> int:
        """Return the number of visible simulated devices."""
        return len(self._visible())

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        index = self._visible()[device]
        dev = self._spec.devices[index]
        used = dev.used_at(self.elapsed())
        # The same rule as every driver's answer: a spec can describe a device no driver could
        # report (a total of zero), and a wait must not take that as a fact.
        return checked_memory(
            "simulated",
            f"simulated device {device} ({self._uuid(index)})",
            free=dev.total - used,
            total=dev.total,
            used=used,
            reserved=dev.reserved,
            source="simulated",
        )

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the holders active now, or ``None`` when the spec does not report holders.

        Args:
            device: Visible device index.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        index = self.check_device(device)
        return self._spec.devices[self._visible()[index]].holders_at(self.elapsed())

    def __repr__(self) -> str:
        return (
            f"<SimulatedPlatform name={self.name!r} devices={self.device_count()} "
            f"clock={self.clock!r}>"
        )
