"""Hostile visible-device variables: a 100 KB value is never echoed whole, and the work a parser
does is bounded by the value's length (counted in Python calls, not timed)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from accelplat._backends.simulated import ENV_VISIBLE, SimulatedPlatform
from accelplat._visible.cuda import GpuRecord, resolve_cuda_visible_devices
from accelplat._visible.oneapi import Hierarchy, visible_targets
from accelplat._visible.rocm import visible_physical_indices
from accelplat.errors import ConfigurationError

BIG = 100_000
PAD = "x" * BIG
MESSAGE_LIMIT = 1_000  # the longest error any of these may give, variable names and all

_ONEAPI = [  # (environment, words the message keeps)
    ({"ZE_AFFINITY_MASK": PAD}, "is not a device index"),
    ({"ZE_AFFINITY_MASK": "0," + PAD}, "is not a device index"),
    ({"ZE_AFFINITY_MASK": "1.1.1" + "0" * BIG}, "sub-sub-device"),
    ({"ZE_AFFINITY_MASK": "0." + "1" * BIG, "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}, "sub-device"),
    ({"ONEAPI_DEVICE_SELECTOR": PAD}, "not of the form"),
    ({"ONEAPI_DEVICE_SELECTOR": PAD + ":0"}, "unknown backend"),
    ({"ONEAPI_DEVICE_SELECTOR": "level_zero:" + PAD}, "unsupported device"),
    ({"ONEAPI_DEVICE_SELECTOR": "!level_zero:0." + "1" * BIG}, "cannot name a sub-device"),
    ({"ONEAPI_DEVICE_SELECTOR": "!level_zero:0;level_zero:" + "1" * BIG}, "must all come"),
    (
        {"ONEAPI_DEVICE_SELECTOR": "level_zero:0." + "1" * BIG, "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"},
        "names a sub-device",
    ),
]
_ROCM = [
    ({"ROCR_VISIBLE_DEVICES": "0,," + PAD}, "empty entry", False),
    ({"ROCR_VISIBLE_DEVICES": "G" + PAD}, "by UUID", False),
    ({"HIP_VISIBLE_DEVICES": "GPU-" + PAD}, "by UUID", False),
    ({"HIP_VISIBLE_DEVICES": "0" + PAD, "CUDA_VISIBLE_DEVICES": "1" + PAD}, "disagree", True),
]


def _short(error: BaseException, words: str) -> None:
    text = str(error)
    assert words in text
    assert len(text) < MESSAGE_LIMIT, f"{len(text)} characters"
    assert f"({BIG + 1}" in text or f"({BIG}" in text or "characters)" in text


@pytest.mark.parametrize(("env", "words"), _ONEAPI)
def test_oneapi_errors_quote_a_huge_value_shortened(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        visible_targets([2, 2], env, Hierarchy.COMPOSITE)
    _short(info.value, words)


@pytest.mark.parametrize(("env", "words", "uuids"), _ROCM)
def test_rocm_errors_quote_a_huge_value_shortened(
    env: dict[str, str], words: str, uuids: bool
) -> None:
    with pytest.raises(ConfigurationError) as info:
        visible_physical_indices(2, env, ["GPU-01", "GPU-02"] if uuids else None)
    _short(info.value, words)


@pytest.mark.parametrize(
    "value",
    ["7" + PAD, "GPU-" + "f" * BIG, "GPU-zz" + PAD, "0," + "0" * BIG, "MIG-" + "c" * BIG],
    ids=["ordinal", "uuid-long", "uuid-bad", "duplicate", "mig"],
)
def test_cuda_notes_quote_a_huge_entry_shortened(value: str) -> None:
    gpus = [GpuRecord(0, "GPU-" + "a" * 32), GpuRecord(1, "GPU-" + "b" * 32)]
    notes = resolve_cuda_visible_devices(value, gpus).notes
    assert notes
    assert all(len(note) < MESSAGE_LIMIT for note in notes)


def test_simulated_visible_devices_error_quotes_a_huge_value_shortened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = SimulatedPlatform.from_spec({"devices": [{"total": 1, "count": 2}]})
    monkeypatch.setenv(ENV_VISIBLE, "0,0," + PAD)
    with pytest.raises(ConfigurationError) as info:
        platform.devices()
    _short(info.value, "twice")


@pytest.mark.parametrize(
    "digit",
    ["\u0663", "\uff11", "\u00b9", "\u0967", "\U0001d7cf"],
    ids=["arabic", "fullwidth", "super", "devanagari", "math"],
)
def test_simulated_visible_devices_reads_ascii_digits_only(
    monkeypatch: pytest.MonkeyPatch, digit: str
) -> None:
    # int() reads these as 3, 1, … but the variable is parsed as CUDA parses its own: ASCII only
    platform = SimulatedPlatform.from_spec({"devices": [{"total": 1, "count": 4}]})
    monkeypatch.setenv(ENV_VISIBLE, f"0,{digit}")
    assert [d.physical_index for d in platform.devices()] == [0]


@contextmanager
def _count_calls() -> Iterator[list[int]]:
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


TERMS = 5_000
_MANY: list[tuple[str, Callable[[], object]]] = [
    (
        "selector-terms",
        lambda: visible_targets(
            [2], {"ONEAPI_DEVICE_SELECTOR": ";".join(["level_zero:0"] * TERMS)}
        ),
    ),
    (
        "selector-discards",
        lambda: visible_targets(
            [2], {"ONEAPI_DEVICE_SELECTOR": ";".join(["!level_zero:9"] * TERMS)}
        ),
    ),
    (
        "selector-items",
        lambda: visible_targets([2], {"ONEAPI_DEVICE_SELECTOR": "*:" + ",".join(["*"] * TERMS)}),
    ),
    ("mask", lambda: visible_targets([2, 2], {"ZE_AFFINITY_MASK": ",".join(["0.1"] * TERMS)})),
    (
        "rocr",
        lambda: visible_physical_indices(4, {"ROCR_VISIBLE_DEVICES": ",".join(["9"] * TERMS)}),
    ),
    ("hip", lambda: visible_physical_indices(4, {"HIP_VISIBLE_DEVICES": ",".join(["1"] * TERMS)})),
    (
        "cuda",
        lambda: resolve_cuda_visible_devices(
            ",".join(["0"] * TERMS), [GpuRecord(0, "GPU-" + "a" * 32)]
        ),
    ),
]


@pytest.mark.parametrize("parse", [p for _, p in _MANY], ids=[n for n, _ in _MANY])
def test_parsers_work_in_proportion_to_the_value(parse: Callable[[], object]) -> None:
    with _count_calls() as calls:
        parse()
    # a loop over the terms inside the loop over the terms makes TERMS**2 / 2 = 12.5 M calls
    assert calls[0] < 40 * TERMS, f"{calls[0]} Python calls for {TERMS} entries"
