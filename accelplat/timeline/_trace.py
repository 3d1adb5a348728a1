"""The memory-timeline data model and its versioned JSON form.

A :class:`Trace` is what one recording produced: the sampled devices, the samples, the test
spans and the memory waits. Times are seconds since the start of the recording (a monotonic
clock); ``started_at`` anchors them to the wall clock. The JSON document is described in
``docs/timeline.md``; :func:`load_trace` treats it as untrusted (size cap, no ``NaN``, every
field's type and range checked) and names the offending field in a ``ConfigurationError``.
"""

from __future__ import annotations

import bisect
import gc
import json
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from accelplat import _files
from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES, is_leak, leaked_bytes
from accelplat._types import MIB
from accelplat._validate import JsonFields
from accelplat.errors import ConfigurationError
from accelplat.timeline._defaults import DEFAULT_LEAK_GRACE_S

TRACE_FORMAT = "accelplat.timeline"  # the ``format`` key of every trace document
TRACE_VERSION = 1  # the document version this module writes and reads
MAX_TRACE_BYTES = 256 * MIB  # largest trace file load_trace reads by default

_MAX_DEVICES = 4096
_MAX_ITEMS = 10_000_000
_MAX_TEXT = 65_536
_MAX_INT = 2**63 - 1  # a signed 64-bit integer
_MAX_SECONDS = 1e9  # any time, duration or rate: about 31 years
_MAX_EPOCH = 253_402_300_799.0  # the last second of the year 9999, the last a date can show
_EXIT_RANGE = (-(2**31), 2**31 - 1)  # a C int

Reading = tuple[int | None, ...]
"""Used bytes per sampled device, in :attr:`Trace.devices` order; ``None`` where a query failed."""


@dataclass(frozen=True)
class DeviceTrack:
    """One sampled device.

    Attributes:
        index: Visible device index.
        name: Device name as the platform reports it.
        total: Usable bytes of the device; ``0`` when unknown.
    """

    index: int
    name: str
    total: int


@dataclass(frozen=True)
class Sample:
    """Used memory of every sampled device at one moment.

    Attributes:
        t: Seconds since the start of the recording.
        used: Used bytes per device, in :attr:`Trace.devices` order; ``None`` where the query
            failed. After decimation a sample holds the largest reading of the samples it
            replaced, so peaks survive.
    """

    t: float
    used: Reading


