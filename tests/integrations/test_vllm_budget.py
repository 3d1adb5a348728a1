"""engine_kwargs under a memory budget: utilization and KV cache inside a test's share."""

from __future__ import annotations

from pathlib import Path

import pytest

import accelplat.integrations.vllm as av
from accelplat._backends.simulated import SimulatedPlatform
from accelplat._leasing import ENV_MEMORY_BYTES, lease
from accelplat._sizing import KVCacheShape
from accelplat._types import GIB
from accelplat.errors import ConfigurationError, KVCacheTooSmallError

# a Llama-3-8B-like cache: 32 layers, 8 KV heads of 128, bf16: 128 KiB per token
SHAPE = KVCacheShape(num_layers=32, num_kv_heads=8, head_size=128, dtype_bytes="bf16")


@pytest.fixture
def plat(monkeypatch: pytest.MonkeyPatch) -> SimulatedPlatform:
    monkeypatch.delenv(ENV_MEMORY_BYTES, raising=False)
    return SimulatedPlatform({"devices": [{"total": "80GiB"}]})


def test_without_a_budget_nothing_changes(plat: SimulatedPlatform) -> None:
    assert av.engine_kwargs({"model": "m"}, platform=plat) == {
        "model": "m",
        "gpu_memory_utilization": 0.92,
    }


def test_a_budget_becomes_the_engines_utilization(plat: SimulatedPlatform) -> None:
    result = av.engine_kwargs({"model": "m"}, platform=plat, budget_bytes=20 * GIB)
    assert result == {"model": "m", "gpu_memory_utilization": 0.25}
    odd = av.engine_kwargs({}, platform=plat, budget_bytes=30 * GIB - 1)
    assert odd["gpu_memory_utilization"] * 80 * GIB <= 30 * GIB - 1  # rounded down, never up


def test_the_budget_comes_from_the_memory_lease(
    plat: SimulatedPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with lease(memory="16GiB", platform=plat, lock_dir=tmp_path) as held:
        restore = held.apply()
        try:
            assert av.engine_kwargs({}, platform=plat)["gpu_memory_utilization"] == 0.2
        finally:
            restore()
    monkeypatch.setenv(ENV_MEMORY_BYTES, "lots")
    with pytest.raises(ConfigurationError, match=ENV_MEMORY_BYTES):
        av.engine_kwargs({}, platform=plat)


def test_the_rest_of_the_budget_becomes_the_kv_cache(plat: SimulatedPlatform) -> None:
    kwargs = {"max_model_len": 8192}
    result = av.engine_kwargs(
        kwargs, platform=plat, budget_bytes=24 * GIB, model_bytes=17 * GIB, kv_cache_shape=SHAPE
    )
    assert result["kv_cache_memory_bytes"] == 7 * GIB
    assert result["gpu_memory_utilization"] == 0.3


def test_a_budget_too_small_for_max_model_len_is_refused_with_the_fix(
    plat: SimulatedPlatform,
) -> None:
    with pytest.raises(KVCacheTooSmallError) as info:
        av.engine_kwargs(
            {"max_model_len": 131072},  # 16 GiB of cache
            platform=plat,
            budget_bytes=24 * GIB,
            model_bytes=17 * GIB,
            kv_cache_shape=SHAPE,
        )
    message = str(info.value)
    assert "16.00 GiB KV cache is needed" in message
    assert "leaves 7.00 GiB" in message
    assert "Raise the budget to at least 33.00 GiB" in message
    assert "max_model_len to at most 57344" in message
    assert info.value.estimated_max_model_len == 57344


def test_a_utilization_beyond_the_budget_is_refused(plat: SimulatedPlatform) -> None:
    with pytest.raises(ConfigurationError, match="beyond this test's memory budget") as info:
        av.engine_kwargs({"gpu_memory_utilization": 0.9}, platform=plat, budget_bytes=20 * GIB)
    assert "engine_kwargs sets 0.25 from the budget" in str(info.value)
    inside = av.engine_kwargs({"gpu_memory_utilization": 0.2}, platform=plat, budget_bytes=20 * GIB)
    assert inside["gpu_memory_utilization"] == 0.2


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"budget_bytes": 0}, "budget_bytes"),
        ({"budget_bytes": 81 * GIB}, "larger than"),
        ({"budget_bytes": GIB, "model_bytes": -1}, "model_bytes"),
        ({"budget_bytes": GIB, "model_bytes": 2 * GIB}, "do not fit"),
    ],
    ids=str,
)
def test_bad_budgets_name_the_argument(
    plat: SimulatedPlatform, kw: dict[str, int], field: str
) -> None:
    with pytest.raises(ConfigurationError, match=field):
        av.engine_kwargs({}, platform=plat, **kw)
