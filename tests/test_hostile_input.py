"""Hostile input: malformed variables, arguments, spec files and command lines.

* The ``CUDA_VISIBLE_DEVICES`` resolver is checked against a reference model of CUDA's rules
  written here from the rules alone; the ROCm and oneAPI parsers must never raise anything but
  :class:`~accelplat.errors.ConfigurationError`, whatever the text.
* Every public function rejects NaN, infinities, negative, huge and mistyped arguments with a
  ``ValueError`` (:class:`~accelplat.errors.ConfigurationError`) or ``IndexError``
  (:class:`~accelplat.errors.DeviceNotFoundError`) that names the argument.
* Spec files of the simulated platform that are malformed, huge or nested without end are
  refused in bounded time and memory.
* The command line evaluates nothing, runs no shell, and answers bad values with exit status 2
  and a message, never a traceback.

Hypothesis example counts are kept small so the whole file runs in a few seconds.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accelplat
from accelplat import registry
from accelplat._types import GIB
from accelplat.backends.simulated import (
    MAX_DEVICES,
    MAX_SPEC_BYTES,
    SimulatedClock,
    SimulatedPlatform,
    load_spec,
    spec_from_mapping,
)
from accelplat.cli import main
from accelplat.errors import (
    ConfigurationError,
    DeviceNotFoundError,
    InsufficientSharedMemoryError,
)
from accelplat.integrations import vllm
from accelplat.sizing import parse_size
from accelplat.visible.cuda import (
    GpuRecord,
    MigRecord,
    parse_cuda_visible_devices,
    resolve_cuda_visible_devices,
)
from accelplat.visible.oneapi import Hierarchy, XpuTarget, visible_targets
from accelplat.visible.rocm import visible_physical_indices

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "accelplat"

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Hypothesis settings for this file: few examples, no per-example deadline (2 shared cores)."""

LONG_DIGITS = "1" * 5000
"""More digits than Python's int() reads from text by default (4300)."""

# =============================================================================================
# CUDA_VISIBLE_DEVICES against a reference model
# =============================================================================================


@dataclass(frozen=True)
class ModelGpu:
    """A GPU as the reference model sees it: UUID, MIG mode, MIG devices (uuid, gi, ci)."""

    uuid: str
    mig_enabled: bool = False
    migs: tuple[tuple[str, int, int], ...] = ()


_C_SPACE = " \t\n\r\v\f"  # what C's isspace() accepts in the "C" locale
_STRTOUL = re.compile(r"[ \t\n\r\v\f]*([+-]?)([0-9]+)")
_HEX = "0123456789abcdefABCDEF"


def _hex_digits(text: str) -> str | None:
    """The UUID digits CUDA reads from ``text``: hex in either case, dashes skipped, 32 at most."""
    digits = ""
    for char in text:
        if len(digits) == 32:
            return digits
        if char == "-":
            continue
        if char not in _HEX:
            return None
        digits += char.lower()
    return digits or None


def _uuid_key(uuid: str) -> str:
    """``GPU-89ab-CD…`` → ``89abcd…``: a table UUID's digits, for prefix matching."""
    return uuid[4:].replace("-", "").lower()


def _unique(digits: str, uuids: list[str]) -> str | None:
    hits = [u for u in uuids if _uuid_key(u).startswith(digits)]
    return hits[0] if len(hits) == 1 else None


def _model_lookup(entry: str, uuid_list: bool, gpus: list[ModelGpu]) -> str | None:
    """The device one entry names, or ``None`` when the entry is invalid."""
    if not uuid_list:
        m = _STRTOUL.match(entry)  # strtoul: white space, a sign, digits; the rest is ignored
        if m is None:
            return None
        value = min(int(m.group(2)), 2**64 - 1)  # an overflow is ULONG_MAX
        if m.group(1) == "-":
            value = -value % 2**64  # unsigned negation
        value &= 2**32 - 1  # the driver keeps the low 32 bits, as an int
        return gpus[value].uuid if value < min(len(gpus), 2**31) else None
    gpu_uuids = [g.uuid for g in gpus]
    if entry.startswith("GPU-"):
        digits = _hex_digits(entry[4:])
        return None if digits is None else _unique(digits, gpu_uuids)
    if not entry.startswith("MIG-"):
        return None
    rest = entry[4:]
    if rest.startswith("GPU-") and "/" in rest:  # MIG-GPU-<uuid>/<gi>/<ci>
        parts = rest.split("/")
        if len(parts) != 3 or not all(p and p.isascii() and p.isdigit() for p in parts[1:]):
            return None
        digits = _hex_digits(parts[0][4:])
        parent = None if digits is None else _unique(digits, gpu_uuids)
        if parent is None:
            return None
        wanted = (int(parts[1]), int(parts[2]))
        gpu = next(g for g in gpus if g.uuid == parent)
        return next((u for u, gi, ci in gpu.migs if (gi, ci) == wanted), None)
    digits = _hex_digits(rest)  # MIG- digits name a MIG device or a GPU (driver 580)
    named = [u for g in gpus for u, _, _ in g.migs] + gpu_uuids
    return None if digits is None else _unique(digits, named)


