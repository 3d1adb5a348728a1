"""Detection cost on a host without an accelerator driver, next to the interpreter alone.

Runs each snippet in fresh interpreters, round-robin (``--runs`` of each, after one warm-up),
and prints the median and the minimum wall time and the median CPU time (user + system of the
child) of each, then the ratio the target is about:
``import accelplat; current_platform().memory_info(0)`` over ``python -c pass``, measured in the
same run. The minimum is the figure least disturbed by other load on a shared machine; both are
printed. Pieces of the cost (importing the package, the value types, the backends) are listed
to show where the time goes. Also prints, from one fresh interpreter, which optional modules the
detection imported (none of pynvml, psutil, torch should be).

With ``--tree DIR`` (a checkout of another revision, e.g. ``git worktree add /tmp/base REV``)
that tree's accelplat is timed too, each snippet of both trees in the same round-robin, so that
a change is measured against the tree before it under the same load.

Usage (from the repository root; compile the bytecode of every tree timed, as an installed
package has it, with ``PYTHONDONTWRITEBYTECODE`` unset)::

    python -m compileall -q accelplat [/tmp/base/accelplat]
    python benchmarks/bench_cpu_detect.py [--runs 41] [--tree /tmp/base] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TARGET = "import accelplat; current_platform().memory_info(0)"
BASELINE = "python -c pass"

SNIPPETS: dict[str, str] = {
    BASELINE: "pass",
    TARGET: "import accelplat; accelplat.current_platform().memory_info(0)",
    "  forced: ACCELPLAT_PLATFORM=cpu": (
        "import os; os.environ['ACCELPLAT_PLATFORM'] = 'cpu'; "
        "import accelplat; accelplat.current_platform().memory_info(0)"
    ),
    "  import accelplat._registry": "import accelplat._registry",
    "  import accelplat._types (the value types)": "import accelplat._types",
    "  import typing, dataclasses (stdlib floor)": "import typing, dataclasses",
    "  ... and pathlib, ctypes, threading": (
        "import typing, dataclasses, pathlib, ctypes, threading"
    ),
    "  import psutil (no longer on this path)": "import psutil",
    "  import pynvml (no longer on this path)": "import pynvml",
}

IMPORTED = (
    "import sys, json, accelplat\n"
    "p = accelplat.current_platform(); p.memory_info(0)\n"
    "print(json.dumps({'platform': p.name, 'modules': sorted(m for m in "
    "('pynvml', 'psutil', 'torch', 'amdsmi', 'uuid', 'ctypes.util', 'secrets', "
    "'accelplat._vendor.levelzero', 'accelplat._backends.cuda', 'accelplat._backends.rocm', "
    "'accelplat._backends.xpu', 'accelplat._visible.cuda', 'accelplat._visible.oneapi', "
    "'accelplat._visible.rocm') if m in sys.modules)}))\n"
)


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["PYTHONPATH"] = str(tree)  # and cwd=tree: "python -c" puts the working directory first
    return env


def _available(code: str, tree: Path) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(tree), cwd=tree, capture_output=True, check=False
    )
    return done.returncode == 0


def _compiled(tree: Path) -> bool:
    import importlib.util

    source = tree / "accelplat" / "__init__.py"
    return Path(importlib.util.cache_from_source(str(source))).exists()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def fresh_process_times(
    runs: int, trees: dict[str, Path]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every snippet of every tree ``runs`` times in fresh interpreters, round-robin.

    Returns:
        Wall seconds and CPU seconds (user + system of the child) of every run of each snippet,
        keyed ``"<snippet> [<tree>]"`` (one without accelplat once, unlabelled). The CPU time
        hardly moves when other jobs share the cores; the wall time does.
    """
    cases: dict[str, tuple[str, Path]] = {}
    for label, tree in trees.items():
        for name, code in SNIPPETS.items():
            key = f"{name} [{label}]" if "accelplat" in code else name  # others: once
            if key not in cases and _available(code, tree):  # also the warm-up
                cases[key] = (code, tree)
    times: dict[str, list[float]] = {n: [] for n in cases}
    cpu: dict[str, list[float]] = {n: [] for n in cases}
    for _ in range(runs):
        for key, (code, tree) in cases.items():
            cpu_before = _children_cpu()
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", code],
                env=_env(tree),
                check=True,
                cwd=tree,
                stdout=subprocess.DEVNULL,
            )
            times[key].append(time.perf_counter() - start)
            cpu[key].append(_children_cpu() - cpu_before)
    return times, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=41, help="fresh processes per snippet")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--tree", type=Path, help="also time this checkout's accelplat, side by side (the before)"
    )
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    trees = {"this tree": REPO}
    if args.tree is not None:
        if not (args.tree / "accelplat" / "__init__.py").is_file():
            parser.error(f"--tree {args.tree}: no accelplat package there")
        trees["--tree"] = args.tree.resolve()

    print(f"python {sys.version.split()[0]} at {sys.executable}")
    seen: dict[str, object] = {}
    for label, tree in trees.items():
        found = json.loads(
            subprocess.run(
                [sys.executable, "-c", IMPORTED],
                env=_env(tree),
                cwd=tree,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        seen[label] = found
        print(
            f"{label} ({tree}): detected platform {found['platform']}; optional modules "
            f"imported: {found['modules']}"
        )
        if found["platform"] != "cpu":
            print("note: this host is not CPU-only; the CPU-host target does not apply here")
        if not _compiled(tree):
            print(f"note: {tree}/accelplat has no bytecode: its times include compiling it")

    print(f"load average before the runs: {_load()}")
    times, cpu = fresh_process_times(args.runs, trees)
    print(f"load average after the runs: {_load()}")
    med = {name: statistics.median(values) for name, values in times.items()}
    low = {name: min(values) for name, values in times.items()}
    cpu_med = {name: statistics.median(values) for name, values in cpu.items()}
    print(f"\nFresh process, {args.runs} runs of each, round-robin:")
    print(f"  {'snippet':60s} {'median':>10s} {'min':>10s} {'CPU median':>11s}")
    for name in times:
        print(
            f"  {name:60s} {med[name] * 1e3:7.1f} ms {low[name] * 1e3:7.1f} ms "
            f"{cpu_med[name] * 1e3:8.1f} ms"
        )
    ratios: dict[str, float] = {}
    for label in trees:
        target = f"{TARGET} [{label}]"
        ratios[f"detect+query / python -c pass (median) [{label}]"] = med[target] / med[BASELINE]
        ratios[f"detect+query / python -c pass (min) [{label}]"] = low[target] / low[BASELINE]
        ratios[f"detect+query / python -c pass (CPU median) [{label}]"] = (
            cpu_med[target] / cpu_med[BASELINE]
        )
    print("\nRatios (target: <= 5x on a CPU-only host):")
    for name, value in ratios.items():
        print(f"  {name:60s} {value:6.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "seen": seen,
                    "times_s": times,
                    "cpu_s": cpu,
                    "median_s": med,
                    "min_s": low,
                    "ratios": ratios,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
