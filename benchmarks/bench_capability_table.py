"""The project capability table's cost per entry, at growing sizes: it must stay linear.

Writes a ``pyproject.toml`` of N entries (every other one requiring the one before it), then
times, each in a fresh interpreter, loading it (``load_pyproject``: every shape checked, every
``requires`` parsed, the order of needs found) and deciding the whole table on the CPU platform
(``capabilities()``). Prints seconds and microseconds per entry; per entry, the larger table
must cost about what the smaller one does (10,000 entries: about a second to load).

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/bench_capability_table.py [--sizes 1000 10000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
from accelplat import _capabilities as caps
from accelplat._backends.cpu import CpuPlatform
start = time.perf_counter()
caps.load_pyproject(sys.argv[1])
loaded = time.perf_counter()
caps.capabilities(platform=CpuPlatform())
print(json.dumps([loaded - start, time.perf_counter() - loaded]))
"""


def table(n: int) -> str:
    """A capability table of ``n`` entries, every other one requiring the one before it."""
    lines = ["[tool.accelplat.capabilities]"]
    for i in range(n):
        requires = f', requires = ["cap-{i - 1}"]' if i % 2 else ""
        lines.append(f'cap-{i} = {{ platforms = ["cuda"], arch = ["sm_80+"]{requires} }}')
    return "\n".join(lines) + "\n"


def measure(n: int) -> tuple[float, float]:
    """Seconds to load and to decide a table of ``n`` entries, in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pyproject.toml"
        path.write_text(table(n))
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(path)],
            capture_output=True, text=True, check=True, cwd=REPO,
            env={"PYTHONPATH": str(REPO), "ACCELPLAT_PLATFORM": "cpu"},
        )  # fmt: skip
    load, decide = json.loads(done.stdout)
    return load, decide


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args(argv)
    print(f"{'entries':>8} {'load':>9} {'decide':>9} {'load/entry':>12} {'decide/entry':>13}")
    per_entry = []
    for n in args.sizes:
        load, decide = measure(n)
        per_entry.append((load + decide) / n)
        print(
            f"{n:>8} {load:8.2f}s {decide:8.2f}s {load / n * 1e6:10.1f}µs "
            f"{decide / n * 1e6:11.1f}µs"
        )
    print(f"per entry, largest / smallest: {per_entry[-1] / per_entry[0]:.2f}x (linear: ~1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
