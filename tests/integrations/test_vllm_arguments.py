"""The vLLM helpers name their bad arguments before using them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accelplat import _registry as registry
from accelplat._backends.simulated import (
    SimulatedPlatform,
)
from accelplat.integrations import vllm
from tests._hostile import HUGE, anything, make_sim, rejects, show_value


@pytest.fixture
def sim() -> Iterator[SimulatedPlatform]:
    """An eager two-device simulated platform on a virtual clock, made current."""
    platform = make_sim()
    with registry.use_platform(platform):
        yield platform


VLLM_CASES = [
    pytest.param("device", lambda: vllm.record_gpu_memory_usage_stats(devices=[9]), id="record-9"),
    *[
        pytest.param(
            "poll_interval_s",
            lambda v=v: vllm.wait_for_gpu_memory_to_clear(
                devices=[0], threshold_ratio=1.0, poll_interval_s=v
            ),
            id=f"clear-poll={show_value(v)}",
        )
        for v in [-1, math.nan, math.inf, "5", True]
    ],
    *[
        pytest.param(
            "timeout_s",
            lambda v=v: vllm.wait_for_gpu_memory_to_clear(
                devices=[0], threshold_ratio=1.0, timeout_s=v
            ),
            id=f"clear-timeout={show_value(v)}",
        )
        for v in [-1, math.nan, "5"]
    ],
    *[
        pytest.param(
            "threshold_bytes",
            lambda v=v: vllm.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=v),
            id=f"clear-bytes={show_value(v)}",
        )
        for v in ["1GiB", [1], HUGE]
    ],
    pytest.param(
        "threshold_ratio",
        lambda: vllm.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=anything("0.5")),
        id="clear-ratio=str",
    ),
    pytest.param(
        "devices",
        lambda: vllm.wait_for_gpu_memory_to_clear(devices=anything(None), threshold_ratio=1.0),
        id="clear-devices=None",
    ),
    *[
        pytest.param(
            "gpu_memory_utilization",
            lambda v=v: vllm.engine_kwargs({"gpu_memory_utilization": v}),
            id=f"util={show_value(v)}",
        )
        for v in [0, 1.5, -0.1, math.nan, math.inf, "0.9", True, HUGE]
    ],
    pytest.param(
        "kwargs",
        lambda: vllm.engine_kwargs(anything(["x"])),
        id="kwargs=list",
    ),
    *[
        pytest.param(
            "tensor_parallel_size",
            lambda v=v: vllm.before_engine_start({"tensor_parallel_size": v}),
            id=f"tp={show_value(v)}",
        )
        for v in [0, -1, 1.5, "2", True]
    ],
    *[
        pytest.param("min_gb", lambda v=v: vllm.large_gpu_mark(v), id=f"min_gb={show_value(v)}")
        for v in [math.nan, "24", True]
    ],
    *[
        pytest.param("num_gpus", lambda v=v: vllm.multi_gpu_marks(num_gpus=v), id=f"gpus={v!r}")
        for v in [1.5, "2", True]
    ],
    *[
        pytest.param(
            "tolerance", lambda v=v: _enter_baseline(tolerance=v), id=f"tol={show_value(v)}"
        )
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
    rejects(call, argument)


_BEYOND = [10**400, 10**5000, -(10**5000)]
"""Ints beyond any float, and beyond what ``str()`` writes: no message may try to print them."""


@pytest.mark.parametrize("value", _BEYOND, ids=["10**400", "10**5000", "-10**5000"])
def test_marks_name_counts_beyond_printing(sim: SimulatedPlatform, value: int) -> None:
    rejects(lambda: vllm.large_gpu_mark(value), "min_gb")
    rejects(lambda: vllm.large_gpu_test(min_gb=value), "min_gb")
    if value > 0:
        rejects(lambda: vllm.multi_gpu_marks(num_gpus=value), "num_gpus")
        rejects(lambda: vllm.multi_gpu_test(num_gpus=value), "num_gpus")


def test_marks_still_take_what_vllm_compares(sim: SimulatedPlatform) -> None:
    for value in (math.inf, -math.inf):
        vllm.large_gpu_mark(value)
    vllm.multi_gpu_marks(num_gpus=2**63 - 1)


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("threshold_bytes", dict.fromkeys(range(20000), 1)),
        ("threshold_ratio", {f"device{i}": 0.5 for i in range(20_000)}),
        ("devices", "x" * 100_000),
    ],
    ids=["bytes-keys", "ratio-keys", "devices-str"],
)
def test_long_values_are_not_echoed_in_full(
    sim: SimulatedPlatform, argument: str, value: Any
) -> None:
    kwargs: dict[str, Any] = {"devices": [0], "threshold_ratio": 0.5, argument: value}
    with pytest.raises((ValueError, AssertionError), match=argument) as info:
        vllm.wait_for_gpu_memory_to_clear(**kwargs)
    assert len(str(info.value)) < 600


def test_a_long_repeated_device_list_is_refused_in_linear_time(sim: SimulatedPlatform) -> None:
    rejects(
        lambda: vllm.wait_for_gpu_memory_to_clear(devices=[0, 1] * 20_000, threshold_ratio=1.0),
        "more than once",
    )