def cuda_reference(text: str | None, gpus: list[ModelGpu]) -> list[str]:
    """UUIDs CUDA makes visible, in order, from the documented (and recorded) rules alone.

    Unset: every GPU. Otherwise the text is split at commas; the first entry decides whether
    the list holds ordinals (read as ``strtoul`` reads them, then cut to a 32-bit int) or UUIDs
    (``GPU-``/``MIG-`` then hex digits of any case, dashes skipped, an unambiguous abbreviation
    allowed); the first invalid entry ends the list; naming one device twice hides everything.
    A process sees at most one MIG device: the first one named, else the first MIG device of
    the first named GPU in MIG mode; a GPU in MIG mode without MIG devices shows nothing.
    """
    if text is None:
        named = [g.uuid for g in gpus]
    else:
        entries = text.split(",")
        uuid_list = entries[0].startswith(("GPU-", "MIG-"))
        named = []
        for entry in entries:
            device = _model_lookup(entry, uuid_list, gpus)
            if device is None:
                break
            if device in named:
                return []
            named.append(device)
    mig_uuids = {u for g in gpus for u, _, _ in g.migs}
    named_migs = [d for d in named if d in mig_uuids]
    if named_migs:
        return named_migs[:1]
    by_uuid = {g.uuid: g for g in gpus}
    for uuid in named:
        gpu = by_uuid[uuid]
        if gpu.mig_enabled and gpu.migs:
            return [gpu.migs[0][0]]
    return [u for u in named if not by_uuid[u].mig_enabled]


def _records(gpus: list[ModelGpu]) -> list[GpuRecord]:
    return [
        GpuRecord(i, g.uuid, g.mig_enabled, tuple(MigRecord(u, gi, ci) for u, gi, ci in g.migs))
        for i, g in enumerate(gpus)
    ]


@st.composite
def _uuid(draw: st.DrawFn, head: str) -> str:
    """A UUID as NVML prints it; short ones over two letters, so prefixes are often ambiguous."""
    if draw(st.integers(0, 3)) == 0:
        d = draw(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32))
        return f"{head}{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}"
    body = draw(st.text(alphabet="ab", min_size=1, max_size=4))
    return f"{head}{body[:2]}-{body[2:]}" if len(body) > 2 else head + body


@st.composite
def machines(draw: st.DrawFn) -> list[ModelGpu]:
    gpu_uuids = draw(st.lists(_uuid("GPU-"), max_size=4, unique_by=_uuid_key))
    mig_uuids = iter(draw(st.lists(_uuid("MIG-"), min_size=8, max_size=8, unique_by=_uuid_key)))
    gpus = []
    for uuid in gpu_uuids:
        mig_enabled = draw(st.booleans())
        migs: list[tuple[str, int, int]] = []
        if mig_enabled:
            for gi in range(draw(st.integers(0, 2))):
                migs.append((next(mig_uuids), gi + 1, draw(st.integers(0, 1))))
        gpus.append(ModelGpu(uuid, mig_enabled, tuple(migs)))
    return gpus


@st.composite
def _spelling(draw: st.DrawFn, uuid: str) -> str:
    """``uuid`` as a user might write it: cut short, upper-cased, dashes moved, junk after."""
    head, body = uuid[:4], uuid[4:]
    cut = body[: draw(st.integers(0, len(body)))]
    if draw(st.booleans()):
        cut = cut.upper()
    if draw(st.booleans()):
        cut = cut.replace("-", "")
        if cut and draw(st.booleans()):
            cut = f"-{cut[:1]}-{cut[1:]}"
    tail = draw(st.sampled_from(["", "", "", "x", "-zz", " ", "/1"]))
    return head + cut + tail


@st.composite
def cuda_entries(draw: st.DrawFn, gpus: list[ModelGpu]) -> str:
    """One entry: an ordinal, a (prefix of a) GPU or MIG UUID, a legacy MIG name, or junk."""
    kind = draw(st.sampled_from(["ordinal", "gpu", "mig", "legacy", "junk"]))
    migs = [u for g in gpus for u, _, _ in g.migs]
    if kind == "ordinal":
        pad = draw(st.sampled_from(["", "", " ", "\t", "\n "]))
        sign = draw(st.sampled_from(["", "", "+", "-"]))
        tail = draw(st.sampled_from(["", "", "abc", ".5", "x1", " 1", "0", " "]))
        return f"{pad}{sign}{draw(st.integers(0, 5))}{tail}"
    if kind == "gpu" and gpus:
        return draw(_spelling(draw(st.sampled_from(gpus)).uuid))
    if kind == "mig" and migs:
        return draw(_spelling(draw(st.sampled_from(migs))))
    if kind == "legacy" and gpus:
        gpu = draw(_spelling(draw(st.sampled_from(gpus)).uuid))
        gi, ci = draw(st.integers(0, 3)), draw(st.integers(0, 1))
        return draw(st.sampled_from([f"MIG-{gpu}/{gi}/{ci}", f"MIG-{gpu}/{gi}", f"MIG-{gpu}"]))
    return draw(
        st.sampled_from(
            ["", " ", "NoDevFiles", "GPU-", "MIG-", " GPU-a", "gpu-a", "-1", "+", "0x1", "\u0661"]
        )
    )


@st.composite
def machine_and_text(draw: st.DrawFn) -> tuple[list[ModelGpu], str | None]:
    gpus = draw(machines())
    if draw(st.integers(0, 9)) == 0:
        return gpus, None
    entries = draw(st.lists(cuda_entries(gpus), min_size=1, max_size=5))
    return gpus, ",".join(entries)


@settings(max_examples=400, deadline=None)
@given(machine_and_text())
def test_cuda_visible_devices_matches_the_reference_model(
    case: tuple[list[ModelGpu], str | None],
) -> None:
    gpus, text = case
    got = [t.uuid for t in resolve_cuda_visible_devices(text, _records(gpus)).targets]
    assert got == cuda_reference(text, gpus)


