"""Background sampling of device memory, with bounded storage, and the recorder built on it."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from accelplat import _util, _validate
from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES
from accelplat._owners import sample
from accelplat._platform import optional
from accelplat.errors import AccelplatError, ConfigurationError
from accelplat.timeline import _trace
from accelplat.timeline._defaults import DEFAULT_HZ, DEFAULT_LEAK_GRACE_S
from accelplat.timeline._trace import MAX_INT, MAX_SECONDS, Reading, Sample, Trace, WaitSpan, clip

if TYPE_CHECKING:
    from accelplat._platform import Platform

MAX_HZ = 1000.0  # highest sampling rate accepted
DEFAULT_CAPACITY = 16_384  # samples kept before the buffer halves its resolution

Clock = Callable[[], float]


def validate_hz(hz: object, *, argument: str = "hz") -> float:
    """Return the sampling rate ``hz`` as a float; ConfigurationError unless in ``(0, MAX_HZ]``."""
    expected = f"in (0, {MAX_HZ:g}] samples/s"
    return _validate.number(hz, argument, above=0, maximum=MAX_HZ, expected=expected)


def validate_grace(seconds: object, *, argument: str = "leak_grace_s") -> float:
    """Return the leak grace period as a float; ConfigurationError unless in ``0..1e9``."""
    expected = "a finite number of seconds in 0..1e9"  # what a trace holds
    return _validate.number(seconds, argument, minimum=0, maximum=MAX_SECONDS, expected=expected)


def _merge(a: Reading, b: Reading) -> Reading:
    return tuple(
        x if y is None else y if x is None else max(x, y) for x, y in zip(a, b, strict=True)
    )


# Every sampler reads under this lock, and a fork takes it first: no sampling thread may be inside
# a vendor library call when the process forks, or the child could inherit a lock held by a thread
# that does not exist there.
_READING = threading.Lock()
os.register_at_fork(
    before=_READING.acquire, after_in_parent=_READING.release, after_in_child=_READING.release
)


class Sampler:
    """Reads device memory at a fixed rate on a daemon thread, keeping at most ``capacity`` samples.

    ``read`` returns used bytes per device (``None`` where a query failed) and must not raise.
    Once ``capacity`` (even, >= 2) samples are kept, neighbours merge pairwise (the larger
    reading, so peaks survive) and each kept sample spans twice the ticks: at 20 Hz and 16,384
    samples, full resolution for 13.6 minutes, 0.1 s for the next 13.6, … A fork waits for the
    read in progress; the child has no sampling thread.

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
        if _validate.integer(capacity, "capacity", minimum=2, expected="an even integer >= 2") % 2:
            raise ConfigurationError(f"capacity must be even, got {capacity!r}")
        self._read = read
        self.hz = validate_hz(hz)
        self._clock = clock
        self._capacity = capacity
        self._samples: list[Sample] = []
        self._ticks = 0  # merged into the last sample, which takes them up to 2**decimation
        self.decimation = 0  # times halved
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = clock()

    def now(self) -> float:
        """Return seconds since the sampler was created."""
        return self._clock() - self.t0

    def sample(self) -> tuple[float, Reading]:
        """Read every device now, keep the reading and return ``(t, reading)``."""
        with _READING:
            reading = tuple(self._read())
            t = self.now()
            if 0 < self._ticks < 1 << self.decimation:
                last = self._samples[-1]
                self._samples[-1] = Sample(last.t, _merge(last.used, reading))
            else:
                if len(self._samples) == self._capacity:
                    pairs = zip(self._samples[::2], self._samples[1::2], strict=True)
                    self._samples = [Sample(a.t, _merge(a.used, b.used)) for a, b in pairs]
                    self.decimation += 1
                self._samples.append(Sample(t, reading))
                self._ticks = 0
            self._ticks += 1
        return t, reading

    def start(self) -> None:
        """Start sampling on a daemon thread named ``accelplat-timeline``; idempotent."""
        if self._thread is not None and self._thread.is_alive():
            return  # (a forked child has no sampling thread: it may start its own)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accelplat-timeline", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sampling thread and wait for it (up to ``timeout`` seconds)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
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

    def samples(self) -> tuple[Sample, ...]:
        """Return the kept samples in time order."""
        with _READING:
            return tuple(self._samples)


