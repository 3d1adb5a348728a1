"""Background sampling of device memory, with bounded storage, and the recorder built on it.

:class:`Sampler` reads used memory of every sampled device at a fixed rate on a daemon thread
into a :class:`SampleBuffer` of at most ``capacity`` samples: when full, neighbouring samples
merge pairwise (keeping the larger reading, so peaks survive) and the resolution halves. At
20 Hz and 16,384 samples that is full resolution for 13.6 minutes, 0.1 s for the next 13.6, …
:class:`Recorder` ties a sampler to a platform and collects test spans and memory waits into a
:class:`~accelplat.timeline._trace.Trace`; the pytest plugin and ``accelplat record`` use it.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelplat import _validate
from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES
from accelplat.errors import AccelplatError, ConfigurationError
from accelplat.timeline._defaults import DEFAULT_HZ, DEFAULT_LEAK_GRACE_S
from accelplat.timeline._trace import DeviceTrack, Reading, Sample, TestSpan, Trace, WaitSpan

if TYPE_CHECKING:
    from accelplat._platform import Platform

MAX_HZ = 1000.0  # highest sampling rate accepted
DEFAULT_CAPACITY = 16_384  # samples kept before the buffer halves its resolution

Clock = Callable[[], float]


def validate_hz(hz: object, *, argument: str = "hz") -> float:
    """Check a sampling rate.

    Args:
        hz: Samples per second.
        argument: Name used in the error message.

    Returns:
        The rate as a float.

    Raises:
        ConfigurationError: Unless it is a finite number in ``(0, MAX_HZ]``.
    """
    return _validate.number(
        hz,
        argument,
        above=0,
        maximum=MAX_HZ,
        expected=f"in (0, {MAX_HZ:g}] samples/s",
    )


def validate_grace(seconds: object, *, argument: str = "leak_grace_s") -> float:
    """Check a leak grace period.

    Args:
        seconds: Seconds after the last test during which memory may still come back.
        argument: Name used in the error message.

    Returns:
        The period as a float.

    Raises:
        ConfigurationError: Unless it is a finite number >= 0.
    """
    return _validate.number(
        seconds, argument, minimum=0, expected="a finite number of seconds >= 0"
    )


def _merge(a: Reading, b: Reading) -> Reading:
    return tuple(
        x if y is None else y if x is None else max(x, y) for x, y in zip(a, b, strict=True)
    )


class SampleBuffer:
    """A fixed-capacity store of samples that halves its resolution when full.

    Not thread-safe on its own; :class:`Sampler` guards it with a lock.

    Args:
        capacity: Samples kept at most; an even number >= 2.

    Raises:
        ConfigurationError: For a capacity that is not an even integer >= 2.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        _validate.integer(capacity, "capacity", minimum=2, expected="an even integer >= 2")
        if capacity % 2:
            raise ConfigurationError(f"capacity must be even, got {capacity!r}")
        self._capacity = capacity
        self._samples: list[Sample] = []
        self._pending: Sample | None = None
        self._pending_count = 0
        self._decimation = 0

    @property
    def capacity(self) -> int:
        """Samples kept at most."""
        return self._capacity

    @property
    def decimation(self) -> int:
        """Times the buffer has halved; each stored sample spans ``2**decimation`` ticks."""
        return self._decimation

    def add(self, t: float, used: Reading) -> None:
        """Add one tick's reading.

        Args:
            t: Seconds since the start of the recording; not earlier than the previous tick.
            used: Used bytes per device; ``None`` where the query failed.
        """
        if self._pending is None:
            self._pending = Sample(t, tuple(used))
        else:
            self._pending = Sample(self._pending.t, _merge(self._pending.used, tuple(used)))
        self._pending_count += 1
        if self._pending_count < (1 << self._decimation):
            return
        self._samples.append(self._pending)
        self._pending = None
        self._pending_count = 0
        if len(self._samples) >= self._capacity:
            old = self._samples
            self._samples = [
                Sample(old[i].t, _merge(old[i].used, old[i + 1].used))
                for i in range(0, len(old) - 1, 2)
            ]
            self._decimation += 1

    def samples(self) -> tuple[Sample, ...]:
        """Return the stored samples in time order, a partly filled last one included."""
        if self._pending is None:
            return tuple(self._samples)
        return (*self._samples, self._pending)

    def __len__(self) -> int:
        return len(self._samples) + (self._pending is not None)


_running: weakref.WeakSet[Sampler] = weakref.WeakSet()  # samplers whose thread runs