def test_the_reference_model_itself_on_the_documented_examples() -> None:
    plain = [ModelGpu("GPU-aa11"), ModelGpu("GPU-aa22"), ModelGpu("GPU-bb33")]
    assert cuda_reference(None, plain) == ["GPU-aa11", "GPU-aa22", "GPU-bb33"]
    assert cuda_reference("", plain) == []
    assert cuda_reference("NoDevFiles", plain) == []
    assert cuda_reference("2,0", plain) == ["GPU-bb33", "GPU-aa11"]
    assert cuda_reference("1abc, 0", plain) == ["GPU-aa22", "GPU-aa11"]
    assert cuda_reference("0,7,1", plain) == ["GPU-aa11"]  # 7 ends the list
    assert cuda_reference("0,1,0", plain) == []  # a duplicate hides everything
    assert cuda_reference("0,x,0", plain) == ["GPU-aa11"]  # ... unless the list ended first
    assert cuda_reference("GPU-aa", plain) == []  # ambiguous abbreviation
    assert cuda_reference("GPU-", plain) == []  # no digit at all
    assert cuda_reference(" GPU-bb", plain) == []  # white space makes it an ordinal list
    assert cuda_reference("GPU-B,GPU-a-a1", plain) == ["GPU-bb33", "GPU-aa11"]
    assert cuda_reference("GPU-aa1,1", plain) == ["GPU-aa11"]  # an ordinal in a UUID list
    assert cuda_reference("GPU-aa11,GPU-aa1", plain) == []  # one GPU, two spellings
    full = [ModelGpu("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6")]
    assert cuda_reference("GPU-8932F937D72C4106C12F20BD9FAED9F6 trailing", full) == [full[0].uuid]
    assert cuda_reference("GPU-8932f937 trailing", full) == []
    mig = [ModelGpu("GPU-cc", True, (("MIG-d1", 1, 0), ("MIG-d2", 2, 0))), *plain]
    assert cuda_reference(None, mig) == ["MIG-d1"]
    assert cuda_reference("1,0", mig) == ["MIG-d1"]
    assert cuda_reference("MIG-GPU-cc/2/0", mig) == ["MIG-d2"]
    assert cuda_reference("GPU-bb,MIG-d2,MIG-d1", mig) == ["MIG-d2"]
    assert cuda_reference("MIG-d2,MIG-GPU-cc/2/0", mig) == []


@pytest.mark.parametrize("text", [LONG_DIGITS, f"0,{LONG_DIGITS}", f"MIG-GPU-aa/{LONG_DIGITS}/0"])
def test_cuda_visible_devices_with_a_very_long_number(text: str) -> None:
    gpus = [ModelGpu("GPU-aa11"), ModelGpu("GPU-aa22")]
    parse_cuda_visible_devices(text)
    got = [t.uuid for t in resolve_cuda_visible_devices(text, _records(gpus)).targets]
    assert got == (["GPU-aa11"] if text.startswith("0,") else [])


# =============================================================================================
# ROCm and oneAPI variables: ConfigurationError or a valid answer, nothing else
# =============================================================================================

_variable_text = st.one_of(
    st.text(max_size=30),
    st.lists(
        st.one_of(
            st.integers(-3, 12).map(str),
            st.sampled_from(["", " ", "GPU-", "GPU-0123", "0x1", "07", "-0", "*", "1.2", "0.*"]),
            st.text(alphabet="0123456789abcdefxGPU-.*:;!,", max_size=8),
        ),
        max_size=5,
    ).map(",".join),
    st.sampled_from([LONG_DIGITS, f"0,{LONG_DIGITS}", f"0x{'f' * 5000}", "0" * 5000 + "1"]),
)


@FAST
@given(
    count=st.integers(0, 6),
    with_uuids=st.booleans(),
    rocr=st.none() | _variable_text,
    hip=st.none() | _variable_text,
    cuda=st.none() | _variable_text,
)
def test_rocm_variables_never_raise_anything_but_configuration_error(
    count: int, with_uuids: bool, rocr: str | None, hip: str | None, cuda: str | None
) -> None:
    env = {
        k: v
        for k, v in (
            ("ROCR_VISIBLE_DEVICES", rocr),
            ("HIP_VISIBLE_DEVICES", hip),
            ("CUDA_VISIBLE_DEVICES", cuda),
        )
        if v is not None
    }
    uuids = [f"GPU-{i:016x}" if i % 3 else None for i in range(count)] if with_uuids else None
    try:
        picked = visible_physical_indices(count, env, uuids)
    except ConfigurationError:
        return
    assert len(set(picked)) == len(picked)
    assert all(type(i) is int and 0 <= i < count for i in picked)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ROCR_VISIBLE_DEVICES": f"1,{LONG_DIGITS},0"}, [1]),
        ({"HIP_VISIBLE_DEVICES": f"1,{LONG_DIGITS},0"}, [1]),
        ({"ROCR_VISIBLE_DEVICES": "0x" + "f" * 5000}, []),
        ({"ROCR_VISIBLE_DEVICES": "0" * 5000 + "1"}, [1]),  # octal, as strtol reads it
    ],
)
def test_rocm_variables_with_very_long_numbers_end_the_list(
    env: dict[str, str], expected: list[int]
) -> None:
    assert visible_physical_indices(2, env) == expected