@dataclass(frozen=True)
class TestSpan:
    """One test, from the start of its setup to the end of its teardown.

    Attributes:
        nodeid: The pytest node id (or, for ``accelplat record``, the command line).
        start: Seconds since the start of the recording when the test began.
        end: Seconds since the start of the recording when the test ended.
        used_before: Used bytes per device sampled as the test began.
        used_after: Used bytes per device sampled as the test ended.
        outcome: ``"passed"``, ``"failed"``, ``"skipped"``, an exit status, or ``""``.
        body_start: Seconds since the start of the recording when the test's body (pytest's call
            phase) began, after its set-up; ``None`` when it never ran or is not known.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    start: float
    end: float
    used_before: Reading
    used_after: Reading
    outcome: str = ""
    body_start: float | None = None

    @property
    def duration(self) -> float:
        """Seconds the test took."""
        return self.end - self.start


@dataclass(frozen=True)
class WaitSpan:
    """One memory wait (a settle or clear), as observed during the recording.

    Attributes:
        start: Seconds since the start of the recording when the wait began.
        end: Seconds since the start of the recording when it returned or raised.
        kind: What waited, e.g. ``"settle"``, ``"clear"`` or ``"fixture:settled_device_memory"``.
        devices: The visible device indices waited on; empty when not known.
        ok: ``False`` when the wait ended in an error (a timeout included).
        test: Node id of the test that was running, or ``None`` outside any test.
    """

    start: float
    end: float
    kind: str
    devices: tuple[int, ...] = ()
    ok: bool = True
    test: str | None = None

    @property
    def duration(self) -> float:
        """Seconds the wait took."""
        return self.end - self.start


@dataclass(frozen=True)
class Leak:
    """Memory a test left held on one device.

    Attributes:
        nodeid: The test.
        device: Visible device index.
        before: Used bytes as the test began.
        at_end: Used bytes as it ended.
        after: The least usage seen from its end until the next test's body began (or, when
            none followed, until the leak grace period ran out).
    """

    nodeid: str
    device: int
    before: int
    at_end: int
    after: int

    @property
    def leaked(self) -> int:
        """Bytes still held beyond what was held before the test: ``after - before``."""
        return self.after - self.before


@dataclass(frozen=True)
class Trace:
    """Everything one timeline recording produced.

    Attributes:
        devices: The sampled devices.
        samples: Samples in time order.
        tests: Test spans in start order; spans overlap only when tests ran in parallel.
        waits: Memory waits in start order.
        platform: Name of the sampled platform; ``""`` when detection failed.
        started_at: Wall-clock time (``time.time()``) of ``t = 0``.
        duration: Seconds from the start to the end of the recording.
        sample_hz: Requested sampling rate.
        decimation: How many times the sample buffer was halved; the stored samples are
            ``2 ** decimation / sample_hz`` seconds apart.
        leak_tolerance_bytes: Growth across a test below or at which it is not a leak.
        leak_grace_s: Seconds after the last test (or any test no other test's body follows)
            during which memory may still come back (lazy release, a child process exiting)
            before what is left counts as leaked.
        context_free: ``False`` when the platform's memory queries create a device context in
            the sampling process.
        command: The command ``accelplat record`` ran, or ``None`` for a pytest session.
        exit_code: The command's (or pytest session's) exit status, when known.
        notes: Remarks shown on the report (a failed detection, a device that could not be read).
        partial: ``True`` when the recording was cut short (a signal ended it); the notes say
            how.
    """

    devices: tuple[DeviceTrack, ...]
    samples: tuple[Sample, ...]
    tests: tuple[TestSpan, ...] = ()
    waits: tuple[WaitSpan, ...] = ()
    platform: str = ""
    started_at: float = 0.0
    duration: float = 0.0
    sample_hz: float = 0.0
    decimation: int = 0
    leak_tolerance_bytes: int = DEFAULT_LEAK_TOLERANCE_BYTES
    leak_grace_s: float = DEFAULT_LEAK_GRACE_S
    context_free: bool = True
    command: tuple[str, ...] | None = None
    exit_code: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    partial: bool = False

    @cached_property
    def _times(self) -> list[float]:
        return [s.t for s in self.samples]

    @cached_property
    def _bodies(self) -> list[float]:
        return sorted(t.body_start for t in self.tests if t.body_start is not None)

    def judged_at(self, span: TestSpan, grace_s: float | None = None) -> float:
        """Return when what ``span`` still holds is judged: the end of its window.

        That is when the body of the next test begins (its set-up, a settle wait included, still
        gives memory time to come back), or, when no test body follows, ``grace_s`` seconds
        after ``span`` ended.

        Args:
            span: One of :attr:`tests`.
            grace_s: Seconds to look past the end of a test no body follows; ``None`` uses
                :attr:`leak_grace_s`.
        """
        i = bisect.bisect_left(self._bodies, span.end)
        if i < len(self._bodies):
            return self._bodies[i]
        return span.end + (self.leak_grace_s if grace_s is None else grace_s)

    def held_after(self, span: TestSpan, grace_s: float | None = None) -> Reading:
        """Return per device the least usage seen from the end of ``span`` to :meth:`judged_at`.

        Memory that comes back before the next test's body runs (lazy release, a child process
        exiting, a settle wait in the next set-up) is not held; memory a later body frees does
        not excuse this test.

        Args:
            span: One of :attr:`tests`.
            grace_s: Seconds to look past a test no body follows; ``None`` uses
                :attr:`leak_grace_s`.

        Returns:
            Used bytes per device; ``None`` where nothing was read.
        """
        grace = self.leak_grace_s if grace_s is None else grace_s
        table = self._held_cache.get(grace)
        if table is None:
            table = self._held_cache[grace] = self._held_after_all(grace)
        held = table.get(id(span))
        if held is not None and self.tests[held[0]] is span:
            return held[1]
        return self._held_after_one(span, grace)  # a span that is not one of `tests`

    @cached_property
    def _held_cache(self) -> dict[float, dict[int, tuple[int, Reading]]]:
        return {}

    def _held_after_one(self, span: TestSpan, grace_s: float) -> Reading:
        lo = bisect.bisect_right(self._times, span.end)  # used_after stands for time `end`
        hi = bisect.bisect_right(self._times, self.judged_at(span, grace_s))
        out: list[int | None] = []
        for pos, at_end in enumerate(span.used_after):
            values = [v for s in self.samples[lo:hi] if (v := s.used[pos]) is not None]
            if at_end is not None:
                values.append(at_end)
            out.append(min(values, default=None))
        return tuple(out)

    def _held_after_all(self, grace_s: float) -> dict[int, tuple[int, Reading]]:
        """:meth:`held_after` of every test at once, in O(samples + tests) per device.

        In order of their ends, the windows ``(end, judged_at]`` only move right (judged_at
        grows with end), so one sliding-window minimum per device answers them all.
        """
        times = self._times
        samples = self.samples
        order = sorted(range(len(self.tests)), key=lambda i: self.tests[i].end)
        width = len(self.devices)
        windows: list[deque[int]] = [deque() for _ in range(width)]
        added = 0
        out: dict[int, tuple[int, Reading]] = {}
        for i in order:
            span = self.tests[i]
            lo = bisect.bisect_right(times, span.end)
            hi = bisect.bisect_right(times, self.judged_at(span, grace_s))
            for k in range(added, hi):
                used = samples[k].used
                for pos in range(min(width, len(used))):
                    value = used[pos]
                    if value is None:
                        continue
                    window = windows[pos]
                    while window and samples[window[-1]].used[pos] >= value:  # type: ignore[operator]
                        window.pop()
                    window.append(k)
            added = hi
            held: list[int | None] = []
            for pos, at_end in enumerate(span.used_after):
                best: int | None = None
                if pos < width:
                    window = windows[pos]
                    while window and window[0] < lo:
                        window.popleft()
                    if window and window[0] < hi:
                        best = samples[window[0]].used[pos]
                if at_end is not None and (best is None or at_end < best):
                    best = at_end
                held.append(best)
            out[id(span)] = (i, tuple(held))
        return out

    def growth(self, span: TestSpan, grace_s: float | None = None) -> tuple[int | None, ...]:
        """Return per device what ``span`` left held: :meth:`held_after` less ``used_before``.

        Args:
            span: One of :attr:`tests`.
            grace_s: Seconds to look past a test no body follows; ``None`` uses
                :attr:`leak_grace_s`.

        Returns:
            Bytes per device (negative when the test freed memory); ``None`` where unknown.
        """
        return tuple(
            leaked_bytes(b, a)
            for b, a in zip(span.used_before, self.held_after(span, grace_s), strict=False)
        )

    def leaks(self, tolerance_bytes: int | None = None, grace_s: float | None = None) -> list[Leak]:
        """Return every (test, device) whose usage grew by more than the tolerance, largest first.

        A test leaks on a device when :meth:`growth` exceeds the tolerance. With tests running
        in parallel (pytest-xdist), a neighbour's memory counts too.

        Args:
            tolerance_bytes: Growth allowed; ``None`` uses :attr:`leak_tolerance_bytes`.
            grace_s: Seconds to look past a test no body follows; ``None`` uses
                :attr:`leak_grace_s`.

        Returns:
            :class:`Leak` entries sorted by leaked bytes, largest first.
        """
        tol = self.leak_tolerance_bytes if tolerance_bytes is None else tolerance_bytes
        found: list[Leak] = []
        for span in self.tests:
            held = self.held_after(span, grace_s)
            for pos, dev in enumerate(self.devices):
                if pos >= len(span.used_before) or pos >= len(held):
                    continue
                before, at_end, after = span.used_before[pos], span.used_after[pos], held[pos]
                if before is not None and after is not None and is_leak(before, after, tol):
                    found.append(
                        Leak(
                            span.nodeid,
                            dev.index,
                            before,
                            after if at_end is None else at_end,
                            after,
                        )
                    )
        found.sort(key=lambda leak: (-leak.leaked, leak.nodeid, leak.device))
        return found

    def slowest_waits(self, n: int = 10) -> list[WaitSpan]:
        """Return the ``n`` longest waits, longest first."""
        return sorted(self.waits, key=lambda w: (-w.duration, w.start))[: max(0, n)]

    def to_json(self) -> dict[str, Any]:
        """Return the trace as a JSON-ready dictionary (format version :data:`TRACE_VERSION`)."""
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "platform": self.platform,
            "started_at": self.started_at,
            "duration": _r(self.duration),
            "sample_hz": self.sample_hz,
            "decimation": self.decimation,
            "leak_tolerance_bytes": self.leak_tolerance_bytes,
            "leak_grace_s": self.leak_grace_s,
            "context_free": self.context_free,
            "command": None if self.command is None else list(self.command),
            "exit_code": self.exit_code,
            "notes": list(self.notes),
            "partial": self.partial,
            "devices": [{"index": d.index, "name": d.name, "total": d.total} for d in self.devices],
            "samples": [[_r(s.t), *s.used] for s in self.samples],
            "tests": [
                {
                    "nodeid": t.nodeid,
                    "start": _r(t.start),
                    "end": _r(t.end),
                    "outcome": t.outcome,
                    "used_before": list(t.used_before),
                    "used_after": list(t.used_after),
                    "body_start": None if t.body_start is None else _r(t.body_start),
                }
                for t in self.tests
            ],
            "waits": [
                {
                    "start": _r(w.start),
                    "end": _r(w.end),
                    "kind": w.kind,
                    "devices": list(w.devices),
                    "ok": w.ok,
                    "test": w.test,
                }
                for w in self.waits
            ],
        }

    @classmethod
    def from_json(cls, doc: object) -> Trace:
        """Build a trace from a parsed JSON document, validating every field.

        Args:
            doc: What ``json.loads`` returned.

        Returns:
            The trace.

        Raises:
            ConfigurationError: Naming the first field that is missing, mistyped or out of
                range, or an unsupported ``format``/``version``.
        """
        return _parse(doc)


def _r(t: float) -> float:
    return round(t, 6)


def dumps_trace(trace: Trace) -> str:
    """Return the JSON text of ``trace`` (compact, one sample per line is not promised)."""
    return json.dumps(trace.to_json(), separators=(",", ":"), allow_nan=False)


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as JSON to ``path`` atomically (a temporary file, then a rename).

    Args:
        trace: The trace.
        path: Destination; its directory must exist.

    Returns:
        The path written.

    Raises:
        OSError: When the file cannot be written.
    """
    return _files.write_text_atomic(path, dumps_trace(trace))


