"""Waits and memory queries name their bad arguments (NaN, infinities, negative, huge, mistyped)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import accelplat
from accelplat import _registry as registry
from accelplat._backends.simulated import (
    SimulatedPlatform,
)
from accelplat.errors import (
    ConfigurationError,
    DeviceNotFoundError,
)
from tests._hostile import BAD_NUMBERS, HUGE, make_sim, rejects, show_value


@pytest.fixture
def sim() -> Iterator[SimulatedPlatform]:
    """An eager two-device simulated platform on a virtual clock, made current."""
    platform = make_sim()
    with registry.use_platform(platform):
        yield platform


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
    exc = rejects(calls[function], argument)
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
    exc = rejects(lambda: accelplat.wait_for_memory_to_clear(**kwargs), argument)
    assert isinstance(exc, ConfigurationError)


def test_a_wait_without_a_threshold_names_both(sim: SimulatedPlatform) -> None:
    rejects(accelplat.wait_for_memory_to_clear, "threshold_bytes or threshold_ratio")


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
    exc = rejects(lambda: accelplat.wait_for_memory_to_settle(**{argument: value}), argument)
    assert isinstance(exc, ConfigurationError)


@pytest.mark.parametrize(
    "device", [99, -1, 2, 1.0, "0", None, True, HUGE, math.nan, [0]], ids=show_value
)
def test_memory_info_rejects_what_is_not_a_visible_index(
    sim: SimulatedPlatform, device: Any
) -> None:
    exc = rejects(lambda: sim.memory_info(device), "device")
    assert isinstance(exc, DeviceNotFoundError)


class _Clock:
    """A virtual clock whose readings come from ``readings`` (then repeat the last)."""

    def __init__(self, *readings: Any) -> None:
        self.readings = list(readings)

    def monotonic(self) -> Any:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def sleep(self, seconds: float) -> None:
        pass


@pytest.mark.parametrize(
    "clock",
    [
        pytest.param(_Clock(math.nan), id="nan"),
        pytest.param(_Clock(math.inf), id="inf"),
        pytest.param(_Clock(-math.inf), id="-inf"),
        pytest.param(_Clock("1"), id="str"),
        pytest.param(_Clock(None), id="None"),
        pytest.param(_Clock(0.0, 0.5, math.nan), id="nan-later"),
        pytest.param(_Clock(1.0), id="stuck"),
        pytest.param(_Clock(*[10.0 - i * 1e-3 for i in range(2000)]), id="backwards"),
    ],
)
def test_a_clock_that_cannot_end_the_wait_is_refused(sim: SimulatedPlatform, clock: Any) -> None:
    # used stays above 0, so only the clock could end the wait: it must not hang
    exc = rejects(
        lambda: accelplat.wait_for_memory_to_clear(threshold_bytes=0, timeout_s=1, clock=clock),
        "clock",
    )
    assert isinstance(exc, ConfigurationError)


def test_a_clock_wall_time_that_is_no_number_is_refused(sim: SimulatedPlatform) -> None:
    clock = _Clock(0.0)
    clock.time = lambda: math.nan  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"clock\.time\(\)"):
        accelplat.wait_for_memory_to_clear(threshold_ratio=1.0, clock=clock)


@pytest.mark.parametrize("answer", [None, {}, 5, (1, 2, 3, 4), "used", math.nan], ids=repr)
def test_a_reader_that_returns_no_memory_info_is_named(sim: SimulatedPlatform, answer: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"read\(0\) must return a MemoryInfo"):
        accelplat.wait_for_memory_to_clear([0], threshold_ratio=1.0, read=lambda d: answer)
    with pytest.raises(ConfigurationError, match=r"read\(0\) must return a MemoryInfo"):
        accelplat.snapshot([0], read=lambda d: answer)


@pytest.mark.parametrize(
    "platform", [5, "cuda", object(), SimulatedPlatform], ids=["int", "str", "object", "class"]
)
def test_a_platform_that_is_no_platform_is_named(platform: Any) -> None:
    rejects(lambda: accelplat.snapshot(platform=platform), "platform")
    rejects(
        lambda: accelplat.wait_for_memory_to_clear(threshold_ratio=1.0, platform=platform),
        "platform",
    )
    rejects(lambda: accelplat.wait_for_memory_to_settle(platform=platform), "platform")


@pytest.mark.parametrize(
    "devices",
    [[0, 1] * 20_000, [1] * 40_000, [*range(2), *[0] * 39_998]],
    ids=["alternating", "one-repeated", "tail-repeated"],
)
def test_long_device_lists_are_checked_in_linear_time(sim: SimulatedPlatform, devices: Any) -> None:
    # a quadratic duplicate check takes minutes on 40,000 entries; this one, milliseconds
    exc = rejects(lambda: accelplat.snapshot(devices), "more than once")
    assert len(str(exc)) < 200


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("devices", "x" * 100_000),
        ("poll", "p" * 100_000),
        ("on_poll", ["x" * 100_000]),
        ("clock", {"x" * 100_000: 1}),
        ("read", "r" * 100_000),
        ("threshold_bytes", dict.fromkeys([*(f"k{i}" for i in range(10_000)), 0, 1], 1)),
    ],
)
def test_long_values_are_not_echoed_in_full(
    sim: SimulatedPlatform, argument: str, value: Any
) -> None:
    kwargs: dict[str, Any] = {"threshold_ratio": 1.0, argument: value}
    exc = rejects(lambda: accelplat.wait_for_memory_to_clear(**kwargs), argument)
    assert len(str(exc)) < 600
