"""The memory-timeline data model and its versioned JSON form (described in ``docs/timeline.md``).

:func:`load_trace` treats a document as untrusted (size cap, no ``NaN``, every field checked)
and names the offending field in a ``ConfigurationError``.
"""

from __future__ import annotations

import bisect
import gc
import json
import os
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from accelplat import _files, _util
from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES, Blame, Holdings, judge
from accelplat._types import MIB
from accelplat._validate import JsonFields
from accelplat.errors import ConfigurationError
from accelplat.timeline._defaults import DEFAULT_LEAK_GRACE_S

TRACE_FORMAT = "accelplat.timeline"  # the ``format`` key of every trace document
TRACE_VERSION = 1  # the document version this module writes and reads
MAX_TRACE_BYTES = 256 * MIB  # largest trace file load_trace reads by default

_MAX_DEVICES = 4096
_MAX_ITEMS = 10_000_000
MAX_TEXT = 131_072  # characters in any string: the longest argument Linux passes to a program
MAX_INT = 2**63 - 1  # any integer: a signed 64-bit one
MAX_SECONDS = 1e9  # any time, duration or rate: about 31 years
MAX_EPOCH = 253_402_300_799.0  # the last second of the year 9999, the last a date can show

_TEST_KEYS = ("nodeid", "start", "end", "outcome", "used_before", "used_after", "body_start")
Reading = tuple[int | None, ...]  # used bytes per device, in Trace.devices order; None: failed
LEAK_CHECK_KIND = "leak check"  # the kind of the leak check's own wait (pytest_plugin/_leaks.py)


@dataclass(frozen=True)
class DeviceTrack:
    """One sampled device: its visible index, name and usable bytes (``0`` when unknown)."""

    index: int
    name: str
    total: int


@dataclass(frozen=True)
class Sample:
    """Used bytes per device at ``t``; after decimation, the largest of the readings merged."""

    t: float
    used: Reading


@dataclass(frozen=True)
class SpanOwners:
    """Whose memory one device held before and after one test, as the leak check read it."""

    device: int  # the visible index (a DeviceTrack's)
    before: Holdings
    after: Holdings
    context: int = 0  # bytes of the test process's first device context, first seen here


@dataclass(frozen=True)
class TestSpan:
    """One test, from the start of its set-up to the end of its teardown."""

    __test__ = False  # not a pytest test class

    nodeid: str  # the pytest node id (for ``accelplat record``, the command line)
    start: float
    end: float
    used_before: Reading
    used_after: Reading
    outcome: str = ""  # "passed", "failed", "skipped", an exit status, or ""
    body_start: float | None = None  # when the body (pytest's call phase) began; None: never
    owners: tuple[SpanOwners, ...] = ()  # per device, by owner; empty: judged on whole devices

    @property
    def duration(self) -> float:
        """Seconds the test took."""
        return self.end - self.start


@dataclass(frozen=True)
class WaitSpan:
    """One memory wait (a settle or clear) seen during the recording."""

    start: float
    end: float
    kind: str  # what waited, e.g. "settle" or "fixture:settled_device_memory"
    devices: tuple[int, ...] = ()  # visible device indices waited on; empty when not known
    ok: bool = True  # False when the wait ended in an error (a timeout included)
    test: str | None = None  # node id of the test that was running

    @property
    def duration(self) -> float:
        """Seconds the wait took."""
        return self.end - self.start

    @property
    def by_leak_check(self) -> bool:
        """Whether the leak check itself waited, for a test's memory (kind ``"leak check"``)."""
        return self.kind == LEAK_CHECK_KIND


@dataclass(frozen=True)
class Leak:
    """Memory a test left held on one device (used bytes before, at its end, and after)."""

    nodeid: str
    device: int
    before: int
    at_end: int
    after: int  # the least from its end until the next test's body began (or the grace ran out)
    blame: Blame | None = None  # the verdict by owner; None: judged on the whole device

    @property
    def leaked(self) -> int:
        """Bytes blamed on the test: by owner where known, else ``after - before``."""
        if self.blame is not None and self.blame.leaked is not None:
            return self.blame.leaked
        return self.after - self.before


