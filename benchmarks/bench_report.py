"""Time ``accelplat report`` on a large synthetic trace, and show how it scales.

Builds a trace of ``--samples`` samples and ``--tests`` tests on ``--devices`` devices (a test
every few hundred samples, each with a body start; a memory wait in every fourth test; every
tenth test leaves memory held), saves it as JSON, then times, in one process:

* loading the trace (``load_trace``: read, parse, validate);
* rendering the HTML report (``render_html``);
* the whole command, ``accelplat report TRACE --out REPORT.html``, in a fresh interpreter.

It repeats the in-process timings with half the samples and tests, so the ratio (about 2 for
linear work, 4 for quadratic) is measured side by side in one run.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_report.py [--samples 100000] [--tests 1000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accelplat._types import GIB, MIB
from accelplat.timeline._render import render_html
from accelplat.timeline._trace import (
    DeviceTrack,
    Sample,
    TestSpan,
    Trace,
    WaitSpan,
    load_trace,
    save_trace,
)


def build(samples: int, tests: int, devices: int, hz: float = 20.0) -> Trace:
    """A recording at ``hz`` with ``tests`` back-to-back tests over ``samples`` samples."""
    dt = 1.0 / hz
    total = 80 * GIB
    tracks = tuple(DeviceTrack(i, f"GPU {i}", total) for i in range(devices))
    per_test = samples / tests
    held = [0] * devices
    rows: list[Sample] = []
    spans: list[TestSpan] = []
    waits: list[WaitSpan] = []
    for k in range(tests):
        lo, hi = int(k * per_test), int((k + 1) * per_test)
        start, end = lo * dt, max(lo + 1, hi - 1) * dt
        before = tuple(held)
        for i in range(lo, hi):
            phase = (i - lo) / max(1, hi - lo)
            busy = int(20 * GIB * (phase * (1 - phase)) * 4)
            rows.append(Sample(i * dt, tuple(h + busy + d * MIB for d, h in enumerate(held))))
        if k % 10 == 9:
            held = [h + 256 * MIB for h in held]  # this test leaves memory behind
        spans.append(
            TestSpan(
                nodeid=f"tests/test_model.py::test_case[{k}]",
                start=start,
                end=end,
                used_before=before,
                used_after=tuple(held),
                outcome="failed" if k % 37 == 0 else "passed",
                body_start=start + dt,
            )
        )
        if k % 4 == 0:
            waits.append(WaitSpan(start, start + dt, "settle", tuple(range(devices)), k % 8 != 0))
    return Trace(
        devices=tracks,
        samples=tuple(rows),
        tests=tuple(spans),
        waits=tuple(waits),
        platform="cuda",
        started_at=1_700_000_000.0,
        duration=samples * dt,
        sample_hz=hz,
    )


def _time(fn: object, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--tests", type=int, default=1_000)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for scale in (0.5, 1.0):
            n, t = int(ns.samples * scale), int(ns.tests * scale)
            trace = build(n, t, ns.devices)
            path = save_trace(trace, Path(tmp) / f"trace-{n}.json")
            loaded = load_trace(path)
            load_s = _time(lambda p=path: load_trace(p), ns.repeats)
            render_s = _time(lambda tr=loaded: render_html(tr), ns.repeats)
            rows.append((n, t, os.path.getsize(path), load_s, render_s))
            print(
                f"{n:>8} samples {t:>6} tests ({os.path.getsize(path) / 1e6:6.1f} MB): "
                f"load {load_s:6.3f} s, render {render_s:6.3f} s (best of {ns.repeats})"
            )
        (_, _, _, l_half, r_half), (_, _, _, l_full, r_full) = rows
        print(f"doubling the trace: load x{l_full / l_half:.2f}, render x{r_full / r_half:.2f}")
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
        )
        out = Path(tmp) / "report.html"
        cmd = [sys.executable, "-m", "accelplat", "report", str(path), "--out", str(out)]
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        whole = time.perf_counter() - started
        print(
            f"`accelplat report` on the {ns.samples}-sample, {ns.tests}-test trace: {whole:.2f} s "
            f"wall (exit {done.returncode}, page {out.stat().st_size / 1e6:.1f} MB)"
            if out.exists()
            else f"`accelplat report` failed (exit {done.returncode}): {done.stderr[-500:]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