_TILES = st.lists(st.integers(0, 3), max_size=4)


@FAST
@given(
    tiles=_TILES,
    hierarchy=st.none() | st.sampled_from(["FLAT", "COMPOSITE", "COMBINED", "flat", "x"]),
    mask=st.none() | _variable_text,
    selector=st.none()
    | _variable_text
    | st.builds(
        lambda neg, backend, items: f"{neg}{backend}:{items}",
        st.sampled_from(["", "!"]),
        st.sampled_from(["level_zero", "*", "opencl", "ext_oneapi_level_zero", "cuda"]),
        _variable_text,
    ),
)
def test_oneapi_variables_never_raise_anything_but_configuration_error(
    tiles: list[int], hierarchy: str | None, mask: str | None, selector: str | None
) -> None:
    env = {
        k: v
        for k, v in (
            ("ZE_FLAT_DEVICE_HIERARCHY", hierarchy),
            ("ZE_AFFINITY_MASK", mask),
            ("ONEAPI_DEVICE_SELECTOR", selector),
        )
        if v is not None
    }
    try:
        targets = visible_targets(tiles, env)
    except ConfigurationError:
        return
    for target in targets:
        assert isinstance(target, XpuTarget)
        assert 0 <= target.card < len(tiles)
        if target.tiles is not None:
            assert all(0 <= t < max(1, tiles[target.card]) for t in target.tiles)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ZE_AFFINITY_MASK": f"0,{LONG_DIGITS}"}, [XpuTarget(0, (0,))]),
        ({"ZE_AFFINITY_MASK": f"0.{LONG_DIGITS}", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, []),
        ({"ONEAPI_DEVICE_SELECTOR": f"level_zero:0,{LONG_DIGITS}"}, [XpuTarget(0, (0,))]),
        (
            {"ONEAPI_DEVICE_SELECTOR": f"!level_zero:{LONG_DIGITS}"},
            [XpuTarget(c, (t,)) for c in (0, 1) for t in (0, 1)],
        ),
        (
            {
                "ONEAPI_DEVICE_SELECTOR": f"level_zero:0.{LONG_DIGITS}",
                "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
            },
            [],
        ),
    ],
    ids=["mask", "mask-tile", "selector", "selector-negative", "selector-tile"],
)
def test_oneapi_variables_with_very_long_numbers_name_no_device(
    env: dict[str, str], expected: list[XpuTarget]
) -> None:
    # two two-tile cards of a Data Center GPU Max, whose default (driver 23.43+) is FLAT
    assert visible_targets([2, 2], env, Hierarchy.FLAT) == expected


# =============================================================================================
# public functions: bad arguments are named
# =============================================================================================

HUGE = 10**400
"""An int too large for a float."""


def _sim(*, lazy: bool = False) -> SimulatedPlatform:
    spec: dict[str, Any] = {
        "devices": [{"total": "80GiB", "used": "10GiB"}, {"total": "80GiB", "used": "1GiB"}],
        "release": {"lazy": lazy, "stable_duration_s": 1.0, "settle_timeout_s": 5.0},
    }
    return SimulatedPlatform.from_spec(spec, clock=SimulatedClock())


@pytest.fixture
def sim() -> Iterator[SimulatedPlatform]:
    """An eager two-device simulated platform on a virtual clock, made current."""
    platform = _sim()
    with registry.use_platform(platform):
        yield platform


def _rejects(call: Callable[[], Any], argument: str) -> BaseException:
    """Assert ``call()`` raises a ValueError or IndexError whose message names ``argument``."""
    with pytest.raises((ValueError, IndexError)) as info:
        call()
    assert argument in str(info.value), f"{info.type.__name__} does not name {argument!r}"
    return info.value


def _show(value: Any) -> str:
    """A short test id for a value."""
    return "huge" if value is HUGE else repr(value)


def _anything(value: Any) -> Any:
    """``value``, typed ``Any``: an argument of the wrong type, on purpose."""
    return value


BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, "1", True, None, [1]]
"""Values no numeric argument accepts (``None`` is left out where it means a default)."""


def _device_list_cases() -> list[Any]:
    return [
        pytest.param([], "devices", id="empty"),
        pytest.param("01", "devices", id="str"),
        pytest.param(5, "devices", id="int"),
        pytest.param([0, 0], "devices", id="duplicate"),
        pytest.param([99], "device", id="unknown"),
        pytest.param([-1], "device", id="negative"),
        pytest.param([math.nan], "device", id="nan"),
        pytest.param([True], "device", id="bool"),
        pytest.param([HUGE], "device", id="huge"),
        pytest.param(["0"], "device", id="str-item"),
    ]


@pytest.mark.parametrize(("devices", "argument"), _device_list_cases())
@pytest.mark.parametrize("function", ["record_usage_stats", "snapshot", "clear", "settle"])
def test_device_lists_are_checked(
    sim: SimulatedPlatform, function: str, devices: Any, argument: str
) -> None:
    calls: dict[str, Callable[[], Any]] = {
        "record_usage_stats": lambda: accelplat.record_usage_stats(devices),
        "snapshot": lambda: accelplat.snapshot(devices),
        "clear": lambda: accelplat.wait_for_memory_to_clear(devices, threshold_ratio=1.0),
        "settle": lambda: accelplat.wait_for_memory_to_settle(devices=devices),
    }
    exc = _rejects(calls[function], argument)
    if argument == "device":
        assert isinstance(exc, DeviceNotFoundError)
        assert "valid indices: 0..1" in str(exc)
    else:
        assert isinstance(exc, ConfigurationError)


