"""The footprint store: peaks from a timeline, budgets with a margin, untrusted reading."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accelplat._types import GIB, MIB
from accelplat.errors import ConfigurationError
from accelplat.timeline._footprints import (
    MAX_FOOTPRINTS_BYTES,
    budget_for,
    footprints_of,
    load_footprints,
    save_footprints,
)
from accelplat.timeline._trace import DeviceTrack, Sample, TestSpan, Trace


def trace(*tests: TestSpan) -> Trace:
    devices = (DeviceTrack(0, "a", 80 * GIB), DeviceTrack(1, "b", 80 * GIB))
    samples = (
        Sample(0.5, (1 * GIB, 0)),
        Sample(1.5, (9 * GIB, 2 * GIB)),  # a's peak: 8 GiB over its start on device 0
        Sample(2.5, (1 * GIB, 0)),
        Sample(3.5, (1 * GIB, 30 * GIB)),  # during the overlapping pair
        Sample(5.5, (None, 5 * GIB)),
    )
    return Trace(devices=devices, samples=samples, tests=tests)


def span(nodeid: str, start: float, end: float, outcome: str = "passed") -> TestSpan:
    return TestSpan(nodeid, start, end, (1 * GIB, 0), (1 * GIB, 0), outcome)


def test_a_peak_is_the_largest_growth_on_any_device_of_a_test_that_ran_alone() -> None:
    peaks = footprints_of(
        trace(
            span("a", 1.0, 2.0),
            span("p", 3.0, 4.0),
            span("q", 3.2, 3.8),  # overlaps p: neither can be measured
            span("after", 11.0, 13.0),
            span("s", 7.0, 8.0, "skipped"),
            span("long", 9.0, 12.0),
            span("inside", 10.0, 10.5),  # overlaps a span that started two before
            span("c", 5.0, 6.0),  # device 0 unread: device 1's growth of 5 GiB counts
        )
    )
    assert peaks == {"a": 8 * GIB, "c": 5 * GIB}


def test_the_budget_margin() -> None:
    assert budget_for(0) == 256 * MIB
    assert budget_for(8 * GIB) == 10 * GIB + 256 * MIB


def test_save_merges_and_load_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "fp.json"
    assert load_footprints(path) == {}  # no store yet
    save_footprints(path, {"a": 1, "b": 2})
    save_footprints(path, {"b": 3})
    assert load_footprints(path) == {"a": 1, "b": 3}
    assert json.loads(path.read_text())["format"] == "accelplat.footprints"


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"format": "other", "tests": {}}, "format"),
        ({"format": "accelplat.footprints", "version": 2, "tests": {}}, "version"),
        ({"format": "accelplat.footprints", "tests": []}, "tests"),
        ({"format": "accelplat.footprints", "tests": {"a": 5}}, "tests['a']"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peak_bytes": 2**51}}}, "peak_bytes"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peak_bytes": True}}}, "peak_bytes"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peak": 1}}}, "unknown key"),
    ],
    ids=str,
)
def test_a_malformed_store_names_the_file_and_field(
    tmp_path: Path, doc: object, field: str
) -> None:
    path = tmp_path / "fp.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigurationError, match="footprint store") as info:
        load_footprints(path)
    assert field in str(info.value)
    with pytest.raises(ConfigurationError):
        save_footprints(path, {"x": 1})  # a malformed store is not overwritten
    assert json.loads(path.read_text()) == doc


def test_what_is_not_a_small_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigurationError, match="cannot read footprint store"):
        load_footprints(tmp_path / "fifo")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_FOOTPRINTS_BYTES + 1))
    with pytest.raises(ConfigurationError, match="larger than"):
        load_footprints(big)
