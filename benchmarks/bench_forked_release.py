"""Back-to-back forked tests on a device that frees an exited child's memory 0.22 s later.

vLLM's ``fork_new_process_for_each_test`` returns as soon as the child has exited, while the
driver reclaims the child's memory asynchronously (vllm#57362: a test failed 8 of 3,288 runs
because the next one allocated first). accelplat's drop-in waits for the release
(``wait_for_release`` on the child). This runs the same suite of forked tests both ways on the
simulated platform, whose holders are the real children, released 0.22 s after each exits (the
SIGKILL release measured on an H200), and prints how many tests started while the previous
child's memory was still held, and what the wait costs per test.

Run: ``PYTHONPATH=. python benchmarks/bench_forked_release.py [--tests N]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from accelplat import _registry as registry
from accelplat.integrations import vllm as av
from accelplat.testing._isolation import run_child
from tests.integrations.forked_driver import (
    GIB,
    RELEASE_DELAY_S,
    forked_device,
    held_by_others,
    holding_body,
)


def suite(
    tests: int, run: Callable[[Callable[[], None]], object]
) -> tuple[int, float, list[float]]:
    """Run ``tests`` forked tests; return early starts, bytes held at worst, seconds per test."""
    with tempfile.TemporaryDirectory() as tmp, forked_device(Path(tmp)) as platform:
        registry.set_current_platform(platform)
        early, worst, took = 0, 0.0, []
        try:
            for _ in range(tests):
                held = held_by_others(platform)
                early += held > 0
                worst = max(worst, held / GIB)
                started = time.monotonic()
                run(holding_body(Path(tmp)))
                took.append(time.monotonic() - started)
        finally:
            registry.set_current_platform(None)
    return early, worst, took


def main() -> None:
    """Print the figures of both decorators."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tests", type=int, default=20)
    n = parser.parse_args().tests
    fork = av.create_new_process_for_each_test("fork")
    rows = {
        "fork and return (vLLM)": suite(n, lambda body: run_child(body, method="fork")),
        "fork, wait for release (accelplat)": suite(n, lambda body: fork(body)()),
    }
    print(
        f"{n} back-to-back forked tests, each holding 8 GiB for 50 ms; release {RELEASE_DELAY_S} s"
    )
    for name, (early, worst, took) in rows.items():
        print(
            f"  {name:<36} started while memory was held: {early:>2} of {n} (up to "
            f"{worst:.0f} GiB); per test: median {statistics.median(took) * 1000:.0f} ms"
        )
    base = statistics.median(rows["fork and return (vLLM)"][2])
    waited = statistics.median(rows["fork, wait for release (accelplat)"][2])
    print(f"  added per test: {(waited - base) * 1000:.0f} ms (the release delay is "
          f"{RELEASE_DELAY_S * 1000:.0f} ms; the rest is polling, at most 40 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