def _number_cases(argument: str, *, extra: tuple[Any, ...] = ()) -> list[Any]:
    """Cases rejecting each of ``BAD_NUMBERS`` (less ``None``), ``extra`` and ``HUGE``."""
    values = [v for v in BAD_NUMBERS if v is not None] + list(extra)
    cases = [pytest.param(argument, v, id=f"{argument}={v!r}") for v in values]
    cases.append(pytest.param(argument, HUGE, id=f"{argument}=huge"))
    return cases


CLEAR_CASES = [
    *_number_cases("threshold_bytes"),
    *_number_cases("threshold_ratio", extra=(1.5, -0.1)),
    *_number_cases("timeout_s"),
    *_number_cases("stable_duration_s"),
    *_number_cases("stable_tolerance_bytes"),
    pytest.param("threshold_bytes", {0: 1, 5: 1}, id="threshold_bytes=unknown-device"),
    pytest.param("threshold_bytes", {0: math.nan, 1: 1}, id="threshold_bytes=nan-in-mapping"),
    pytest.param("threshold_ratio", {0: 0.5}, id="threshold_ratio=missing-device"),
    pytest.param("threshold_ratio", {"0": 0.5, 1: 0.5}, id="threshold_ratio=str-key"),
    pytest.param("poll", 0.5, id="poll=float"),
    pytest.param("on_poll", 1, id="on_poll=int"),
    pytest.param("clock", object(), id="clock=object"),
]


@pytest.mark.parametrize(("argument", "value"), CLEAR_CASES)
def test_wait_for_memory_to_clear_names_bad_arguments(
    sim: SimulatedPlatform, argument: str, value: Any
) -> None:
    kwargs: dict[str, Any] = {"threshold_ratio": 1.0, "timeout_s": 1.0, argument: value}
    exc = _rejects(lambda: accelplat.wait_for_memory_to_clear(**kwargs), argument)
    assert isinstance(exc, ConfigurationError)


def test_a_wait_without_a_threshold_names_both(sim: SimulatedPlatform) -> None:
    _rejects(accelplat.wait_for_memory_to_clear, "threshold_bytes or threshold_ratio")


SETTLE_CASES = [
    *_number_cases("threshold_ratio", extra=(2.0,)),
    *_number_cases("timeout_s"),
    pytest.param("threshold_ratio", None, id="threshold_ratio=None"),
    pytest.param("force", "yes", id="force=str"),
    pytest.param("poll", "fast", id="poll=str"),
]


@pytest.mark.parametrize(("argument", "value"), SETTLE_CASES)
def test_wait_for_memory_to_settle_names_bad_arguments(
    sim: SimulatedPlatform, argument: str, value: Any
) -> None:
    exc = _rejects(lambda: accelplat.wait_for_memory_to_settle(**{argument: value}), argument)
    assert isinstance(exc, ConfigurationError)


@pytest.mark.parametrize(
    "device", [99, -1, 2, 1.0, "0", None, True, HUGE, math.nan, [0]], ids=_show
)
def test_memory_info_rejects_what_is_not_a_visible_index(
    sim: SimulatedPlatform, device: Any
) -> None:
    exc = _rejects(lambda: sim.memory_info(device), "device")
    assert isinstance(exc, DeviceNotFoundError)


_KV = {"num_layers": 32, "num_kv_heads": 8, "head_size": 128, "max_model_len": 8192}
_KV_BAD = [0, -1, 1.5, math.nan, math.inf, "8", True, None, [8]]


_SIZING_ARGUMENTS = [
    (function, argument)
    for function in ("kv_cache_bytes", "check_kv_cache_fits", "max_model_len_that_fits")
    for argument in (*_KV, "block_size")
    if not (function == "max_model_len_that_fits" and argument == "max_model_len")
]


@pytest.mark.parametrize("value", _KV_BAD, ids=repr)
@pytest.mark.parametrize(("function", "argument"), _SIZING_ARGUMENTS)
def test_sizing_arguments_are_named(function: str, argument: str, value: Any) -> None:
    kwargs: dict[str, Any] = {**_KV, "dtype_bytes": "bf16", argument: value}
    if function == "kv_cache_bytes":
        _rejects(lambda: accelplat.kv_cache_bytes(**kwargs), argument)
    elif function == "check_kv_cache_fits":
        _rejects(lambda: accelplat.check_kv_cache_fits(GIB, **kwargs), argument)
    else:
        del kwargs["max_model_len"]
        _rejects(lambda: accelplat.max_model_len_that_fits(GIB, **kwargs), argument)


@pytest.mark.parametrize("value", [-1, 1.5, math.nan, math.inf, "1GiB", True, None], ids=repr)
def test_available_bytes_is_named(value: Any) -> None:
    dims = {k: v for k, v in _KV.items() if k != "max_model_len"}
    _rejects(
        lambda: accelplat.max_model_len_that_fits(value, dtype_bytes=2, **dims), "available_bytes"
    )
    _rejects(lambda: accelplat.check_kv_cache_fits(value, dtype_bytes=2, **_KV), "available_bytes")


@pytest.mark.parametrize("value", ["auto", "fp4", "", 0, -2, 1.5, math.nan, None, True])
def test_dtype_is_named(value: Any) -> None:
    _rejects(lambda: accelplat.kv_cache_bytes(dtype_bytes=value, **_KV), "dtype")


