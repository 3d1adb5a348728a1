"""The drop-in helpers accept exactly the calls vLLM's tests/utils.py helpers accept.

The expected signatures are transcribed from vLLM 0.33.0 (see the reference notes): keyword-only
parameters with these names and defaults, so that vLLM can switch with an import change.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from accelplat.integrations import vllm as av

KW = inspect.Parameter.KEYWORD_ONLY
EMPTY = inspect.Parameter.empty

EXPECTED: dict[str, list[tuple[str, Any]]] = {
    "record_gpu_memory_usage_stats": [("devices", EMPTY)],
    "wait_for_gpu_memory_to_clear": [
        ("devices", EMPTY),
        ("threshold_bytes", None),
        ("threshold_ratio", None),
        ("timeout_s", 120),
        ("stable_duration_s", 0),
        ("stable_tolerance_bytes", 512 * 1024**2),
        ("poll_interval_s", 5),
    ],
    "wait_for_memory_to_settle": [("threshold_ratio", 0.1), ("timeout_s", 240)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_matches_vllm(name: str) -> None:
    params = list(inspect.signature(getattr(av, name)).parameters.values())
    assert [(p.name, p.default) for p in params] == EXPECTED[name]
    assert all(p.kind is KW for p in params), [(p.name, p.kind) for p in params]


def test_positional_calls_are_refused_like_vllms() -> None:
    with pytest.raises(TypeError):
        av.record_gpu_memory_usage_stats([0])  # type: ignore[misc]


def test_create_new_process_for_each_test_takes_an_optional_method() -> None:
    params = list(inspect.signature(av.create_new_process_for_each_test).parameters.values())
    assert [(p.name, p.default) for p in params] == [("method", None)]
