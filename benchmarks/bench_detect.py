"""Detection and memory-query cost of accelplat on NVIDIA, next to NVML itself and torch.

Prints, from one run:

* fresh-process wall time (median of ``--runs`` subprocesses, run round-robin) of
  ``import accelplat; accelplat.current_platform()`` against the floor
  ``import pynvml; pynvml.nvmlInit()`` and against ``import torch; torch.cuda.mem_get_info()``,
  plus the interpreter alone and the pieces of accelplat's own cost (entry-point scan);
* per-call latency of ``platform.memory_info(0)`` against a raw ``nvmlDeviceGetMemoryInfo``
  (best of ``--repeats`` timings of ``--iterations`` calls each);
* the device memory NVML says this process holds after using accelplat (must be 0: no CUDA
  context) and whether torch was imported.

On a machine without a working NVML it says so and exits 0. With ``--tree DIR`` (a checkout of
another revision, e.g. ``git worktree add /tmp/base REV``) the fresh-process snippets that
import accelplat are timed with that tree's accelplat too, in the same round-robin.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_detect.py [--runs 9] [--iterations 20000] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SNIPPETS: dict[str, str] = {
    "python (startup only)": "pass",
    "import pynvml; nvmlInit() [floor]": "import pynvml; pynvml.nvmlInit()",
    "  floor + one handle and v2 memory query": (
        "import pynvml; pynvml.nvmlInit(); "
        "h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)"
    ),
    "import accelplat; current_platform()": (
        "import accelplat; assert accelplat.current_platform().name == 'cuda'"
    ),
    "  … then memory_info(0)": ("import accelplat; accelplat.current_platform().memory_info(0)"),
    "  import accelplat._registry only": "import accelplat._registry",
    "  import accelplat._backends.cuda only": "import accelplat._backends.cuda",
    "  importlib.metadata entry_points(group)": (
        "from importlib.metadata import entry_points; entry_points(group='accelplat.platforms')"
    ),
    "import torch; torch.cuda.mem_get_info()": "import torch; torch.cuda.mem_get_info()",
}


def _env(tree: Path = REPO) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["PYTHONPATH"] = str(tree)  # and cwd=tree: "python -c" puts the working directory first
    return env


def _nvml_status() -> tuple[bool, str]:
    try:
        import pynvml
    except ImportError as exc:
        return False, f"nvidia-ml-py is not installed ({exc})"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if count < 1:
        return False, "NVML found no GPU"
    return True, f"driver {pynvml.nvmlSystemGetDriverVersion()}, {count} GPU(s)"


def _bytecode_cached() -> bool:
    import importlib.util

    source = REPO / "accelplat" / "_backends" / "cuda.py"
    return Path(importlib.util.cache_from_source(str(source))).exists()


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def fresh_process_times(
    runs: int, with_torch: bool, other: Path | None = None
) -> dict[str, list[float]]:
    """Run every snippet ``runs`` times in fresh interpreters, round-robin; return seconds.

    With ``other``, each snippet that imports accelplat also runs on that tree (its key ends
    ``[--tree]``), in the same round-robin.
    """
    cases: dict[str, tuple[str, Path]] = {}
    for name, code in SNIPPETS.items():
        if with_torch or "torch" not in name:
            cases[name] = (code, REPO)
            if other is not None and "accelplat" in code:
                cases[f"{name} [--tree]"] = (code, other)
    for code, tree in cases.values():  # one warm-up each: page cache, .pyc files
        subprocess.run([sys.executable, "-c", code], env=_env(tree), check=True, cwd=tree)
    times: dict[str, list[float]] = {n: [] for n in cases}
    for _ in range(runs):
        for name, (code, tree) in cases.items():
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", code],
                env=_env(tree),
                check=True,
                cwd=tree,
                stdout=subprocess.DEVNULL,
            )
            times[name].append(time.perf_counter() - start)
    return times


PHASES = r"""
import json, time
t = [time.perf_counter()]
import accelplat._registry as registry
t.append(time.perf_counter())
from importlib.metadata import entry_points
t.append(time.perf_counter())
entry_points(group="accelplat.platforms")
t.append(time.perf_counter())
import accelplat._backends.cuda as cuda
t.append(time.perf_counter())
import pynvml
t.append(time.perf_counter())
from accelplat._vendor import nvml as _nvml
with _nvml.session():
    pass
t.append(time.perf_counter())
cuda.CudaPlatform.probe()
t.append(time.perf_counter())
platform = registry.current_platform()
t.append(time.perf_counter())
platform.memory_info(0)
t.append(time.perf_counter())
names = ["import accelplat._registry (+_types, errors, platform)", "import importlib.metadata",
         "entry_points(group) scan", "import accelplat._backends.cuda", "import pynvml",
         "nvmlInit", "probe: enumerate GPUs, map visible", "current_platform() after probe",
         "first memory_info(0)"]
