"""``--accelplat-pack``: xdist workers share devices within per-test memory budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_SPEC, ENV_VISIBLE
from accelplat._leasing import ENV_LEASE_DIR, ENV_MEMORY_BYTES
from accelplat._types import GIB, MIB
from accelplat.timeline._footprints import budget_for

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[2]

TESTS = (
    textwrap.dedent(
        """
    import json, os, time
    import pytest

    def log(name):
        start = time.time()
        time.sleep(0.4)
        row = {"test": name, "visible": os.environ.get("VISIBLE"), "start": start,
               "end": time.time(), "budget": os.environ.get("BUDGET"), "pid": os.getpid()}
        with open(os.environ["PACK_LOG"], "a") as fh:
            fh.write(json.dumps(row) + "\\n")

    @pytest.mark.parametrize("i", range(6))
    @pytest.mark.accelplat_requires(device_memory="20GiB")
    def test_small(i):
        log(f"small{i}")

    @pytest.mark.accelplat_requires(device_memory="50GiB")
    def test_large():
        log("large")

    def test_whole():
        log("whole")
    """
    )
    .replace("VISIBLE", ENV_VISIBLE)
    .replace("BUDGET", ENV_MEMORY_BYTES)
)


def run(
    tmp_path: Path, *options: str, spec: dict[str, Any] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    (tmp_path / "test_pack_demo.py").write_text(TESTS)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec or {"devices": [{"total": "80GiB"}]}))
    log = tmp_path / "log.jsonl"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(
        {
            "ACCELPLAT_PLATFORM": "simulated",
            ENV_SPEC: str(spec_path),
            ENV_LEASE_DIR: str(tmp_path / "locks"),
            "PACK_LOG": str(log),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.pop(ENV_VISIBLE, None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *options],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, rows


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["start"] < b["end"] and b["start"] < a["end"])


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Any]]:
    # four workers, one 80 GiB device: more workers than devices is the normal case
    return run(tmp_path_factory.mktemp("pack"), "-n", "4", "--accelplat-pack")


def test_more_workers_than_devices_share_the_device_within_budgets(
    packed: tuple[Any, list[Any]],
) -> None:
    done, rows = packed
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(r["test"] for r in rows) == sorted(
        [f"small{i}" for i in range(6)] + ["large", "whole"]
    )
    assert {r["visible"] for r in rows} == {"SIM-0"}
    budget = {r["test"]: int(r["budget"]) if r["budget"] else 80 * GIB for r in rows}
    assert budget["small0"] == 20 * GIB
    assert budget["large"] == 50 * GIB
    assert budget["whole"] == 80 * GIB  # no budget: the whole device
    # at every start, the budgets of the tests running then fit in the device
    for row in rows:
        running = [r for r in rows if r["start"] <= row["start"] < r["end"]]
        assert sum(budget[r["test"]] for r in running) <= 80 * GIB, running
    smalls = [r for r in rows if r["test"].startswith("small")]
    assert any(_overlap(a, b) for a in smalls for b in smalls if a is not b)  # packed
    whole = next(r for r in rows if r["test"] == "whole")
    assert not any(_overlap(whole, r) for r in rows if r is not whole)


def test_each_body_ran_in_a_new_process(packed: tuple[Any, list[Any]]) -> None:
    _, rows = packed
    assert len({r["pid"] for r in rows}) == len(rows)


def test_a_test_over_its_budget_is_named_with_its_peak(tmp_path: Path) -> None:
    # the driver says a child of the worker holds 30 GiB throughout: every test measures 30 GiB
    spec = {
        "devices": [{"total": "80GiB", "holders": [{"used": "30GiB", "pid": 1, "state": "child"}]}]
    }
    done, _ = run(tmp_path, "-n", "2", "--accelplat-pack", "-k", "small or large", spec=spec)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests over their memory budget" in done.stdout
    line = "test_pack_demo.py::test_small[0]: peak 30.00 GiB, budget 20.00 GiB"
    assert line in done.stdout
    assert "test_large" not in done.stdout.split("over their memory budget")[1]


def test_footprints_recorded_by_a_timeline_become_budgets(tmp_path: Path) -> None:
    store = tmp_path / "footprints.json"
    done, _ = run(
        tmp_path,
        "--accelplat-timeline",
        "t.html",
        "--accelplat-footprints",
        str(store),
        "-k",
        "whole",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tests = json.loads(store.read_text())["tests"]
    assert tests == {"test_pack_demo.py::test_whole": {"peak_bytes": 0}}
    done, rows = run(
        tmp_path, "--accelplat-pack", "--accelplat-footprints", str(store), "-k", "whole"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (whole,) = rows
    assert int(whole["budget"]) == budget_for(0) == 256 * MIB


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "footprints top level: expected an object"),
        ('{"format": "accelplat.footprints", "tests": {"a": {"peak_bytes": -1}}}', "peak_bytes"),
        ("not json", "not JSON text"),
    ],
)
def test_a_bad_footprint_store_is_a_usage_error(tmp_path: Path, content: str, message: str) -> None:
    store = tmp_path / "footprints.json"
    store.write_text(content)
    done, rows = run(tmp_path, "--accelplat-pack", "--accelplat-footprints", str(store))
    assert done.returncode == 4, done.stdout + done.stderr
    assert message in done.stderr
    assert rows == []


def test_pack_and_per_process_leases_are_exclusive(tmp_path: Path) -> None:
    done, _ = run(tmp_path, "--accelplat-pack", "--accelplat-lease")
    assert done.returncode == 4
    assert "give one" in done.stderr


def test_the_peak_counts_only_this_process_and_its_children() -> None:
    from accelplat._types import HolderState, MemoryHolder
    from accelplat.pytest_plugin._pack import PeakMonitor

    readings = iter(
        [
            [
                MemoryHolder(1, 4 * GIB, HolderState.CHILD),
                MemoryHolder(2, 50 * GIB, HolderState.ALIVE),
            ],
            [MemoryHolder(1, 9 * GIB, HolderState.CHILD), MemoryHolder(3, GIB, HolderState.SELF)],
            [MemoryHolder(1, 2 * GIB, HolderState.ZOMBIE)],
        ]
    )
    monitor = PeakMonitor(lambda device: next(readings), [0])
    for _ in range(3):
        monitor.sample()
    assert monitor.peak == 10 * GIB  # 9 GiB of a child and 1 GiB of its own; others never
    silent = PeakMonitor(lambda device: None, [0])
    silent.sample()
    assert silent.peak is None  # a driver that cannot tell: no figure, no report
