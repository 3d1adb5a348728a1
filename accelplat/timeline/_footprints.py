"""The footprint store: each test's peak device memory, written by a timeline, read by packing.

A small JSON document (``docs/leasing.md``): ``{"format": "accelplat.footprints", "version": 1,
"tests": {"<node id>": {"peak_bytes": <int>}}}``. It is untrusted input when read.
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from pathlib import Path

from accelplat import _files
from accelplat._types import MIB
from accelplat._validate import JsonFields
from accelplat.errors import ConfigurationError
from accelplat.timeline._trace import Trace

FOOTPRINTS_FORMAT = "accelplat.footprints"
FOOTPRINTS_VERSION = 1
MAX_FOOTPRINTS_BYTES = 16 * MIB
MAX_TESTS = 100_000
MAX_PEAK_BYTES = 2**50  # 1 PiB
# a recorded peak becomes a budget with this margin: x1.25, plus 256 MiB for what varies
# between runs (allocator rounding, a larger batch, the context of a newer driver)
MARGIN_RATIO = 1.25
MARGIN_BYTES = 256 * MIB

_FIELDS = JsonFields("footprints", max_items=MAX_TESTS, max_text=4096)


def budget_for(peak_bytes: int) -> int:
    """The budget a test recorded at ``peak_bytes`` gets: ``ceil(peak x 1.25) + 256 MiB``."""
    return math.ceil(peak_bytes * MARGIN_RATIO) + MARGIN_BYTES


def footprints_of(trace: Trace) -> dict[str, int]:
    """Each test's peak growth of used memory over its start, on its busiest device.

    Only tests that ran alone (no other test's span overlaps theirs) and were not skipped are
    measured: memory seen while another test ran cannot be told apart.
    """
    spans = sorted(trace.tests, key=lambda s: s.start)
    times = [s.t for s in trace.samples]
    out: dict[str, int] = {}
    ended = -math.inf  # the latest end of the spans that started before this one
    for i, span in enumerate(spans):
        before, ended = ended, max(ended, span.end)
        after = spans[i + 1].start if i + 1 < len(spans) else math.inf
        if span.outcome == "skipped" or before > span.start or after < span.end:
            continue
        peak = 0
        inside = trace.samples[bisect_left(times, span.start) : bisect_right(times, span.end)]
        for pos, base in enumerate(span.used_before):
            if base is None:
                continue
            readings = [used for s in inside if (used := s.used[pos]) is not None]
            readings += [u for u in (span.used_after[pos],) if u is not None]
            peak = max(peak, max(readings, default=base) - base)
        out[span.nodeid] = peak
    return out


def load_footprints(path: str | os.PathLike[str]) -> dict[str, int]:
    """Read a footprint store; a missing file is an empty store.

    Raises:
        ConfigurationError: For a file that is not a regular file, too large or malformed,
            naming the file and the field.
    """
    if not os.path.lexists(path):
        return {}
    raw = _files.read_document(path, limit=MAX_FOOTPRINTS_BYTES, what="footprint store")
    try:
        data = json.loads(raw.decode("utf-8"))
        keys = {"format", "version", "tests"}
        top = _FIELDS.mapping(data, "top level", keys, {"format", "tests"})
        if top["format"] != FOOTPRINTS_FORMAT:
            raise _FIELDS.error("format", repr(FOOTPRINTS_FORMAT), top["format"])
        if top.get("version", 1) != FOOTPRINTS_VERSION:
            raise _FIELDS.error("version", str(FOOTPRINTS_VERSION), top.get("version"))
        tests = _FIELDS.mapping(top["tests"], "tests")
        if len(tests) > MAX_TESTS:
            raise _FIELDS.problem("tests", f"{len(tests)} entries; at most {MAX_TESTS}")
        out = {}
        for nodeid, entry in tests.items():
            where = f"tests[{_FIELDS.text(nodeid, 'tests key')!r}]"
            fields = _FIELDS.mapping(entry, where, {"peak_bytes"}, {"peak_bytes"})
            out[nodeid] = _FIELDS.integer(
                fields["peak_bytes"], f"{where}.peak_bytes", minimum=0, maximum=MAX_PEAK_BYTES
            )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ConfigurationError):
            raise ConfigurationError(f"footprint store {os.fspath(path)}: {exc}") from None
        raise ConfigurationError(f"footprint store {os.fspath(path)}: not JSON text") from None
    return out


def save_footprints(path: str | os.PathLike[str], peaks: Mapping[str, int]) -> Path:
    """Merge ``peaks`` into the store at ``path`` (newer figures win) and write it atomically.

    Raises:
        ConfigurationError: When the existing store is malformed (it is not overwritten).
        OSError: When the file cannot be written.
    """
    target = Path(path)
    merged = {**load_footprints(target), **peaks}
    if len(merged) > MAX_TESTS:  # keep the newest figures
        merged = dict(list(merged.items())[-MAX_TESTS:])
    doc = {
        "format": FOOTPRINTS_FORMAT,
        "version": FOOTPRINTS_VERSION,
        "tests": {k: {"peak_bytes": v} for k, v in sorted(merged.items())},
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target