def test_sizing_stays_exact_and_typed_for_enormous_models() -> None:
    huge = {**_KV, "num_layers": HUGE}
    needed = accelplat.kv_cache_bytes(dtype_bytes=2, **huge)
    assert needed == HUGE * (8192 // 16) * (8 * 16 * 256 * 2)
    with pytest.raises(accelplat.InsufficientMemoryError, match="GiB KV cache is needed"):
        accelplat.check_kv_cache_fits(GIB, dtype_bytes=2, **huge)


@pytest.mark.parametrize(
    ("argument", "call"),
    [
        *[
            pytest.param("required_bytes", lambda v=v: accelplat.require_shm(v), id=f"req={v!r}")
            for v in [-1, 1.5, math.nan, math.inf, "1GiB", True, None]
        ],
        *[
            pytest.param("name", lambda v=v: accelplat.require_shm(1, v), id=f"name={v!r}")
            for v in ["", "  ", 5, None]
        ],
        *[
            pytest.param("path", lambda v=v: accelplat.require_shm(1, path=v), id=f"path={v!r}")
            for v in ["", b"/dev/shm", 5, None, "a\x00b", "/no/such/mount", "x" * 5000]
        ],
        *[
            pytest.param("candidates", lambda v=v: accelplat.largest_shm_budget(v), id=f"c={v!r}")
            for v in [[], "4GiB", 5, None, [0], [-1], [math.nan], [1.5], [True], ["1"]]
        ],
        *[
            pytest.param(
                "headroom_bytes",
                lambda v=v: accelplat.largest_shm_budget([1], headroom_bytes=v),
                id=f"headroom={v!r}",
            )
            for v in [-1, math.nan, 1.5, "1", None]
        ],
    ],
)
def test_shared_memory_arguments_are_named(argument: str, call: Callable[[], Any]) -> None:
    exc = _rejects(call, argument)
    assert isinstance(exc, ConfigurationError)


def test_an_enormous_shared_memory_budget_is_a_typed_shortage() -> None:
    with pytest.raises(InsufficientSharedMemoryError, match="MiB required") as info:
        accelplat.require_shm(HUGE)
    assert info.value.required == HUGE
    assert accelplat.largest_shm_budget([HUGE]) is None


@pytest.mark.parametrize(
    "value",
    [
        "",
        "abc",
        "-1G",
        "1e9",
        "1.5.5G",
        "nan",
        "inf",
        "4 GiB GiB",
        "4XB",
        "0x10",
        "9" * 1001,
        "9" * 1_000_001,
        -1,
        1.5,
        math.nan,
        None,
        True,
        b"1",
    ],
    ids=lambda v: repr(v)[:20],
)
def test_parse_size_names_its_argument(value: Any) -> None:
    exc = _rejects(lambda: parse_size(value, argument="--threshold-bytes"), "--threshold-bytes")
    assert isinstance(exc, ConfigurationError)


@st.composite
def size_texts(draw: st.DrawFn) -> tuple[str, Fraction]:
    """A valid size text and its exact value in bytes."""
    whole = draw(st.text(alphabet="0123456789", min_size=1, max_size=40))
    frac = draw(st.none() | st.text(alphabet="0123456789", max_size=60))
    units = {
        "": 1,
        "b": 1,
        "k": 2**10,
        "KiB": 2**10,
        "mi": 2**20,
        "G": 2**30,
        "GB": 10**9,
        "tib": 2**40,
        "TB": 10**12,
        "P": 2**50,
        "pb": 10**15,
    }
    unit = draw(st.sampled_from(sorted(units)))
    text = whole + ("" if frac is None else "." + frac)
    value = Fraction(text) if frac != "" else Fraction(whole)
    space = draw(st.sampled_from(["", " "]))
    return f"{text}{space}{unit}", value * units[unit]


@FAST
@given(size_texts())
def test_parse_size_is_exact_for_long_numbers(case: tuple[str, Fraction]) -> None:
    text, exact = case
    assert parse_size(text) == math.floor(exact)


@FAST
@given(st.text(max_size=40) | st.from_regex(r"\s*[0-9.]{0,30}\s*[A-Za-z]{0,4}\s*", fullmatch=True))
def test_parse_size_of_any_text_is_bytes_or_a_configuration_error(text: str) -> None:
    try:
        value = parse_size(text)
    except ConfigurationError:
        return
    assert type(value) is int
    assert value >= 0


@pytest.mark.parametrize(
    "name", ["", "UPPER", "a b", "../x", "x" * 65, "-lead", "caf\u00e9", 5, None, b"cuda"]
)
def test_register_platform_names_a_bad_name(name: Any) -> None:
    exc = _rejects(lambda: accelplat.register_platform(name, _sim), "platform name")
    assert isinstance(exc, ConfigurationError)


@pytest.mark.parametrize("target", [5, None, "accelplat.backends.cpu:CpuPlatform"])
def test_register_platform_names_a_bad_target(target: Any) -> None:
    exc = _rejects(lambda: accelplat.register_platform("mine", target), "register_platform")
    assert isinstance(exc, ConfigurationError)


@FAST
@given(st.text(max_size=70))
def test_register_platform_any_name_is_accepted_or_a_configuration_error(name: str) -> None:
    registry.reset()
    try:
        accelplat.register_platform(name, _sim)
    except ConfigurationError as exc:
        message = str(exc)
    else:
        assert name in registry.available_platforms()
        return
    assert "platform name" in message or "already registered" in message


VLLM_CASES = [
    pytest.param("device", lambda: vllm.record_gpu_memory_usage_stats(devices=[9]), id="record-9"),
    *[
        pytest.param(
            "poll_interval_s",
            lambda v=v: vllm.wait_for_gpu_memory_to_clear(
                devices=[0], threshold_ratio=1.0, poll_interval_s=v
            ),
            id=f"clear-poll={_show(v)}",
        )
        for v in [-1, math.nan, math.inf, "5", True]
    ],
    *[
        pytest.param(
            "timeout_s",
            lambda v=v: vllm.wait_for_gpu_memory_to_clear(
                devices=[0], threshold_ratio=1.0, timeout_s=v
            ),
            id=f"clear-timeout={_show(v)}",
        )
        for v in [-1, math.nan, "5"]
    ],
    *[
        pytest.param(
            "threshold_bytes",
            lambda v=v: vllm.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=v),
            id=f"clear-bytes={_show(v)}",
        )
        for v in ["1GiB", [1], HUGE]
    ],
    pytest.param(
        "threshold_ratio",
        lambda: vllm.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=_anything("0.5")),
        id="clear-ratio=str",
    ),
    pytest.param(
        "devices",
        lambda: vllm.wait_for_gpu_memory_to_clear(devices=_anything(None), threshold_ratio=1.0),
        id="clear-devices=None",
    ),
    *[
        pytest.param(
            "gpu_memory_utilization",
            lambda v=v: vllm.engine_kwargs({"gpu_memory_utilization": v}),
            id=f"util={_show(v)}",
        )
        for v in [0, 1.5, -0.1, math.nan, math.inf, "0.9", True, HUGE]
    ],
    pytest.param(
        "kwargs",
        lambda: vllm.engine_kwargs(_anything(["x"])),
        id="kwargs=list",
    ),
    *[
        pytest.param(
            "tensor_parallel_size",
            lambda v=v: vllm.before_engine_start({"tensor_parallel_size": v}),
            id=f"tp={_show(v)}",
        )
        for v in [0, -1, 1.5, "2", True]
    ],
    *[
        pytest.param("min_gb", lambda v=v: vllm.large_gpu_mark(v), id=f"min_gb={_show(v)}")
        for v in [math.nan, "24", True]
    ],
    *[
        pytest.param("num_gpus", lambda v=v: vllm.multi_gpu_marks(num_gpus=v), id=f"gpus={v!r}")
        for v in [1.5, "2", True]
    ],
    *[
        pytest.param("tolerance", lambda v=v: _enter_baseline(tolerance=v), id=f"tol={_show(v)}")
        for v in [-0.1, 1.5, math.nan, "0.05", True]
    ],
    pytest.param(
        "timeout_s",
        lambda: _enter_baseline(timeout_s=-1),
        id="baseline-timeout=-1",
    ),
]