def _before_fork() -> None:
    # No sampling thread may be inside a vendor library call when the process forks, or the
    # child could inherit a lock held by a thread that does not exist there.
    for sampler in list(_running):
        sampler._lock.acquire()


def _after_fork_in_parent() -> None:
    for sampler in list(_running):
        if sampler._lock.locked():
            sampler._lock.release()


def _after_fork_in_child() -> None:
    # The child has no sampling thread: forget it, with fresh synchronisation objects.
    for sampler in list(_running):
        sampler._lock = threading.Lock()
        sampler._stop = threading.Event()
        sampler._stop.set()
        sampler._thread = None
    _running.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


class Sampler:
    """Reads device memory at a fixed rate into a :class:`SampleBuffer`.

    Call :meth:`sample` to take one sample now (from any thread), or :meth:`start` to sample on a
    daemon thread until :meth:`stop`. A process that forks while the thread runs waits for the
    read in progress to finish first, so the child never inherits a vendor library mid-call;
    the child has no sampling thread.

    Args:
        read: Returns used bytes per device (``None`` where a query failed); must not raise.
        hz: Samples per second.
        capacity: Samples kept before the resolution halves.
        clock: Monotonic clock in seconds (inject a fake one in tests).

    Raises:
        ConfigurationError: For a rate outside ``(0, MAX_HZ]`` or a bad capacity.
    """

    def __init__(
        self,
        read: Callable[[], Reading],
        *,
        hz: float = DEFAULT_HZ,
        capacity: int = DEFAULT_CAPACITY,
        clock: Clock = time.monotonic,
    ) -> None:
        self._read = read
        self.hz = validate_hz(hz)
        self._clock = clock
        self._buffer = SampleBuffer(capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = clock()

    def now(self) -> float:
        """Return seconds since the sampler was created."""
        return self._clock() - self.t0

    def sample(self) -> tuple[float, Reading]:
        """Read every device now and store the reading.

        Returns:
            ``(t, reading)``: seconds since the start, and used bytes per device.
        """
        with self._lock:
            reading = tuple(self._read())
            t = self.now()
            self._buffer.add(t, reading)
        return t, reading

    def start(self) -> None:
        """Start sampling on a daemon thread named ``accelplat-timeline``; idempotent."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="accelplat-timeline", daemon=True)
        _running.add(self)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sampling thread and wait for it (up to ``timeout`` seconds)."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        _running.discard(self)
        self._thread = None

    def _run(self) -> None:
        interval = 1.0 / self.hz
        deadline = self._clock()
        while True:
            self.sample()
            deadline += interval
            now = self._clock()
            if deadline < now:  # fell behind (a slow query, a suspended process): do not burst
                deadline = now + interval
            if self._stop.wait(deadline - now):
                return

    @property
    def decimation(self) -> int:
        """How many times the buffer has halved its resolution."""
        with self._lock:
            return self._buffer.decimation

    def samples(self) -> tuple[Sample, ...]:
        """Return the stored samples in time order."""
        with self._lock:
            return self._buffer.samples()


def platform_reader(platform: Platform) -> tuple[tuple[DeviceTrack, ...], Callable[[], Reading]]:
    """Describe a platform's visible devices and return a reader of their used memory.

    Args:
        platform: The platform to sample.

    Returns:
        ``(devices, read)``: the devices (with totals from a first query, ``0`` where it failed)
        and a function returning used bytes per device, ``None`` for a device whose query raised.

    Side effects:
        Calls ``devices()`` and ``memory_info()`` once per device; on context-free platforms this
        creates no device context.
    """
    tracks: list[DeviceTrack] = []
    for dev in platform.devices():
        try:
            total = max(0, int(platform.memory_info(dev.index).total))
        except Exception:  # a device that cannot be read still gets a track
            total = 0
        tracks.append(DeviceTrack(dev.index, dev.name, total))
    indices = tuple(t.index for t in tracks)

    def read() -> Reading:
        values: list[int | None] = []
        for index in indices:
            try:
                values.append(max(0, int(platform.memory_info(index).used)))
            except Exception:  # the sampler must never break the session it watches
                values.append(None)
        return tuple(values)

    return tuple(tracks), read


@dataclass
class _OpenTest:
    start: float
    used_before: Reading
    body_start: float | None = None


@dataclass
class _OpenWait:
    start: float
    kind: str
    devices: tuple[int, ...]
    test: str | None


class Recorder:
    """Samples a platform's memory and collects test spans and memory waits into a trace.

    Thread-safe: tests, waits and the sampling thread may report concurrently.

    Args:
        platform: The platform to sample; ``None`` records spans and waits without memory.
        hz: Samples per second.
        capacity: Samples kept before the resolution halves.
        leak_tolerance_bytes: Growth across a test that is not yet a leak.
        leak_grace_s: Seconds after the last test during which memory may still come back.
        clock: Monotonic clock in seconds.
        wall_clock: Wall clock, for the trace's ``started_at``.
        notes: Remarks to carry into the trace.

    Raises:
        ConfigurationError: For a bad rate, capacity, tolerance or grace period.

    Side effects:
        Queries the platform's devices once on construction; see :func:`platform_reader`.
    """

    @classmethod
    def of_current_platform(
        cls,
        *,
        hz: float = DEFAULT_HZ,
        leak_tolerance_bytes: int = DEFAULT_LEAK_TOLERANCE_BYTES,
        leak_grace_s: float = DEFAULT_LEAK_GRACE_S,
    ) -> Recorder:
        """Return a recorder of the current platform; without one, a recorder of spans only.

        Args:
            hz: Samples per second.
            leak_tolerance_bytes: Growth across a test that is not yet a leak.
            leak_grace_s: Seconds after the last test during which memory may still come back.

        Returns:
            The recorder; when detection fails its trace carries a note saying why nothing
            was sampled.

        Raises:
            ConfigurationError: For a bad rate, tolerance or grace period.

        Side effects:
            Detects the platform (cached) and queries its devices once.
        """
        from accelplat._registry import current_platform

        notes: list[str] = []
        platform: Platform | None
        try:
            platform = current_platform()
        except AccelplatError as exc:
            platform = None
            notes.append(f"No platform was sampled: {exc}")
        return cls(
            platform,
            hz=hz,
            leak_tolerance_bytes=leak_tolerance_bytes,
            leak_grace_s=leak_grace_s,
            notes=notes,
        )

    def __init__(
        self,
        platform: Platform | None,
        *,
        hz: float = DEFAULT_HZ,
        capacity: int = DEFAULT_CAPACITY,
        leak_tolerance_bytes: int = DEFAULT_LEAK_TOLERANCE_BYTES,
        leak_grace_s: float = DEFAULT_LEAK_GRACE_S,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        notes: Sequence[str] = (),
    ) -> None:
        _validate.integer(
            leak_tolerance_bytes, "leak_tolerance_bytes", minimum=0, expected="an integer >= 0"
        )
        self._leak_grace = validate_grace(leak_grace_s)
        self._platform_name = "" if platform is None else platform.name
        self._context_free = True if platform is None else bool(platform.context_free)
        if platform is None:
            self.devices: tuple[DeviceTrack, ...] = ()
            read: Callable[[], Reading] = tuple
        else:
            self.devices, read = platform_reader(platform)
        self._leak_tolerance = leak_tolerance_bytes
        self._notes = list(notes)
        self._started_at = wall_clock()
        self.sampler = Sampler(read, hz=hz, capacity=capacity, clock=clock)
        self._lock = threading.Lock()
        self._open_tests: dict[str, _OpenTest] = {}
        self._tests: list[TestSpan] = []
        self._open_waits: dict[int, _OpenWait] = {}
        self._waits: list[WaitSpan] = []
        self._next_token = 0
        self._current_test: str | None = None
        self._end: float | None = None

    @property
    def current_test(self) -> str | None:
        """Node id of the test begun most recently and not yet ended, if any."""
        return self._current_test

    def add_note(self, note: str) -> None:
        """Add a remark shown on the report."""
        with self._lock:
            self._notes.append(note)

    def start(self) -> None:
        """Take a first sample and start the sampling thread."""
        self.sampler.sample()
        self.sampler.start()

    def begin_test(self, nodeid: str) -> None:
        """Mark the start of a test, sampling memory now as its baseline.

        Args:
            nodeid: The test's id.
        """
        t, reading = self.sampler.sample()
        with self._lock:
            self._open_tests[nodeid] = _OpenTest(t, reading)
            self._current_test = nodeid

    def begin_body(self, nodeid: str) -> None:
        """Mark the start of a test's body (pytest's call phase), after its set-up.

        Args:
            nodeid: The id given to :meth:`begin_test`; an unknown id is ignored.
        """
        t = self.sampler.now()
        with self._lock:
            opened = self._open_tests.get(nodeid)
            if opened is not None and opened.body_start is None:
                opened.body_start = t

    def end_test(
        self, nodeid: str, outcome: str = "", *, sample: tuple[float, Reading] | None = None
    ) -> TestSpan | None:
        """Mark the end of a test, sampling memory now to compare with its baseline.

        Args:
            nodeid: The id given to :meth:`begin_test`.
            outcome: ``"passed"``, ``"failed"``, ``"skipped"`` or any short word.
            sample: A ``(t, reading)`` from :meth:`Sampler.sample` taken when the test's
                teardown ended, to close the span with instead of sampling now (pytest's
                reporting of the teardown runs in between).

        Returns:
            The finished span, or ``None`` when the test was never begun.
        """
        t, reading = self.sampler.sample() if sample is None else sample
        with self._lock:
            opened = self._open_tests.pop(nodeid, None)
            if self._current_test == nodeid:
                self._current_test = next(reversed(self._open_tests), None)
            if opened is None:
                return None
            span = TestSpan(
                nodeid, opened.start, t, opened.used_before, reading, outcome, opened.body_start
            )
            self._tests.append(span)
            return span

    def begin_wait(self, kind: str, devices: Sequence[int] = ()) -> int:
        """Mark the start of a memory wait.

        Args:
            kind: What waits, e.g. ``"settle"`` or ``"fixture:settled_device_memory"``.
            devices: Device indices waited on, when known.

        Returns:
            A token for :meth:`end_wait`.
        """
        t = self.sampler.now()
        with self._lock:
            token = self._next_token
            self._next_token += 1
            self._open_waits[token] = _OpenWait(t, kind, tuple(devices), self._current_test)
            return token

    def end_wait(self, token: int, *, ok: bool = True, keep: bool = True) -> WaitSpan | None:
        """Mark the end of the wait ``token`` came from.

        Args:
            token: What :meth:`begin_wait` returned.
            ok: ``False`` when the wait raised (a timeout included).
            keep: ``False`` drops the wait instead of recording it (e.g. a fixture whose wait
                was already recorded, more precisely, from the waiting function itself).

        Returns:
            The finished span, or ``None`` for an unknown token or a dropped wait.
        """
        t = self.sampler.now()
        with self._lock:
            opened = self._open_waits.pop(token, None)
            if opened is None or not keep:
                return None
            span = WaitSpan(opened.start, t, opened.kind, opened.devices, ok, opened.test)
            self._waits.append(span)
            return span

    def linger(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Keep sampling while the last test still holds memory, up to the leak grace period.

        The last test is then judged like every other one. Returns at once when no test ran or
        every device is back within the tolerance.

        Args:
            sleep: Sleeps between samples (inject a fake one in tests).
        """
        with self._lock:
            if not self._tests:
                return
            last = max(self._tests, key=lambda s: s.end)
        deadline = last.end + self._leak_grace
        while self.sampler.now() < deadline:
            _, reading = self.sampler.sample()
            if all(
                b is None or r is None or r - b <= self._leak_tolerance
                for b, r in zip(last.used_before, reading, strict=False)
            ):
                return
            sleep(1.0 / self.sampler.hz)

    def stop(self) -> Trace:
        """Stop sampling, take a last sample and return the trace; later calls return it again.

        Tests or waits still open are closed at the stop time.
        """
        if self._end is None:
            self.sampler.stop()
            t, _ = self.sampler.sample()
            self._end = t
            for nodeid in list(self._open_tests):
                self.end_test(nodeid, "unfinished")
            for token in list(self._open_waits):
                self.end_wait(token, ok=False)
        return self.trace()

    def trace(self, *, command: Sequence[str] | None = None, exit_code: int | None = None) -> Trace:
        """Return what was recorded so far as a :class:`~accelplat.timeline._trace.Trace`.

        Args:
            command: The command that ran, for ``accelplat record``.
            exit_code: Its exit status.
        """
        samples = self.sampler.samples()
        with self._lock:
            end = self._end if self._end is not None else self.sampler.now()
            return Trace(
                devices=self.devices,
                samples=samples,
                tests=tuple(sorted(self._tests, key=lambda s: (s.start, s.end))),
                waits=tuple(sorted(self._waits, key=lambda w: (w.start, w.end))),
                platform=self._platform_name,
                started_at=self._started_at,
                duration=max(end, samples[-1].t if samples else 0.0),
                sample_hz=self.sampler.hz,
                decimation=self.sampler.decimation,
                leak_tolerance_bytes=self._leak_tolerance,
                leak_grace_s=self._leak_grace,
                context_free=self._context_free,
                command=None if command is None else tuple(command),
                exit_code=exit_code,
                notes=tuple(self._notes),
            )