@dataclass(frozen=True)
class Trace:
    """Everything one timeline recording produced; times are seconds since its start."""

    devices: tuple[DeviceTrack, ...]
    samples: tuple[Sample, ...]
    tests: tuple[TestSpan, ...] = ()  # in start order; they overlap only when run in parallel
    waits: tuple[WaitSpan, ...] = ()  # in start order
    platform: str = ""  # "" when detection failed
    started_at: float = 0.0  # time.time() of t = 0
    duration: float = 0.0
    sample_hz: float = 0.0  # the requested rate
    decimation: int = 0  # halvings: samples are 2**decimation / sample_hz seconds apart
    leak_tolerance_bytes: int = DEFAULT_LEAK_TOLERANCE_BYTES  # growth that is not yet a leak
    leak_grace_s: float = DEFAULT_LEAK_GRACE_S  # s after the last test for memory to come back
    context_free: bool = True  # False when the memory queries create a device context
    accelerator: bool = True  # False: the host's memory (the CPU platform), where none leaks
    command: tuple[str, ...] | None = None  # what ``accelplat record`` ran; None for pytest
    exit_code: int | None = None  # the command's (or session's) exit status, when known
    notes: tuple[str, ...] = ()  # remarks shown on the report
    partial: bool = False  # True when a signal cut the recording short; the notes say how

    @cached_property
    def _times(self) -> list[float]:
        return [s.t for s in self.samples]

    @cached_property
    def _bodies(self) -> list[float]:
        return sorted(t.body_start for t in self.tests if t.body_start is not None)

    @cached_property
    def _held(self) -> dict[int, Reading]:
        return self._held_after_all(self.tests)

    def judged_at(self, span: TestSpan) -> float:
        """Return when ``span``'s memory is judged: the next body's start, or the grace after it."""
        i = bisect.bisect_left(self._bodies, span.end)
        return self._bodies[i] if i < len(self._bodies) else span.end + self.leak_grace_s

    def held_after(self, span: TestSpan) -> Reading:
        """Return per device the least usage from the end of ``span`` to :meth:`judged_at`."""
        # While the trace lives no other object has the id of one of its tests.
        held = self._held.get(id(span))
        return self._held_after_all((span,))[id(span)] if held is None else held

    def _held_after_all(self, spans: Sequence[TestSpan]) -> dict[int, Reading]:
        # held_after of every span in O(samples + spans) per device: in order of their ends the
        # windows (end, judged_at] only move right, so one sliding-window minimum answers them all.
        windows: defaultdict[int, deque[tuple[int, int]]] = defaultdict(deque)  # (k, used)
        added = 0
        out: dict[int, Reading] = {}
        for span in sorted(spans, key=lambda s: s.end):
            # the samples after `end` (used_after stands for it) up to judged_at, included
            lo, hi = (bisect.bisect_right(self._times, t) for t in (span.end, self.judged_at(span)))
            for k in range(added, hi):
                for pos, value in enumerate(self.samples[k].used):
                    if value is not None:
                        window = windows[pos]
                        while window and window[-1][1] >= value:
                            window.pop()
                        window.append((k, value))
            added = max(added, hi)
            held: list[int | None] = []
            for pos, at_end in enumerate(span.used_after):
                window = windows[pos]
                while window and window[0][0] < lo:
                    window.popleft()
                values = [v for v in (window[0][1] if window else None, at_end) if v is not None]
                held.append(min(values, default=None))
            out[id(span)] = tuple(held)
        return out

    def growth(self, span: TestSpan) -> tuple[int | None, ...]:
        """Return per device the bytes the leak rule holds against ``span`` (``None``: unknown).

        By owner where the span has the test process's readings, else :meth:`held_after` less
        ``used_before``: the one figure the report shows for a test, in every table.
        """
        return tuple(None if v is None else v[0].leaked for v in self._verdicts(span))

    def _verdicts(self, span: TestSpan) -> Iterator[tuple[Blame, Leak] | None]:
        # Per device the leak rule's verdict on ``span`` and the leak it is if it is one.
        owned = {o.device: o for o in span.owners}
        held = self.held_after(span)
        rows = zip(self.devices, span.used_before, span.used_after, held, strict=False)
        for dev, before, at_end, after in rows:
            record = owned.get(dev.index)
            if record is not None:
                blame = judge(record.before, record.after, record.context)
                used = record.before.used, record.after.used, record.after.used
                yield (blame, Leak(span.nodeid, dev.index, *used, blame))
            elif before is None or after is None:
                yield None
            else:
                judged = self.accelerator
                blame = judge(Holdings(before, judged=judged), Holdings(after, judged=judged))
                end = after if at_end is None else at_end
                yield (blame, Leak(span.nodeid, dev.index, before, end, after))

    def leaks(self) -> list[Leak]:
        """Return every (test, device) the leak rule blames beyond the tolerance, largest first.

        The rule is :func:`accelplat._leaks.judge`, the leak check's, on :meth:`growth`'s terms,
        with the trace's tolerance and grace period (``dataclasses.replace`` it for others).
        """
        verdicts = [v for span in self.tests for v in self._verdicts(span) if v is not None]
        found = [leak for blame, leak in verdicts if blame.is_leak(self.leak_tolerance_bytes)]
        return sorted(found, key=lambda leak: (-leak.leaked, leak.nodeid, leak.device))

    def slowest_waits(self, n: int = 10) -> list[WaitSpan]:
        """Return the ``n`` longest waits of the code under test (not the leak check's)."""
        waits = [w for w in self.waits if not w.by_leak_check]
        return sorted(waits, key=lambda w: (-w.duration, w.start))[: max(0, n)]

    def to_json(self) -> dict[str, Any]:
        """Return the trace as a JSON-ready dictionary (format version :data:`TRACE_VERSION`)."""
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            **{key: getattr(self, key) for key in _SCALARS},
            "duration": _plain(self.duration),
            "devices": [asdict(d) for d in self.devices],
            "samples": [[_plain(s.t), *s.used] for s in self.samples],
            "tests": [
                {key: _plain(getattr(t, key)) for key in _TEST_KEYS}
                | ({"owners": [_owners_json(o) for o in t.owners]} if t.owners else {})
                for t in self.tests
            ],
            "waits": [{key: _plain(value) for key, value in asdict(w).items()} for w in self.waits],
        }

    @classmethod
    def from_json(cls, doc: object) -> Trace:
        """Build a trace from what ``json.loads`` returned, validating every field.

        Raises:
            ConfigurationError: Naming the first bad field, or an unsupported format or version.
        """
        top = _FIELDS.mapping(doc, "(top level)")
        if top.get("format") != TRACE_FORMAT:
            raise _FIELDS.error("format", repr(TRACE_FORMAT), top.get("format"))
        version = top.get("version")
        if version != TRACE_VERSION or isinstance(version, bool):
            readable = f"this accelplat reads version {TRACE_VERSION}"
            raise ConfigurationError(f"unsupported trace version {version!r}; {readable}")

        devices: dict[int, DeviceTrack] = {}
        for i, raw in enumerate(_list(top.get("devices"), "devices", _MAX_DEVICES)):
            d = _FIELDS.mapping(raw, f"devices[{i}]")
            index = _int(d.get("index"), f"devices[{i}].index")
            if index in devices:
                raise ConfigurationError(f"trace field devices[{i}].index: device {index} repeats")
            name = _text(d.get("name"), f"devices[{i}].name")
            devices[index] = DeviceTrack(index, name, _int(d.get("total"), f"devices[{i}].total"))
        n = len(devices)
        samples, last_t = _samples(_list(top.get("samples"), "samples"), n)
        tests = [_test(raw, i, n) for i, raw in enumerate(_list(top.get("tests", []), "tests"))]
        waits = [_wait(raw, i) for i, raw in enumerate(_list(top.get("waits", []), "waits"))]
        return cls(
            devices=tuple(devices.values()),
            samples=tuple(samples),
            tests=tuple(tests),
            waits=tuple(waits),
            duration=_float(top.get("duration", last_t), "duration"),
            **{key: check(top[key], key) for key, check in _SCALARS.items() if key in top},
        )


