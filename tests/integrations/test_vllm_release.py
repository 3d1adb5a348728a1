"""vLLM's fork and spawn decorators return only once the child's memory is back (vllm#57362)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from accelplat import _registry as registry
from accelplat.integrations import vllm as av
from accelplat.testing._isolation import run_child
from tests.integrations.forked_driver import (
    RELEASE_DELAY_S,
    forked_device,
    held_by_others,
    holding_body,
)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger"
    path.mkdir()
    return path


def _early_starts(ledger: Path, run: object, tests: int = 3) -> list[int]:
    """Bytes a previous child still held when each test started, back to back."""
    held = []
    with forked_device(ledger) as platform:
        registry.set_current_platform(platform)
        try:
            for _ in range(tests):
                held.append(held_by_others(platform))
                run(holding_body(ledger))  # type: ignore[operator]
        finally:
            registry.set_current_platform(None)
    return held


def test_back_to_back_forked_tests_start_once_the_previous_childs_memory_is_back(
    ledger: Path,
) -> None:
    fork = av.create_new_process_for_each_test("fork")
    assert _early_starts(ledger, lambda body: fork(body)()) == [0, 0, 0]


def test_without_the_wait_the_next_test_starts_while_memory_is_held(ledger: Path) -> None:
    held = _early_starts(ledger, lambda body: run_child(body, method="fork"))
    assert held[0] == 0
    assert all(h > 0 for h in held[1:])


def test_the_wait_ends_with_the_release_not_at_a_fixed_delay(ledger: Path) -> None:
    with forked_device(ledger) as platform:
        registry.set_current_platform(platform)
        try:
            started = time.monotonic()
            av.fork_new_process_for_each_test(holding_body(ledger, work_s=0.05))()
            took = time.monotonic() - started
        finally:
            registry.set_current_platform(None)
        assert held_by_others(platform) == 0
    assert 0.05 + RELEASE_DELAY_S <= took < 0.05 + RELEASE_DELAY_S + 1.0