class Recorder:
    """Samples a platform's memory and collects test spans and memory waits into a trace.

    Thread-safe; ``platform=None`` records no memory. Queries the devices once on creation, cuts
    text too long for a trace, and notes once each device whose query fails.

    Raises:
        ConfigurationError: For a bad rate, capacity, tolerance or grace period.
    """

    @classmethod
    def of_current_platform(cls, **options: Any) -> Recorder:
        """Return a recorder of the current platform (detected, cached); without one, of spans.

        ``options`` are the constructor's keywords, ``notes`` aside.

        Raises:
            ConfigurationError: For a bad rate, tolerance or grace period.
        """
        from accelplat._registry import current_platform

        platform: Platform | None
        try:
            platform, notes = current_platform(), []
        except AccelplatError as exc:
            platform, notes = None, [f"No platform was sampled: {exc}"]
        return cls(platform, notes=notes, **options)

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
        self._leak_tolerance = _validate.integer(
            leak_tolerance_bytes, "leak_tolerance_bytes", minimum=0, maximum=MAX_INT
        )
        self._leak_grace = validate_grace(leak_grace_s)
        self.platform = platform  # what is sampled; None: nothing
        self._lock = threading.Lock()
        self._failures: dict[int, tuple[float | None, str, int]] = {}  # first t, error, count
        found = () if platform is None else platform.devices()
        indices = tuple(d.index for d in found)
        self.devices = tuple(
            _trace.DeviceTrack(d.index, clip(d.name), total or 0)
            for d, total in zip(found, self._read(indices, "total"), strict=True)
        )
        self._notes = [clip(note) for note in notes]
        self._started_at = min(max(wall_clock(), 0.0), _trace.MAX_EPOCH)  # a trace holds no other
        self.sampler = Sampler(
            lambda: self._read(indices, "used"), hz=hz, capacity=capacity, clock=clock
        )
        self._open_tests: dict[str, _trace.TestSpan] = {}  # spans still ending as they began
        self._tests: list[_trace.TestSpan] = []
        self._open_waits: dict[int, WaitSpan] = {}
        self._waits: list[WaitSpan] = []
        self._tokens = itertools.count()
        self._end: float | None = None

    @property
    def current_test(self) -> str | None:
        """Node id of the test begun most recently and not yet ended, if any."""
        return next((s.nodeid for s in reversed(self._open_tests.values())), None)

    def add_note(self, note: str) -> None:
        """Add a remark shown on the report."""
        with self._lock:
            self._notes.append(clip(note))

    def _read(self, indices: tuple[int, ...], field: str) -> Reading:
        """Read ``field`` of the devices (one reading of the one sampler), as a trace holds it."""
        if self.platform is None or not indices:
            return ()
        reading = sample(self.platform, indices, holders=False, on_error=self._failed)
        values: list[int | None] = []
        for index in indices:
            info = reading.memory.get(index)
            try:  # the sampler must never break the session it watches: a failure is noted
                value = None if info is None else max(0, int(getattr(info, field)))
                if value is not None and value > MAX_INT:
                    raise ValueError(f"{field} of {value} bytes is more than a trace holds")
            except Exception as exc:
                self._failed(index, exc)
                value = None
            values.append(value)
        return tuple(values)

    def _failed(self, index: int, exc: Exception) -> None:
        # The first queries (the totals) run before the sampler exists: at no time yet.
        t = self.sampler.now() if hasattr(self, "sampler") else None
        with self._lock:
            first_t, error, count = self._failures.get(index, (t, "", 0))
            error = error or _util.clip(f"{type(exc).__name__}: {exc}", 500)
            self._failures[index] = (first_t, error, count + 1)

    def start(self) -> None:
        """Take a first sample and start the sampling thread."""
        self.sampler.sample()
        self.sampler.start()

    def begin_test(self, nodeid: str) -> None:
        """Mark the start of a test, sampling memory now as its baseline."""
        t, reading = self.sampler.sample()
        with self._lock:
            self._open_tests.pop(nodeid, None)  # begun again: the most recent
            self._open_tests[nodeid] = _trace.TestSpan(clip(nodeid), t, t, reading, ())

    def begin_body(self, nodeid: str) -> None:
        """Mark the start of a test's body (pytest's call phase); an unknown id is ignored."""
        t = self.sampler.now()
        with self._lock:
            opened = self._open_tests.get(nodeid)
            if opened is not None and opened.body_start is None:
                self._open_tests[nodeid] = replace(opened, body_start=t)

    def end_test(
        self,
        nodeid: str,
        outcome: str = "",
        *,
        sample: tuple[float, Reading] | None = None,
        owners: Sequence[_trace.SpanOwners] = (),
    ) -> _trace.TestSpan | None:
        """Mark the end of a test, sampling memory now to compare with its baseline.

        Args:
            nodeid: The id given to :meth:`begin_test`.
            outcome: ``"passed"``, ``"failed"``, ``"skipped"`` or any short word.
            sample: A :meth:`Sampler.sample` from the teardown's end, to use instead of one now.
            owners: Whose memory each device held before and after it (the leak check's).

        Returns:
            The finished span, or ``None`` when the test was never begun.
        """
        t, reading = self.sampler.sample() if sample is None else sample
        with self._lock:
            opened = self._open_tests.pop(nodeid, None)
            if opened is None:
                return None
            span = replace(
                opened, end=t, used_after=reading, outcome=clip(outcome), owners=tuple(owners)
            )
            self._tests.append(span)
            return span

    def begin_wait(self, kind: str, devices: Sequence[int] = ()) -> int:
        """Mark the start of a memory wait; return a token for :meth:`end_wait`."""
        t = self.sampler.now()
        with self._lock:
            token = next(self._tokens)
            test = self.current_test
            self._open_waits[token] = WaitSpan(t, t, clip(kind), tuple(devices), True, test)
            return token

    def end_wait(self, token: int, *, ok: bool = True, keep: bool = True) -> WaitSpan | None:
        """Mark the end of the wait ``token`` came from.

        Args:
            token: What :meth:`begin_wait` returned.
            ok: ``False`` when the wait raised (a timeout included).
            keep: ``False`` drops the wait (a fixture's, already recorded by the wait itself).

        Returns:
            The finished span, or ``None`` for an unknown token or a dropped wait.
        """
        t = self.sampler.now()
        with self._lock:
            opened = self._open_waits.pop(token, None)
            if opened is None or not keep:
                return None
            span = replace(opened, end=t, ok=ok)
            self._waits.append(span)
            return span

    def linger(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Sample while the last test holds memory, up to the grace, to judge it like the rest."""
        with self._lock:
            if not self._tests:
                return
            last = max(self._tests, key=lambda s: s.end)
        while self.sampler.now() < last.end + self._leak_grace:
            _, reading = self.sampler.sample()
            if all(
                b is None or r is None or r - b <= self._leak_tolerance
                for b, r in zip(last.used_before, reading, strict=False)
            ):
                return
            sleep(1.0 / self.sampler.hz)

    def stop(self) -> Trace:
        """Stop sampling, sample once more, close what is open and return the trace (then again)."""
        if self._end is None:
            self.sampler.stop()
            self._end, _ = self.sampler.sample()
            for nodeid in list(self._open_tests):
                self.end_test(nodeid, "unfinished")
            for token in list(self._open_waits):
                self.end_wait(token, ok=False)
        return self.trace()

    def trace(self, *, command: Sequence[str] | None = None, exit_code: int | None = None) -> Trace:
        """Return what was recorded so far; ``command`` and ``exit_code`` are for ``record``."""
        samples, decimation = self.sampler.samples(), self.sampler.decimation
        with self._lock:  # never wait for the sampler's lock here: _failed runs under it
            end = self._end if self._end is not None else self.sampler.now()
            failures = []
            for index, (t, error, count) in sorted(self._failures.items()):
                when = "as recording began" if t is None else f"at {t:.3f} s"
                more = f" ({count} failed queries in all)" if count > 1 else ""
                failures.append(f"Device {index} could not be read {when}{more}: {error}")
            return Trace(
                devices=self.devices,
                samples=samples,
                tests=tuple(sorted(self._tests, key=lambda s: (s.start, s.end))),
                waits=tuple(sorted(self._waits, key=lambda w: (w.start, w.end))),
                platform="" if self.platform is None else self.platform.name,
                started_at=self._started_at,
                duration=max(end, samples[-1].t if samples else 0.0),
                sample_hz=self.sampler.hz,
                decimation=decimation,
                leak_tolerance_bytes=self._leak_tolerance,
                leak_grace_s=self._leak_grace,
                context_free=self.platform is None or bool(self.platform.context_free),
                accelerator=self.platform is None
                or bool(optional(self.platform, "is_accelerator")),
                command=None if command is None else tuple(clip(c) for c in command),
                exit_code=exit_code,
                notes=(*self._notes, *failures),
            )
