"""What ``--accelplat-leak-check`` and ``--accelplat-timeline`` cost per test on a CPU host.

Writes a file of ``--tests`` trivial tests into a temporary directory and runs pytest on it in
fresh processes, round-robin, ``--runs`` times each:

* ``disabled``: the accelplat plugin disabled (``-p no:accelplat``);
* ``installed``: the plugin loaded, no option given;
* ``leak-check`` and ``timeline``: one option each, to show which costs what;
* ``leak-check + timeline``: ``--accelplat-leak-check --accelplat-timeline=report.html`` (the
  report is written, as in real use).

Prints the median and minimum wall time and the median CPU time (user + system of the pytest
process) of each, and the cost per test of the options over the
disabled run (target: at most 0.5 ms per test with both options). Also prints the cost of one
``memory_info(0)`` reading next to ``psutil.virtual_memory()`` (best of 5 timings).

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_plugin_overhead.py [--tests 500] [--runs 7]
        [--no-bytecode-cache]

The children cache bytecode as Python does by default, also when this shell sets
``PYTHONDONTWRITEBYTECODE``: pytest compiles (assertion-rewrites) a plugin's modules on import
and, without the cache, does so again in every session, which is a cost of that setting rather
than of the options. ``--no-bytecode-cache`` measures with the shell's setting instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "disabled": ["-p", "no:accelplat"],
    "installed": [],
    "leak-check": ["--accelplat-leak-check"],
    "timeline": ["--accelplat-timeline=report.html"],
    "leak-check + timeline": ["--accelplat-leak-check", "--accelplat-timeline=report.html"],
}


def _env(*, bytecode_cache: bool = True) -> dict[str, str]:
    """The children's environment: this one without ``ACCELPLAT_*``, the CPU platform forced.

    With ``bytecode_cache`` (the default) ``PYTHONDONTWRITEBYTECODE`` is dropped, so the
    children cache bytecode as Python does by default. pytest rewrites the assertions of every
    module of a plugin's distribution as it imports it and caches the result the same way;
    with the variable set, each session re-compiles every accelplat module the options import
    (tens of milliseconds per session, not per test).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["ACCELPLAT_PLATFORM"] = "cpu"
    return env


def _write_suite(directory: Path, tests: int) -> None:
    lines = [f"def test_{i}():\n    assert {i} == {i}\n" for i in range(tests)]
    (directory / "test_trivial.py").write_text("\n".join(lines))
    (directory / "pytest.ini").write_text("[pytest]\naddopts = -q -p no:cacheprovider\n")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_times(
    tests: int, runs: int, *, bytecode_cache: bool = True
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds of each variant over ``runs`` round-robin runs (after a warm-up).

    The warm-up round also writes the bytecode caches (see :func:`_env`).

    The CPU time (user + system, of the pytest process and its threads) is what the plugins
    cost the machine; unlike the wall time it hardly moves when other jobs share the cores.
    """
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _write_suite(work, tests)
        for rnd in range(runs + 1):
            for name, extra in VARIANTS.items():
                cpu_before = _children_cpu()
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", *extra],
                    cwd=work,
                    env=_env(bytecode_cache=bytecode_cache),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                elapsed = time.perf_counter() - start
                used = _children_cpu() - cpu_before
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                if rnd:  # the first round warms caches
                    times[name].append(elapsed)
                    cpu[name].append(used)
    return times, cpu


def reading_costs() -> dict[str, float]:
    """Best-of-5 seconds per call of the CPU memory reading and of psutil's."""
    import psutil

    from accelplat._backends.cpu import CpuPlatform

    platform = CpuPlatform()
    platform.memory_info(0)
    out = {
        "CpuPlatform().memory_info(0)": min(
            timeit.repeat(lambda: platform.memory_info(0), number=2000, repeat=5)
        )
        / 2000,
        "psutil.virtual_memory()": min(timeit.repeat(psutil.virtual_memory, number=2000, repeat=5))
        / 2000,
    }
    return out


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=500, help="trivial tests in the suite")
    parser.add_argument("--runs", type=int, default=7, help="runs of each variant")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as this shell has it (by default the children cache "
        "bytecode, as Python does unless told otherwise)",
    )
    args = parser.parse_args(argv)
    bytecode_cache = not args.no_bytecode_cache

    costs = reading_costs()
    print("One reading, best of 5 x 2000 calls:")
    for name, value in costs.items():
        print(f"  {name:32s} {value * 1e6:8.1f} us")
    print(f"load average before the runs: {_load()}")
    if bytecode_cache:
        print("bytecode caching: on in the children (Python's default)")
    else:
        dont = os.environ.get("PYTHONDONTWRITEBYTECODE")
        print(f"bytecode caching: as this shell has it (PYTHONDONTWRITEBYTECODE={dont!r})")
    times, cpu = run_times(args.tests, args.runs, bytecode_cache=bytecode_cache)
    print(f"load average after the runs: {_load()}")
    med = {n: statistics.median(v) for n, v in times.items()}
    low = {n: min(v) for n, v in times.items()}
    cpu_med = {n: statistics.median(v) for n, v in cpu.items()}
    print(f"\npytest on {args.tests} trivial tests, {args.runs} runs of each, round-robin:")
    print(f"  {'variant':28s} {'median':>10s} {'min':>10s} {'CPU median':>12s}")
    for name in times:
        print(f"  {name:28s} {med[name]:8.3f} s {low[name]:8.3f} s {cpu_med[name]:10.3f} s")
    per_test = {
        f"{name} over disabled ({kind}), per test": (pick[name] - pick["disabled"]) / args.tests
        for name in VARIANTS
        if name != "disabled"
        for kind, pick in (("median", med), ("min", low), ("CPU median", cpu_med))
    }
    print("\nCost per test (target for leak-check + timeline: <= 0.5 ms):")
    for name, value in per_test.items():
        print(f"  {name:52s} {value * 1e3:7.3f} ms")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"reading_s": costs, "times_s": times, "cpu_s": cpu, "per_test_s": per_test},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