def _enter_baseline(**kwargs: Any) -> None:
    with vllm.memory_baseline(**kwargs):
        pass


@pytest.mark.parametrize(("argument", "call"), VLLM_CASES)
def test_vllm_helpers_name_bad_arguments(
    sim: SimulatedPlatform, argument: str, call: Callable[[], Any]
) -> None:
    _rejects(call, argument)


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


@pytest.mark.parametrize(("name", "text", "message"), HOSTILE_SPECS)
def test_hostile_spec_files_are_refused_quickly_and_cheaply(
    tmp_path: Path, name: str, text: str | bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ConfigurationError, match=re.escape(message)) as info:
            load_spec(path)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value)
    assert elapsed < 5.0
    assert peak < 64 * 2**20


def test_a_hostile_spec_named_by_the_variable_makes_the_platform_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spec.json"
    path.write_text("[" * 100_000)
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(path))
    result = SimulatedPlatform.probe()
    assert not result.available
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    with pytest.raises(accelplat.PlatformNotAvailableError, match="nested too deeply"):
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


# =============================================================================================
# the command line
# =============================================================================================

_FORBIDDEN = {
    "eval(": re.compile(r"(?<![\w.])eval\("),
    "exec(": re.compile(r"(?<![\w.])exec\("),
    "shell=True": re.compile(r"shell\s*=\s*True"),
    "os.system": re.compile(r"\bos\.system\b"),
    "os.popen": re.compile(r"\bos\.popen\b"),
}


def test_the_package_evaluates_nothing_and_runs_no_shell() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 20
    found = [
        f"{path.relative_to(REPO)}:{n}: {what}"
        for path in sources
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for what, pattern in _FORBIDDEN.items()
        if pattern.search(line)
    ]
    assert found == []


def test_the_forbidden_patterns_do_find_what_they_look_for() -> None:
    assert _FORBIDDEN["eval("].search("x = eval(text)")
    assert not _FORBIDDEN["eval("].search("literal_eval(text)")
    assert _FORBIDDEN["exec("].search("exec(code)")
    assert not _FORBIDDEN["exec("].search("spec.loader.exec_module(m)")
    assert _FORBIDDEN["shell=True"].search("subprocess.run(cmd, shell = True)")
    assert _FORBIDDEN["os.system"].search("os.system('ls')")


CLI_SPEC = {
    "clock": "virtual",
    "release": {"lazy": True, "stable_duration_s": 0.5, "settle_timeout_s": 3.0},
    "devices": [
        {"total": "80GiB", "used": "30GiB", "timeline": [{"at": 1.0, "used": "1GiB"}]},
        {"total": "80GiB", "used": "2GiB"},
    ],
}