print(json.dumps({n: b - a for n, a, b in zip(names, t, t[1:])}))
"""


def detection_phases(runs: int) -> dict[str, float]:
    """Median seconds of each phase of detection, each run in a fresh interpreter."""
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", PHASES],
            env=_env(),
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
        for name, value in json.loads(done.stdout.strip().splitlines()[-1]).items():
            samples.setdefault(name, []).append(value)
    return {name: statistics.median(values) for name, values in samples.items()}


def per_call_latency(iterations: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds per call for accelplat and raw NVML queries."""
    import pynvml

    import accelplat

    platform = accelplat.current_platform()
    device = platform.devices()[0]
    handle = pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
    v2 = pynvml.nvmlMemory_v2
    cases: dict[str, Any] = {
        "platform.memory_info(0)": lambda: platform.memory_info(0),
        "raw nvmlDeviceGetMemoryInfo(h, v2)": lambda: pynvml.nvmlDeviceGetMemoryInfo(
            handle, version=v2
        ),
        "raw v2 call + reading its 4 fields": lambda: _read_fields(
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
        ),
        "raw nvmlDeviceGetMemoryInfo(h) v1": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "platform.device_count()": platform.device_count,
        "platform.memory_holders(0)": lambda: platform.memory_holders(0),
        "raw nvmlDeviceGetComputeRunningProcesses": lambda: (
            pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ),
    }
    out: dict[str, float] = {}
    for name, fn in cases.items():
        n = iterations if "holders" not in name and "Processes" not in name else iterations // 10
        best = min(timeit.repeat(fn, number=n, repeat=repeats))
        out[name] = best / n
    return out


def _read_fields(mem: Any) -> tuple[int, int, int, int]:
    return (mem.total, mem.reserved, mem.free, mem.used)


def held_by_this_process() -> tuple[int | None, bool]:
    """Bytes NVML lists for this pid over all GPUs (None if it cannot say), torch imported?"""
    import pynvml

    total = 0
    me = os.getpid()
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if int(proc.pid) == me:
                    total += int(proc.usedGpuMemory or 0)
    except Exception:
        return None, "torch" in sys.modules
    return total, "torch" in sys.modules


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f} ms"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:9.2f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="fresh processes per snippet (>= 7)")
    parser.add_argument("--iterations", type=int, default=20000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per call (best wins)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--tree", type=Path, help="also time this checkout's accelplat, side by side (the before)"
    )
    args = parser.parse_args(argv)
    if args.runs < 7:
        parser.error("--runs must be at least 7")
    if args.tree is not None and not (args.tree / "accelplat" / "__init__.py").is_file():
        parser.error(f"--tree {args.tree}: no accelplat package there")

    ok, status = _nvml_status()
    if not ok:
        print(f"NVML is unavailable here ({status}); nothing to measure.")
        return 0
    print(f"NVML: {status}; python {sys.version.split()[0]} at {sys.executable}")
    if not _bytecode_cached():
        print(
            "note: accelplat has no cached bytecode for this Python (PYTHONDONTWRITEBYTECODE?): "
            "its import times below include compiling it; an installed package would not. "
            "Run `python -m compileall -q accelplat` first to measure that case."
        )
    with_torch = _has_torch() and not args.no_torch

    times = fresh_process_times(args.runs, with_torch, args.tree.resolve() if args.tree else None)
    med = {name: statistics.median(values) for name, values in times.items()}
    base = med["python (startup only)"]
    print(f"\nFresh process, median of {args.runs} runs (and minus interpreter startup):")
    for name, value in med.items():
        spread = f"[{min(times[name]) * 1e3:.1f}–{max(times[name]) * 1e3:.1f}]"
        print(f"  {name:44s} {_ms(value)}  {_ms(value - base)}  {spread}")
    floor = med["import pynvml; nvmlInit() [floor]"]
    ours = med["import accelplat; current_platform()"]
    ratios = {
        "accelplat detect / NVML floor": ours / floor,
        "accelplat detect / NVML floor (startup excluded)": (ours - base) / max(floor - base, 1e-9),
    }
    if args.tree is not None:
        ratios["accelplat detect / NVML floor [--tree]"] = (
            med["import accelplat; current_platform() [--tree]"] / floor
        )
    if with_torch:
        torch_t = med["import torch; torch.cuda.mem_get_info()"]
        ratios["torch mem_get_info / accelplat detect"] = torch_t / ours
    scan = med["  importlib.metadata entry_points(group)"] - base
    print(f"  entry-point scan (importlib.metadata import + entry_points): {scan * 1e3:.1f} ms")

    phases = detection_phases(args.runs)
    print(f"\nDetection phases in a fresh process, median of {args.runs}:")
    for name, value in phases.items():
        print(f"  {name:52s} {_ms(value)}")

    latency = per_call_latency(args.iterations, args.repeats)
    print(f"\nPer call, best of {args.repeats} × {args.iterations} (holders: ÷10):")
    for name, value in latency.items():
        print(f"  {name:44s} {_us(value)}")
    ratios["memory_info / raw v2 call"] = (
        latency["platform.memory_info(0)"] / latency["raw nvmlDeviceGetMemoryInfo(h, v2)"]
    )
    ratios["memory_info / raw v2 call + field reads"] = (
        latency["platform.memory_info(0)"] / latency["raw v2 call + reading its 4 fields"]
    )
    query_floor = med["  floor + one handle and v2 memory query"]
    ratios["accelplat detect + memory_info / floor + one query"] = (
        med["  … then memory_info(0)"] / query_floor
    )

    held, torch_loaded = held_by_this_process()
    print("\nThis process after using accelplat:")
    print(
        "  device memory held (NVML process list): "
        + ("unknown (NVML cannot list processes here)" if held is None else f"{held} B")
    )
    print(f"  torch in sys.modules: {torch_loaded}")

    print("\nRatios:")
    for name, value in ratios.items():
        print(f"  {name:52s} {value:8.2f}×")

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "nvml": status,
                    "fresh_process_s": times,
                    "median_s": med,
                    "per_call_s": latency,
                    "held_bytes": held,
                    "torch_imported": torch_loaded,
                    "detection_phases_s": phases,
                    "ratios": ratios,
                },
                indent=2,
            )
        )
    if held not in (None, 0) or torch_loaded:
        print("FAIL: accelplat took device memory or imported torch")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
