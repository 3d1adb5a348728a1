"""``pytest -n 8 --accelplat-pack`` against plain ``pytest``, as users run them, on one suite.

Generates a suite of GPU tests in a temporary directory: each declares its budget
(``accelplat_requires(device_memory=…)``), sleeps its host time (loading, checks), allocates its
tensors with torch and does a fixed number of bf16 8192x8192 matmuls, calibrated on an idle GPU
to last ``--gpu-seconds`` alone (so a shared GPU stretches it). The suite's ``conftest.py``
imports torch (never CUDA), so each packed test body, forked from its worker, starts as fast as
a plain test. Runs it with plain ``pytest`` and with ``pytest -n W --accelplat-pack`` and prints
both wall-clock times and the ratio; ``--learn`` also runs an unmarked copy twice under
``--accelplat-pack`` with a fresh footprint store (first run: nothing known, each test alone on
the device and measured; second run: packed by what was learned).

    python benchmarks/pack_pytest.py [--tests 24] [--gib 6] [--workers 8] [--learn] [--json F]
    python benchmarks/pack_pytest.py --simulated      # no GPU, no torch: the plumbing only

``--simulated`` runs the same suite on a simulated device with sleeps for GPU work: it checks
that the commands work; its ratio is a figure of sleeps, not of a GPU. Without torch (and
without ``--simulated``) the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

TEST_MODULE = """
import os, time
import pytest

SHAPES = {shapes!r}
ITERATIONS_PER_S = {rate!r}
SIMULATED = {simulated!r}


def run(gib, gpu_s, host_s):
    time.sleep(host_s / 2)
    if SIMULATED:
        time.sleep(gpu_s)
    else:
        import torch

        block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
        for i in range(round(gpu_s * ITERATIONS_PER_S)):
            a @ a
            if i % 8 == 7:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        del block, a
    time.sleep(host_s / 2)


@pytest.mark.parametrize("gib,gpu_s,host_s", SHAPES)
{marker}def test_engine(gib, gpu_s, host_s):
    run(gib, gpu_s, host_s)
"""

CONFTEST = """
import importlib.util
if importlib.util.find_spec("torch") is not None:
    import torch  # imported once per process, CUDA untouched: forked bodies start fast
"""


def shapes(tests: int, gib: float, gpu_s: float, host_s: float) -> list[tuple[float, float, float]]:
    """Tests of three sizes around ``gib``, GPU and host times around the given ones."""
    sizes = (0.5, 1.0, 1.5)
    return [
        (gib * sizes[i % 3], gpu_s * sizes[(i + 1) % 3], host_s * sizes[(i + 2) % 3])
        for i in range(tests)
    ]


def write_suite(
    where: Path,
    rows: list[tuple[float, float, float]],
    rate: float,
    *,
    simulated: bool,
    marked: bool,
) -> Path:
    """Write the generated suite into ``where``; return the test module's path."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "conftest.py").write_text(CONFTEST)
    budget = max(g for g, _, _ in rows) + 2  # the largest test's tensors, a context and headroom
    marker = f'@pytest.mark.accelplat_requires(device_memory="{budget:g}GiB")\n' if marked else ""
    module = where / "test_generated.py"
    text = TEST_MODULE.format(shapes=rows, rate=rate, simulated=simulated, marker=marker)
    module.write_text(textwrap.dedent(text))
    return module


def pytest_run(
    where: Path, env: dict[str, str], *options: str
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run pytest in ``where``; the wall-clock seconds and the completed process."""
    plugin = any(ep.name == "accelplat" for ep in importlib.metadata.entry_points(group="pytest11"))
    load = [] if plugin else ["-p", "accelplat.pytest_plugin"]  # an uninstalled checkout
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *load, *options]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - start, done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--simulated", action="store_true", help="no GPU: sleeps on a simulated device"
    )
    parser.add_argument("--tests", type=int, default=24)
    parser.add_argument("--gib", type=float, default=6.0, help="middle tensor size per test (GiB)")
    parser.add_argument("--gpu-seconds", type=float, default=1.5, help="middle GPU work alone (s)")
    parser.add_argument("--host-seconds", type=float, default=2.5, help="middle host time (s)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--learn", action="store_true", help="also the learned-footprint flow")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)
    for needed in ("xdist",) + (() if args.simulated else ("torch",)):
        if importlib.util.find_spec(needed) is None:
            print(f"SKIPPED: pack_pytest needs {needed} (try --simulated for the plumbing only)")
            return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    rows = shapes(args.tests, args.gib, args.gpu_seconds, args.host_seconds)
    with tempfile.TemporaryDirectory() as tmp:
        rate = 0.0
        if args.simulated:
            spec = Path(tmp, "spec.json")
            spec.write_text(json.dumps({"devices": [{"total": "140GiB"}], "clock": "real"}))
            env.update({"ACCELPLAT_PLATFORM": "simulated", "ACCELPLAT_SIMULATED_SPEC": str(spec)})
        else:
            from packed_suite import calibrate

            rate = calibrate()
            print(f"calibrated: {rate:.1f} matmuls/s on an idle GPU", flush=True)
        env["ACCELPLAT_LEASE_DIR"] = str(Path(tmp, "locks"))
        suite = write_suite(Path(tmp, "marked"), rows, rate, simulated=args.simulated, marked=True)
        figures: dict[str, object] = {
            "kind": "SIMULATED (sleeps, not a GPU)" if args.simulated else "REAL",
            "tests": args.tests,
            "workers": args.workers,
        }
        runs = [
            ("plain", suite.parent, ()),
            ("packed", suite.parent, ("-n", str(args.workers), "--accelplat-pack")),
        ]
        if args.learn:
            unmarked = write_suite(
                Path(tmp, "unmarked"), rows, rate, simulated=args.simulated, marked=False
            )
            store = ("--accelplat-footprints", str(Path(tmp, "footprints.json")))
            packed = ("-n", str(args.workers), "--accelplat-pack", *store)
            runs += [("learning", unmarked.parent, packed), ("learned", unmarked.parent, packed)]
        for name, where, options in runs:
            seconds, done = pytest_run(where, env, *options)
            tail = done.stdout.strip().splitlines()[-1:] or [done.stderr.strip()[-300:]]
            print(f"{name:9s} {seconds:7.1f} s  exit {done.returncode}  {tail[0]}", flush=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
            figures[f"{name}_s"] = seconds
            figures[f"{name}_exit"] = done.returncode
    took = {k: v for k, v in figures.items() if isinstance(v, float)}
    figures["ratio"] = took["plain_s"] / took["packed_s"]
    said = [
        f"{figures['kind']}: plain pytest {took['plain_s']:.1f} s",
        f"pytest -n {args.workers} --accelplat-pack {took['packed_s']:.1f} s "
        f"({figures['ratio']:.2f}x shorter)",
    ]
    if args.learn:
        said.append(f"unmarked, learning {took['learning_s']:.1f} s")
        said.append(f"learned {took['learned_s']:.1f} s")
    print("; ".join(said))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