@pytest.fixture(scope="module")
def cli_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "spec.json"
    path.write_text(json.dumps(CLI_SPEC))
    return path


def run_cli(spec: Path, argv: list[str]) -> tuple[int, str, str]:
    """Run ``accelplat ARGV`` in this process on the simulated platform; return code and output."""
    out, err = io.StringIO(), io.StringIO()
    env = {"ACCELPLAT_PLATFORM": "simulated", "ACCELPLAT_SIMULATED_SPEC": str(spec)}
    with mock.patch.dict(os.environ, env), redirect_stdout(out), redirect_stderr(err):
        registry.reset()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            registry.reset()
    return code, out.getvalue(), err.getvalue()


_arg = st.text(max_size=25) | st.sampled_from(
    ["nan", "inf", "-inf", "-1", "0", "1e400", "4GiB", "0x10", "1,1", "-0", "", " ", "\u00b2"]
)
_ascii_arg = st.text(alphabet=[chr(c) for c in range(32, 127)], max_size=25) | st.sampled_from(
    ["nan", "inf", "-1", "0", "99999999999999999999", "4GiB", "1.5", ""]
)

CLI_FLAGS = [
    ["wait", "--threshold-bytes"],
    ["wait", "--threshold-ratio"],
    ["wait", "--threshold-ratio", "0.5", "--timeout"],
    ["wait", "--threshold-ratio", "0.5", "--devices"],
    ["wait", "--threshold-bytes", "1GiB", "--stable"],
    ["wait", "--threshold-bytes", "1GiB", "--tolerance"],
    ["wait", "--settle", "--threshold-ratio"],
    ["stats", "--devices"],
    ["stats", "--json", "--devices"],
    ["shm", "--require"],
    ["shm", "--path"],
    ["shm", "--require", "1", "--name"],
]


def _check_cli_outcome(code: int, out: str, err: str) -> None:
    assert "Traceback" not in err
    assert code in (0, 1, 2)
    if code == 2:
        assert "error" in err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.sampled_from(CLI_FLAGS), value=_arg)
def test_cli_values_never_raise_a_traceback(cli_spec: Path, flags: list[str], value: str) -> None:
    code, out, err = run_cli(cli_spec, [*flags, value])
    _check_cli_outcome(code, out, err)


KV = [
    "kv",
    "--layers",
    "32",
    "--kv-heads",
    "8",
    "--head-size",
    "128",
    "--dtype",
    "bf16",
    "--max-model-len",
    "8192",
]


@FAST
@given(
    flag=st.sampled_from(
        [
            "--layers",
            "--kv-heads",
            "--head-size",
            "--dtype",
            "--max-model-len",
            "--block-size",
            "--available",
            "--head-size-v",
        ]
    ),
    value=_ascii_arg,
)
def test_kv_values_never_raise_a_traceback(cli_spec: Path, flag: str, value: str) -> None:
    code, out, err = run_cli(cli_spec, [*KV, flag, value])
    _check_cli_outcome(code, out, err)


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "--threshold-bytes", "9" * 1_000_001],
        ["wait", "--threshold-bytes", "1.5.5GiB"],
        ["wait", "--threshold-ratio", "nan"],
        ["wait", "--timeout", "-1", "--threshold-ratio", "0.1"],
        ["wait", "--devices", "0,0", "--threshold-ratio", "0.1"],
        ["wait", "--devices", "7", "--threshold-ratio", "0.1"],
        ["stats", "--devices", "\u00b2"],
        ["shm", "--require", "-4GiB"],
        ["shm", "--path", "a\x00b"],
        ["kv", *KV[1:], "--available", "9" * 2000],
    ],
    ids=lambda argv: " ".join(argv)[:40],
)
def test_bad_cli_values_exit_2_with_a_message(cli_spec: Path, argv: list[str]) -> None:
    code, _, err = run_cli(cli_spec, argv)
    assert "Traceback" not in err
    assert code == 2, err
    assert "error" in err


@pytest.mark.parametrize(
    "argv",
    [
        [*KV[:-4], "--dtype", "\u00b2", "--max-model-len", "8192"],
        [*KV[:-4], "--dtype", "9" * 5000, "--max-model-len", "8192"],
        ["kv", "--layers", "9" * 400, *KV[3:]],
        [*KV, "--available", "1GiB", "--layers", "9" * 400],
    ],
    ids=["dtype-superscript", "dtype-long", "layers-huge", "layers-huge-available"],
)
def test_kv_hostile_values_exit_cleanly(cli_spec: Path, argv: list[str]) -> None:
    code, _, _ = run_cli(cli_spec, argv)
    assert code in (1, 2)


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "--threshold-bytes", "9" * 400],
        ["wait", "--threshold-bytes", "1GiB", "--tolerance", "9" * 400],
    ],
    ids=["threshold-bytes", "tolerance"],
)
def test_wait_with_sizes_beyond_a_float_exits_cleanly(cli_spec: Path, argv: list[str]) -> None:
    code, _, _ = run_cli(cli_spec, argv)
    assert code in (0, 1, 2)


def test_the_real_command_answers_a_bad_value_without_a_traceback(cli_spec: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(cli_spec),
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run(
        [sys.executable, "-m", "accelplat", "wait", "--threshold-bytes", "$(reboot)"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "'$(reboot)'" in done.stderr  # the value is quoted back, never run
    assert "Traceback" not in done.stderr
