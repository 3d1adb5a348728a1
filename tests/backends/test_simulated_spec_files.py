"""Simulated-platform spec files that are malformed, huge or nested without end are refused with
bounded work and memory.

Work is counted, not timed (a loaded machine makes any wall-clock bound flaky): the Python
function calls a refusal makes, the bytes it asks the one file reader for, and its peak memory.
"""

from __future__ import annotations

import json
import re
import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelplat
import accelplat.errors
from accelplat import _files
from accelplat._backends.simulated import (
    SimulatedPlatform,
    load_spec,
    spec_from_mapping,
)
from accelplat._backends.simulated._model import MAX_DEVICES, MAX_SPEC_BYTES
from accelplat.errors import (
    ConfigurationError,
)
from tests._hostile import FAST
from tests.fakes.hostfs import host_files

# =============================================================================================
# simulated-platform spec files
# =============================================================================================


def _max_size_spec() -> str:
    """A spec just under the size limit, as full of timeline segments as allowed."""
    segment = '{"at":1,"used":1}'
    per_device = 10_000
    device = '{"total":"80GiB","count":64,"timeline":[' + ",".join([segment] * per_device) + "]}"
    devices = [device] * 5  # 5 × 64 = 320 devices: over the limit, found after parsing
    text = '{"clock":"virtual","devices":[' + ",".join(devices) + "]}"
    assert len(text) < MAX_SPEC_BYTES
    return text


HOSTILE_SPECS: list[Any] = [
    pytest.param("spec.json", "[" * 100_000 + "]" * 100_000, "nested too deeply", id="deep-array"),
    pytest.param("spec.json", '{"a":' * 50_000 + "1" + "}" * 50_000, "nested", id="deep-object"),
    pytest.param("spec.toml", "a = " + "[" * 50_000 + "]" * 50_000, "nested", id="deep-toml"),
    pytest.param(
        "spec.json", '{"devices":[{"total":' + "9" * 5000 + "}]}", "malformed", id="long-int"
    ),
    pytest.param(
        "spec.toml", "[[devices]]\ntotal = " + "9" * 5000, "malformed", id="toml-long-int"
    ),
    pytest.param("spec.json", '{"devices":[{"total":1e400}]}', "finite", id="float-overflow"),
    pytest.param("spec.json", '{"devices":[{"total":NaN}]}', "NaN", id="nan"),
    pytest.param("spec.json", '{"devices":[{"total":-Infinity}]}', "Infinity", id="infinity"),
    pytest.param(
        "spec.json", '{"devices":[{"total":"' + "9" * 60 + 'P"}]}', "1 PiB", id="enormous-size"
    ),
    pytest.param(
        "spec.json", '{"devices":[{"total":"' + "9" * 5000 + '"}]}', "not a size", id="long-size"
    ),
    pytest.param(
        "spec.json",
        '{"devices":[{"total":1,"count":' + "9" * 100 + "}]}",
        "count",
        id="count-huge",
    ),
    pytest.param(
        "spec.json",
        json.dumps({"devices": [{"total": 1, "count": MAX_DEVICES}] * 2}),
        f"at most {MAX_DEVICES}",
        id="count-amplified",
    ),
    pytest.param("spec.json", _max_size_spec(), f"at most {MAX_DEVICES}", id="max-size-file"),
    pytest.param("spec.json", " " * (MAX_SPEC_BYTES + 1), "larger than", id="oversized"),
    pytest.param("spec.json", b"\xff\xfe\x00garbage", "not UTF-8", id="binary"),
    pytest.param("spec.json", '{"devices": "' + "A" * 500_000 + '"}', "must be a list", id="str"),
    pytest.param(
        "spec.json",
        json.dumps({"devices": [{"total": 1, "name": "n" * 100_000}]}),
        "name",
        id="long-name",
    ),
    pytest.param("spec.json", "null", "top level", id="null"),
    pytest.param("spec.json", "", "malformed", id="empty"),
]


CALL_BUDGET = 20_000
"""Python function calls a refusal may make. The costliest refusal (TOML nested up to the
recursion limit) makes about 6,000; validating the timeline segments of the max-size file one by
one (50,000 of them) makes about 900,000, so a refusal that does that work fails the bound."""

MEMORY_BUDGET = 64 * 2**20
"""Peak bytes a refusal may allocate (the largest accepted file is 16 MiB of text)."""


class _CountingFiles(_files.HostFiles):
    """The real reader, noting each read's path, the limit asked for and the bytes returned."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int, int]] = []

    def read_bytes(self, path: str, limit: int) -> bytes:
        data = super().read_bytes(path, limit)
        self.reads.append((path, limit, len(data)))
        return data


@contextmanager
def _count_calls() -> Iterator[list[int]]:
    """Count the Python function calls made in this thread within the block."""
    calls = [0]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls[0] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


@pytest.mark.parametrize(("name", "text", "message"), HOSTILE_SPECS)
def test_hostile_spec_files_are_refused_quickly_and_cheaply(
    tmp_path: Path, name: str, text: str | bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    files = _CountingFiles()
    tracemalloc.start()
    try:
        with (
            host_files(files),
            pytest.raises(ConfigurationError, match=re.escape(message)) as info,
            _count_calls() as calls,
        ):
            load_spec(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value)
    assert calls[0] < CALL_BUDGET, f"{calls[0]} Python calls to refuse it"
    assert peak < MEMORY_BUDGET
    # One read, capped at the spec limit; a file over it is refused by the reader itself, which
    # never takes in more than the limit and a byte, so nothing comes back to be parsed.
    expected = [] if len(text) > MAX_SPEC_BYTES else [(str(path), MAX_SPEC_BYTES)]
    assert [(p, limit) for p, limit, _ in files.reads] == expected


def test_a_hostile_spec_named_by_the_variable_makes_the_platform_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spec.json"
    path.write_text("[" * 100_000)
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(path))
    result = SimulatedPlatform.probe()
    assert not result.available
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    with pytest.raises(accelplat.errors.PlatformNotAvailableError, match="nested too deeply"):
        accelplat.current_platform()


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["4GiB", "1e9", "80GiB", "virtual", "alive", "max"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "devices",
                    "total",
                    "used",
                    "timeline",
                    "at",
                    "linear",
                    "lazy",
                    "stuck",
                    "to",
                    "start",
                    "end",
                    "tau",
                    "holders",
                    "count",
                    "release",
                    "lazy",
                    "clock",
                    "name",
                    "graph",
                    "pid",
                    "state",
                    "version",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@FAST
@given(st.dictionaries(st.sampled_from(["devices", "release", "graph", "clock", "version"]), _json))
def test_any_json_document_is_a_spec_or_a_configuration_error(document: dict[str, Any]) -> None:
    try:
        spec = spec_from_mapping(document)
    except ConfigurationError as exc:
        message = str(exc)
    else:
        assert 1 <= len(spec.devices) <= MAX_DEVICES
        return
    assert message.startswith("simulated spec")