def loads_trace(text: str | bytes, *, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Parse and validate a trace document.

    Args:
        text: The JSON text (``bytes`` are decoded as UTF-8).
        max_bytes: Larger input is refused before parsing.

    Returns:
        The trace.

    Raises:
        ConfigurationError: For input over ``max_bytes``, invalid UTF-8 or JSON, ``NaN`` or
            ``Infinity``, nesting too deep, or any field :meth:`Trace.from_json` rejects.
    """
    size = len(text.encode("utf-8")) if isinstance(text, str) else len(text)
    if size > max_bytes:
        raise ConfigurationError(f"trace is {size} bytes, more than the limit of {max_bytes}")
    # Parsing builds millions of small containers that hold no cycles: the cyclic garbage
    # collector, run again and again as they are allocated, would only slow it down.
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            raw = text.decode("utf-8") if isinstance(text, bytes) else text
            doc = json.loads(raw, parse_constant=_reject_constant)
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"trace is not UTF-8 text: {exc.reason}") from None
        except RecursionError:
            raise ConfigurationError("trace JSON is nested too deeply") from None
        except ValueError as exc:  # json.JSONDecodeError and _reject_constant
            raise ConfigurationError(f"trace is not valid JSON: {exc}") from None
        return _parse(doc)
    finally:
        if collecting:
            gc.enable()


def load_trace(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read, parse and validate the trace file at ``path``.

    Args:
        path: A file written by :func:`save_trace` (or by hand, following ``docs/timeline.md``).
        max_bytes: Files larger than this are refused without being read whole.

    Returns:
        The trace.

    Raises:
        ConfigurationError: When the file cannot be read, is too large, or is not a valid trace.
    """
    data = _files.read_document(path, limit=max_bytes, what="trace")
    return loads_trace(data, max_bytes=max_bytes)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a trace")


# ---------------------------------------------------------------------------------------------
# validation


_FIELDS = JsonFields("trace field", max_items=_MAX_ITEMS, max_text=_MAX_TEXT)
"""The trace's field checks (:mod:`accelplat._validate`)."""

_fail = _FIELDS.error
_obj = _FIELDS.mapping
_list = _FIELDS.array
_text = _FIELDS.text
_bool = _FIELDS.boolean


def _int(value: object, where: str, *, minimum: int = 0, maximum: int = _MAX_INT) -> int:
    return _FIELDS.integer(value, where, minimum=minimum, maximum=maximum)


def _opt_int(value: object, where: str) -> int | None:
    return None if value is None else _int(value, where)


def _float(value: object, where: str, *, maximum: float = _MAX_SECONDS) -> float:
    return _FIELDS.number(value, where, maximum=maximum)


def _reading(value: object, where: str, n: int, offset: int = 0) -> Reading:
    items = _list(value, where, _MAX_DEVICES)
    if len(items) != n:
        raise ConfigurationError(f"trace field {where}: expected {n} values (one per device)")
    return tuple(_opt_int(v, f"{where}[{i + offset}]") for i, v in enumerate(items))


def _body_start(value: object, start: float, end: float, i: int) -> float | None:
    if value is None:
        return None
    t = _float(value, f"tests[{i}].body_start")
    if not start <= t <= end:
        raise ConfigurationError(f"trace field tests[{i}].body_start: outside the test's span")
    return t


def _decimation(value: object) -> int:
    d = _int(value, "decimation")
    if d > 62:
        raise _fail("decimation", "an integer in 0..62", value)
    return d


def _samples(rows: Sequence[Any], n: int) -> tuple[list[Sample], float]:
    """Validate the samples; return them and the last time.

    The common case (a list of ``n + 1`` plain numbers in range, time not going backwards) is
    checked inline, since a long recording has hundreds of thousands of rows; anything else
    goes through the field-by-field checks, which name what is wrong.
    """
    samples: list[Sample] = []
    last_t = 0.0
    width = n + 1
    for i, row in enumerate(rows):
        if type(row) is list and len(row) == width:
            t = row[0]
            used = tuple(row[1:])
            if (
                (type(t) is float or type(t) is int)
                and last_t <= t <= _MAX_SECONDS
                and all(v is None or (type(v) is int and 0 <= v <= _MAX_INT) for v in used)
            ):
                last_t = float(t)
                samples.append(Sample(last_t, used))
                continue
        checked = _list(row, f"samples[{i}]", width)
        if len(checked) != width:
            raise ConfigurationError(
                f"trace field samples[{i}]: expected [t, used…] with {width} values"
            )
        t = _float(checked[0], f"samples[{i}][0]")
        if t < last_t:
            raise ConfigurationError(f"trace field samples[{i}][0]: time goes backwards")
        last_t = t
        samples.append(Sample(t, _reading(checked[1:], f"samples[{i}]", n, offset=1)))
    return samples, last_t


def _parse(doc: object) -> Trace:
    top = _obj(doc, "(top level)")
    if top.get("format") != TRACE_FORMAT:
        raise _fail("format", repr(TRACE_FORMAT), top.get("format"))
    version = top.get("version")
    if version != TRACE_VERSION or isinstance(version, bool):
        raise ConfigurationError(
            f"unsupported trace version {version!r}; this accelplat reads version {TRACE_VERSION}"
        )

    devices: list[DeviceTrack] = []
    seen: set[int] = set()
    for i, raw in enumerate(_list(top.get("devices"), "devices", _MAX_DEVICES)):
        d = _obj(raw, f"devices[{i}]")
        index = _int(d.get("index"), f"devices[{i}].index")
        if index in seen:
            raise ConfigurationError(f"trace field devices[{i}].index: device {index} repeats")
        seen.add(index)
        name = _text(d.get("name"), f"devices[{i}].name")
        devices.append(DeviceTrack(index, name, _int(d.get("total"), f"devices[{i}].total")))
    n = len(devices)

    samples, last_t = _samples(_list(top.get("samples"), "samples"), n)

    tests: list[TestSpan] = []
    for i, raw in enumerate(_list(top.get("tests", []), "tests")):
        s = _obj(raw, f"tests[{i}]")
        start = _float(s.get("start"), f"tests[{i}].start")
        end = _float(s.get("end"), f"tests[{i}].end")
        if end < start:
            raise ConfigurationError(f"trace field tests[{i}].end: earlier than its start")
        tests.append(
            TestSpan(
                nodeid=_text(s.get("nodeid"), f"tests[{i}].nodeid"),
                start=start,
                end=end,
                used_before=_reading(s.get("used_before"), f"tests[{i}].used_before", n),
                used_after=_reading(s.get("used_after"), f"tests[{i}].used_after", n),
                outcome=_text(s.get("outcome", ""), f"tests[{i}].outcome"),
                body_start=_body_start(s.get("body_start"), start, end, i),
            )
        )

    waits: list[WaitSpan] = []
    for i, raw in enumerate(_list(top.get("waits", []), "waits")):
        w = _obj(raw, f"waits[{i}]")
        start = _float(w.get("start"), f"waits[{i}].start")
        end = _float(w.get("end"), f"waits[{i}].end")
        if end < start:
            raise ConfigurationError(f"trace field waits[{i}].end: earlier than its start")
        test = w.get("test")
        waits.append(
            WaitSpan(
                start=start,
                end=end,
                kind=_text(w.get("kind"), f"waits[{i}].kind"),
                devices=tuple(
                    _int(v, f"waits[{i}].devices[{j}]")
                    for j, v in enumerate(_list(w.get("devices", []), f"waits[{i}].devices"))
                ),
                ok=_bool(w.get("ok", True), f"waits[{i}].ok"),
                test=None if test is None else _text(test, f"waits[{i}].test"),
            )
        )

    command = top.get("command")
    exit_code = top.get("exit_code")
    if exit_code is not None:
        _int(exit_code, "exit_code", minimum=_EXIT_RANGE[0], maximum=_EXIT_RANGE[1])
    hz = _float(top.get("sample_hz", 0.0), "sample_hz")
    return Trace(
        devices=tuple(devices),
        samples=tuple(samples),
        tests=tuple(tests),
        waits=tuple(waits),
        platform=_text(top.get("platform", ""), "platform"),
        started_at=_float(top.get("started_at", 0.0), "started_at", maximum=_MAX_EPOCH),
        duration=_float(top.get("duration", last_t), "duration"),
        sample_hz=hz,
        decimation=_decimation(top.get("decimation", 0)),
        leak_tolerance_bytes=_int(
            top.get("leak_tolerance_bytes", DEFAULT_LEAK_TOLERANCE_BYTES), "leak_tolerance_bytes"
        ),
        leak_grace_s=_float(top.get("leak_grace_s", DEFAULT_LEAK_GRACE_S), "leak_grace_s"),
        context_free=_bool(top.get("context_free", True), "context_free"),
        command=None
        if command is None
        else tuple(
            _text(c, f"command[{i}]") for i, c in enumerate(_list(command, "command", 100_000))
        ),
        exit_code=exit_code,
        notes=tuple(
            _text(x, f"notes[{i}]") for i, x in enumerate(_list(top.get("notes", []), "notes"))
        ),
        partial=_bool(top.get("partial", False), "partial"),
    )
