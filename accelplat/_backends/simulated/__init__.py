"""The ``simulated`` platform: devices whose used memory follows a scripted timeline.

An eager CUDA-like or a lazy ROCm-like platform; a :class:`SimulatedClock` (``_clock``) makes waits
instant. The model and its spec reader are in ``_model``; the format in ``docs/memory.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from accelplat._backends._common import checked_memory
from accelplat._backends.simulated._clock import SimulatedClock as SimulatedClock
from accelplat._backends.simulated._model import LazyRelease as LazyRelease
from accelplat._backends.simulated._model import Linear as Linear
from accelplat._backends.simulated._model import SimulatedDevice as SimulatedDevice
from accelplat._backends.simulated._model import SimulatedHolder as SimulatedHolder
from accelplat._backends.simulated._model import SimulatedSpec as SimulatedSpec
from accelplat._backends.simulated._model import Step as Step
from accelplat._backends.simulated._model import load_spec as load_spec
from accelplat._backends.simulated._model import spec_from_mapping as spec_from_mapping
from accelplat._platform import BasePlatform, override
from accelplat._types import DeviceInfo, MemoryHolder, MemoryInfo, ProbeResult
from accelplat._util import Clock, RealClock, shown
from accelplat.errors import ConfigurationError

ENV_SPEC = "ACCELPLAT_SIMULATED_SPEC"  # the spec file SimulatedPlatform() and its probe load
ENV_VISIBLE = "ACCELPLAT_SIMULATED_VISIBLE_DEVICES"  # UUIDs (SIM-0 …) or spec indices, CUDA-style
_Entry = tuple[int, int | None]  # a visible device: its index in the spec, and its slice or None
_SpecSource = SimulatedSpec | Mapping[str, Any] | str | os.PathLike[str]  # a spec, or its file


@functools.lru_cache(maxsize=16)
def _load_version(path: str, version: tuple[int, int, int]) -> SimulatedSpec:
    return load_spec(path)


def _load_spec_once(path: str | os.PathLike[str]) -> SimulatedSpec:
    """Return :func:`load_spec` of ``path``, reading each version (inode, size, mtime) once."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except (OSError, ValueError):
        return load_spec(name)  # the reader names the problem
    return _load_version(name, (st.st_ino, st.st_size, st.st_mtime_ns))