def lanes(spans: Sequence[TestSpan | WaitSpan], most: int | None = None) -> list[int]:
    """Return per span (in start order) the first lane free when it starts.

    Beyond ``most`` lanes, a span shares the lane that frees first (a chart has room for a few);
    without a limit, spans on one lane never overlap (a Chrome trace's slices must nest).
    """
    ends: list[float] = []
    out: list[int] = []
    for span in spans:
        lane = next((k for k, end in enumerate(ends) if end <= span.start), None)
        if lane is None and (most is None or len(ends) < most):
            lane = len(ends)
            ends.append(span.end)
        elif lane is None:
            lane = min(range(len(ends)), key=ends.__getitem__)
        ends[lane] = max(ends[lane], span.end)
        out.append(lane)
    return out


def _plain(value: object) -> Any:
    """A value as the JSON holds it: a time to the microsecond, a tuple as a list."""
    if isinstance(value, float):
        return round(value, 6)
    return list(value) if isinstance(value, tuple) else value


def holdings_json(h: Holdings) -> dict[str, Any]:
    """Return ``h`` as JSON-ready data (a trace's, and what xdist workers send back)."""
    return {
        "used": h.used,
        "own": h.own,
        "others": h.others,
        "children": [[pid, held] for pid, held in sorted(h.children.items())],
        "judged": h.judged,
    }


