"""Drop-in replacements for vLLM's test helpers (``tests/utils.py``), and hooks for its runners.

Everything under a vLLM name accepts the same calls and behaves as vLLM 0.32/0.33 does wherever a
passing vLLM test could notice; what is kept, what is better and ``strict=True`` are in
``docs/migrating-vllm-tests.md``. The errors raised are ``VllmMemoryNotFreeError`` and
``VllmArgumentError``, in :mod:`accelplat.errors`.
"""

from accelplat.integrations._vllm import (
    DEFAULT_HF_TOLERANCE,
    after_engine_shutdown,
    before_engine_start,
    create_new_process_for_each_test,
    engine_kwargs,
    fork_new_process_for_each_test,
    large_gpu_mark,
    large_gpu_test,
    memory_baseline,
    multi_gpu_marks,
    multi_gpu_test,
    record_gpu_memory_usage_stats,
    requires_spawn_multiprocessing,
    spawn_new_process_for_each_test,
    wait_for_gpu_memory_to_clear,
    wait_for_memory_to_settle,
)

__all__ = [
    "DEFAULT_HF_TOLERANCE",
    "after_engine_shutdown",
    "before_engine_start",
    "create_new_process_for_each_test",
    "engine_kwargs",
    "fork_new_process_for_each_test",
    "large_gpu_mark",
    "large_gpu_test",
    "memory_baseline",
    "multi_gpu_marks",
    "multi_gpu_test",
    "record_gpu_memory_usage_stats",
    "requires_spawn_multiprocessing",
    "spawn_new_process_for_each_test",
    "wait_for_gpu_memory_to_clear",
    "wait_for_memory_to_settle",
]