class SimulatedPlatform(BasePlatform):
    """A platform of scripted devices, for tests and demos.

    Args:
        spec: A :class:`SimulatedSpec`, a spec mapping or a spec file's path; ``None``: the file
            ``ACCELPLAT_SIMULATED_SPEC`` names.
        clock: What timelines run and waits sleep on (:attr:`clock`); ``None``: the spec's choice.
            Timeline time 0 is its reading at construction.

    Raises:
        ConfigurationError: For an invalid spec, or ``spec=None`` without the variable.
    """

    context_free: ClassVar[bool] = True
    visible_devices_env: ClassVar[str | None] = ENV_VISIBLE

    def __init__(self, spec: _SpecSource | None = None, *, clock: Clock | None = None) -> None:
        if spec is None:
            spec = os.environ.get(ENV_SPEC, "").strip()
            if not spec:
                raise ConfigurationError(
                    f"{ENV_SPEC} is not set (point it at a JSON or TOML simulated spec)"
                )
        if isinstance(spec, Mapping):
            spec = spec_from_mapping(spec, source="mapping")
        elif isinstance(spec, (str, os.PathLike)):
            spec = _load_spec_once(spec)
        elif not isinstance(spec, SimulatedSpec):
            raise ConfigurationError(
                f"spec must be a SimulatedSpec, a mapping or a path, got {type(spec).__name__}"
            )
        if clock is None:
            clock = SimulatedClock() if spec.clock == "virtual" else RealClock()
        elif not all(callable(getattr(clock, m, None)) for m in ("monotonic", "sleep")):
            raise ConfigurationError(f"clock must have monotonic() and sleep(), got {clock!r}")
        self._spec = spec
        self._pinned: str | None = None  # restricted(): the visible devices, whatever the variable
        self.clock: Clock = clock
        self._t0 = clock.monotonic()

    @classmethod
    def from_spec(cls, spec: _SpecSource, *, clock: Clock | None = None) -> SimulatedPlatform:
        """Build a simulated platform from a spec (see the class for the arguments)."""
        return cls(spec, clock=clock)

    @classmethod
    @override
    def probe(cls) -> ProbeResult:
        """Say whether ``ACCELPLAT_SIMULATED_SPEC`` names a readable, valid spec (reads it)."""
        try:
            count = len(cls()._spec.devices)
        except ConfigurationError as exc:
            return ProbeResult(False, str(exc))
        return ProbeResult(True, f"{count} simulated device(s) from {os.environ[ENV_SPEC].strip()}")

    @property
    def spec(self) -> SimulatedSpec:
        """The spec this platform follows."""
        return self._spec

    @property
    def is_accelerator(self) -> bool:  # type: ignore[override]
        """Whether the devices are accelerators: all but a simulated ``"cpu"`` host's."""
        return self._spec.device_type != "cpu"

    def elapsed(self) -> float:
        """Return timeline time: seconds on :attr:`clock` since construction."""
        return self.clock.monotonic() - self._t0

    def _visible(self) -> list[_Entry]:
        """Visible entries: (spec index, slice index or ``None`` for the whole device)."""
        count = len(self._spec.devices)
        everything: list[_Entry] = [(i, None) for i in range(count)]
        raw = self._pinned if self._pinned is not None else os.environ.get(ENV_VISIBLE)
        if raw is None:
            return everything
        slices = [(i, j) for i, d in enumerate(self._spec.devices) for j in range(len(d.slices))]
        uuids = {self._uuid(entry): entry for entry in everything + slices}
        chosen: list[_Entry] = []
        for token in (t.strip() for t in raw.split(",")):
            if token in uuids:
                entry = uuids[token]
            elif token.isascii() and token.isdigit() and len(token) <= 6 and int(token) < count:
                entry = (int(token), None)
            else:  # as CUDA does: an unknown entry ends the list
                break
            if entry in chosen:
                raise ConfigurationError(f"{ENV_VISIBLE}={shown(raw)} names device {token} twice")
            if entry[1] is not None:  # a slice, as CUDA shows a MIG device: the only one
                return chosen or [entry]
            chosen.append(entry)
        return chosen

    def _device(self, entry: _Entry) -> SimulatedDevice:
        device = self._spec.devices[entry[0]]
        return device if entry[1] is None else device.slices[entry[1]]

    def _uuid(self, entry: _Entry) -> str:
        index, part = entry
        uuid = self._device(entry).uuid
        return uuid or (f"SIM-{index}" if part is None else f"MIG-SIM-{index}-{part}")

    @override
    def lease_units(self) -> tuple[str, ...]:
        """Return the units a scheduler hands out where visible devices have slices.

        Each slice, and each device without; ``()`` otherwise (the visible devices are the units).
        """
        entries = self._visible()
        if any(p is not None for _, p in entries):  # a slice is visible, and the only device
            return ()
        units: list[_Entry] = []
        for i, _ in entries:
            units += [(i, j) for j in range(len(self._spec.devices[i].slices))] or [(i, None)]
        return tuple(map(self._uuid, units)) if any(p is not None for _, p in units) else ()

    @override
    def restricted(self, value: str) -> SimulatedPlatform:
        """Return this platform as a child started with the variable set to ``value`` sees it.

        The view shares the spec as it is now and the clock.
        """
        view = copy.copy(self)
        view._pinned = value
        return view

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible simulated devices; ``physical_index`` is the index in the spec.

        Raises:
            ConfigurationError: When ``ACCELPLAT_SIMULATED_VISIBLE_DEVICES`` names one twice.
        """
        return [
            DeviceInfo(i, entry[0], self._device(entry).name, self._uuid(entry))
            for i, entry in enumerate(self._visible())
        ]

    @override
    def device_count(self) -> int:
        return len(self._visible())

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        entry = self._visible()[device]
        dev = self._device(entry)
        used = dev.used_at(self.elapsed())
        # Checked as a driver's answer: a spec may describe what no driver reports (a zero total).
        return checked_memory(
            "simulated",
            f"simulated device {device} ({self._uuid(entry)})",
            free=dev.total - used,
            total=dev.total,
            used=used,
            reserved=dev.reserved,
            source="simulated",
        )

    def set_holder(self, device: int, holder: SimulatedHolder) -> None:
        """Add ``holder`` to visible ``device``, replacing the holder with its pid if any.

        For simulations of several processes on one clock (a process starting to use memory,
        or, replaced with an ``end``, letting it go); holders that have ended are dropped.

        Raises:
            ConfigurationError: For a bad index, or when the device's memory would exceed its
                total (what a real device answers with an out-of-memory error).
        """
        entry = self._visible()[self.check_device(device)]
        now = self.elapsed()
        dev = self._device(entry)
        same = [h for h in dev.holders if holder.pid is not None and h.pid == holder.pid]
        freed = sum(h.used for h in same if h.active(now))
        if holder.active(now) and dev.used_at(now) - freed + holder.used > dev.total:
            raise ConfigurationError(
                f"simulated device {device}: {holder.used} more bytes would exceed its total "
                f"({dev.total} bytes, {dev.used_at(now)} used)"
            )
        live = [h for h in dev.holders if (h.end is None or h.end > now) and h not in same]
        updated = dataclasses.replace(dev, holders=(*live, holder))  # checked as a spec is
        devices, (index, part) = list(self._spec.devices), entry
        if part is not None:  # a slice: its device with the slice replaced
            parts = list(devices[index].slices)
            parts[part] = updated
            updated = dataclasses.replace(devices[index], slices=tuple(parts))
        devices[index] = updated
        self._spec = dataclasses.replace(self._spec, devices=tuple(devices))

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the holders active now, or ``None`` when the spec does not report holders."""
        return self._device(self._visible()[self.check_device(device)]).holders_at(self.elapsed())


# The class attributes of BasePlatform a spec sets, each read from it (RELEASE and GRAPH: the
# base's release and graph read them).
for _member in ("name", "device_type", "default_memory_utilization", "preferred_start_method"):
    setattr(SimulatedPlatform, _member, property(operator.attrgetter(f"_spec.{_member}")))
for _member in ("release", "graph"):
    setattr(SimulatedPlatform, _member.upper(), property(operator.attrgetter(f"_spec.{_member}")))