def _owners_json(o: SpanOwners) -> dict[str, Any]:
    return {**asdict(o), "before": holdings_json(o.before), "after": holdings_json(o.after)}


clip = partial(_util.clip, limit=MAX_TEXT)  # cut text to the longest a trace holds


def dumps_trace(trace: Trace) -> str:
    """Return the compact JSON text of ``trace``."""
    return json.dumps(trace.to_json(), separators=(",", ":"), allow_nan=False)


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as JSON to ``path`` (its directory must exist) atomically; return it.

    Raises:
        OSError: When the file cannot be written.
    """
    return _files.write_text_atomic(path, dumps_trace(trace))


def loads_trace(text: str | bytes, *, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Parse and validate a trace document (``bytes`` are UTF-8); refuse over ``max_bytes``."""
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
        return Trace.from_json(doc)
    finally:
        if collecting:
            gc.enable()


def load_trace(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read, parse and validate the trace file at ``path``, refusing one over ``max_bytes``.

    Raises:
        ConfigurationError: When the file cannot be read, is too large, or is not a valid trace.
    """
    data = _files.read_document(path, limit=max_bytes, what="trace")
    return loads_trace(data, max_bytes=max_bytes)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a trace")


_FIELDS = JsonFields("trace field", max_items=_MAX_ITEMS, max_text=MAX_TEXT)

_list = _FIELDS.array
_text = _FIELDS.text
_int = partial(_FIELDS.integer, minimum=0, maximum=MAX_INT)
_float = partial(_FIELDS.number, maximum=MAX_SECONDS)


def _reading(value: object, where: str, n: int, offset: int = 0) -> Reading:
    items = _list(value, where, _MAX_DEVICES)
    if len(items) != n:
        raise ConfigurationError(f"trace field {where}: expected {n} values (one per device)")
    return tuple(
        None if v is None else _int(v, f"{where}[{i}]") for i, v in enumerate(items, offset)
    )


def _test(raw: object, i: int, n: int) -> TestSpan:
    where = f"tests[{i}]"
    s, start, end = _span(raw, where)
    nodeid = _text(s.get("nodeid"), f"{where}.nodeid")
    before, after = (_reading(s.get(k), f"{where}.{k}", n) for k in ("used_before", "used_after"))
    outcome = _text(s.get("outcome", ""), f"{where}.outcome")
    body = _optional(_float)(s.get("body_start"), f"{where}.body_start")
    if body is not None and not start <= body <= end:
        raise ConfigurationError(f"trace field {where}.body_start: outside the test's span")
    raw_owners = _list(s.get("owners", []), f"{where}.owners", _MAX_DEVICES)
    owners = tuple(span_owners(o, f"{where}.owners[{j}]") for j, o in enumerate(raw_owners))
    return TestSpan(nodeid, start, end, before, after, outcome, body, owners)


def span_owners(raw: object, where: str) -> SpanOwners:
    """Parse one :class:`SpanOwners` of untrusted JSON; ``ConfigurationError`` names a bad field."""
    o = _FIELDS.mapping(raw, where)
    device = _int(o.get("device"), f"{where}.device")
    context = _int(o.get("context", 0), f"{where}.context")
    before = holdings(o.get("before"), f"{where}.before")
    return SpanOwners(device, before, holdings(o.get("after"), f"{where}.after"), context)


def holdings(raw: object, where: str) -> Holdings:
    """Parse one :class:`~accelplat._leaks.Holdings` of untrusted JSON (:func:`holdings_json`)."""
    h = _FIELDS.mapping(raw, where)
    children: dict[int, int] = {}
    for k, pair in enumerate(_list(h.get("children", []), f"{where}.children", _MAX_DEVICES)):
        item = _list(pair, f"{where}.children[{k}]", 2)
        if len(item) != 2:
            raise _FIELDS.error(f"{where}.children[{k}]", "[pid, bytes]", pair)
        pid = _FIELDS.integer(item[0], f"{where}.children[{k}][0]", minimum=1, maximum=2**31 - 1)
        children[pid] = _int(item[1], f"{where}.children[{k}][1]")
    used = _int(h.get("used"), f"{where}.used")
    own, others = (_optional(_int)(h.get(k), f"{where}.{k}") for k in ("own", "others"))
    judged = _FIELDS.boolean(h.get("judged", True), f"{where}.judged")
    return Holdings(used=used, own=own, children=children, others=others, judged=judged)


def _wait(raw: object, i: int) -> WaitSpan:
    where = f"waits[{i}]"
    w, start, end = _span(raw, where)
    kind = _text(w.get("kind"), f"{where}.kind")
    values = _list(w.get("devices", []), f"{where}.devices")
    devices = tuple(_int(v, f"{where}.devices[{j}]") for j, v in enumerate(values))
    ok = _FIELDS.boolean(w.get("ok", True), f"{where}.ok")
    return WaitSpan(start, end, kind, devices, ok, _optional(_text)(w.get("test"), f"{where}.test"))


def _samples(rows: Sequence[Any], n: int) -> tuple[list[Sample], float]:
    # The common row (n + 1 plain numbers in range, time not going backwards) is checked inline:
    # a long recording has hundreds of thousands. Others go through the checks that name a fault.
    samples: list[Sample] = []
    last_t = 0.0
    width = n + 1
    for i, row in enumerate(rows):
        if type(row) is list and len(row) == width:
            t, used = row[0], tuple(row[1:])
            fine = all(v is None or (type(v) is int and 0 <= v <= MAX_INT) for v in used)
            if fine and (type(t) is float or type(t) is int) and last_t <= t <= MAX_SECONDS:
                last_t = float(t)
                samples.append(Sample(last_t, used))
                continue
        checked = _list(row, f"samples[{i}]", width)
        if len(checked) != width:
            raise _FIELDS.problem(f"samples[{i}]", f"expected [t, used…] with {width} values")
        t = _float(checked[0], f"samples[{i}][0]")
        if t < last_t:
            raise ConfigurationError(f"trace field samples[{i}][0]: time goes backwards")
        last_t = t
        samples.append(Sample(t, _reading(checked[1:], f"samples[{i}]", n, offset=1)))
    return samples, last_t


def _span(raw: object, where: str) -> tuple[Any, float, float]:
    span = _FIELDS.mapping(raw, where)
    start, end = (_float(span.get(key), f"{where}.{key}") for key in ("start", "end"))
    if end < start:
        raise ConfigurationError(f"trace field {where}.end: earlier than its start")
    return span, start, end


def _optional(check: Callable[[object, str], Any]) -> Callable[[object, str], Any]:
    """``check`` that lets ``null`` (``None``) through."""
    return lambda value, where: None if value is None else check(value, where)


def _texts(value: object, where: str) -> tuple[str, ...]:
    return tuple(_text(x, f"{where}[{i}]") for i, x in enumerate(_list(value, where)))


# The trace's plain fields, each with its check (an absent one takes the dataclass's default).
_SCALARS: dict[str, Callable[[object, str], Any]] = {
    "platform": _text,
    "started_at": partial(_float, maximum=MAX_EPOCH),
    "sample_hz": _float,
    "decimation": partial(_int, maximum=62),  # halvings of a 64-bit count
    "leak_tolerance_bytes": _int,
    "leak_grace_s": _float,
    "context_free": _FIELDS.boolean,
    "accelerator": _FIELDS.boolean,
    "partial": _FIELDS.boolean,
    "command": _optional(_texts),
    "exit_code": _optional(partial(_FIELDS.integer, minimum=-(2**31), maximum=2**31 - 1)),  # C int
    "notes": _texts,
}
