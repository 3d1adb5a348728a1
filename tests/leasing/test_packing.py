"""Packing a suite by memory on the simulated platform with a virtual clock (the scheduler of
``benchmarks/packed_suite.py``): budgets never over-committed, no starvation, the figures."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from accelplat._types import GIB

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    path = ROOT / "benchmarks" / "packed_suite.py"
    spec = importlib.util.spec_from_file_location("packed_suite", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["packed_suite"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


def _max_committed(result: Any, key: str) -> float:
    """The largest sum of ``key`` (bytes) over tests running at one moment, per device."""
    worst = 0.0
    for o in result.outcomes:
        running = [
            p for p in result.outcomes if p.device == o.device and p.start <= o.start < p.end
        ]
        worst = max(worst, sum(getattr(p, key) or 0 for p in running))
    return worst


@pytest.fixture(scope="module")
def rounds() -> dict[str, Any]:
    return {
        "sequential": bench.simulated_round(bench.SUITE, packed=False, workers=8),
        "packed": bench.simulated_round(bench.SUITE, packed=True, workers=8),
    }


def test_the_suite_has_the_shapes_the_benchmark_promises() -> None:
    suite = bench.SUITE
    assert len(suite) >= 24
    assert all(4 <= s.alloc_gib <= 40 for s in suite)
    assert all(3 <= s.alone_s <= 10 for s in suite)
    assert sum(s.busy_s >= 1.5 for s in suite) >= len(suite) / 2
    assert any(s.child for s in suite)


def test_sequential_runs_one_test_at_a_time_in_order(rounds: dict[str, Any]) -> None:
    result = rounds["sequential"]
    assert result.order == [s.name for s in bench.SUITE]
    spans = sorted((o.start, o.end) for o in result.outcomes)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # each test waited for the previous one's memory to come back (the process exit)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    assert min(gaps) >= bench.EXIT_S - 1e-9


def test_packed_never_commits_more_than_the_device_and_is_three_times_faster(
    rounds: dict[str, Any],
) -> None:
    packed, sequential = rounds["packed"], rounds["sequential"]
    assert len(packed.outcomes) == len(bench.SUITE)
    assert packed.ooms == 0
    assert packed.over_budget == []
    assert _max_committed(packed, "budget_bytes") <= 140 * GIB
    assert _max_committed(packed, "peak_bytes") > 60 * GIB  # several tests at once
    assert sequential.wall_s / packed.wall_s >= 2.5  # one order; the median of ten: below
    assert packed.memory_utilisation > 2 * sequential.memory_utilisation
    assert packed.compute_utilisation > 2.5 * sequential.compute_utilisation
    # first come, first served: tests start in the order they were queued
    queued = sorted(
        packed.outcomes,
        key=lambda o: (
            o.queued,
            bench.SUITE.index(next(s for s in bench.SUITE if s.name == o.name)),
        ),
    )
    starts = [o.start for o in queued]
    assert starts == sorted(starts)


def test_a_large_test_is_not_starved_by_a_stream_of_small_ones() -> None:
    Shape = bench.Shape
    first = [Shape(f"hold{i}", 40, 0.0, 4.0) for i in range(3)]  # 3 x 41.5 GiB budgets
    big = Shape("big", 100, 0.0, 3.0)  # 101.5 GiB: must wait until the three are gone
    stream = [Shape(f"small{i}", 4, 0.0, 3.0 + i % 3) for i in range(30)]
    result = bench.simulated_round([*first, big, *stream], packed=True, workers=6)
    by_name = {o.name: o for o in result.outcomes}
    holders_end = max(by_name[s.name].end for s in first)
    assert by_name["big"].start <= holders_end + 1.0  # the first moment there is room
    # smalls queued behind it ran beside it, within its room, not before it
    assert all(by_name[s.name].start >= by_name["big"].start for s in stream)
    assert result.ooms == 0


def test_a_test_that_declares_too_little_is_named_over_budget() -> None:
    Shape = bench.Shape
    suite = [Shape("honest", 8, 1.0, 2.0), Shape("liar", 8, 1.0, 2.0, under_gib=6)]
    result = bench.simulated_round(suite, packed=True, workers=2)
    assert result.over_budget == ["liar"]


def test_the_virtual_clock_never_sleeps_inside_a_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    original = bench.SimulatedClock.sleep
    monkeypatch.setattr(
        bench.SimulatedClock, "sleep", lambda self, s: (slept.append(s), original(self, s))
    )
    bench.simulated_round(bench.SUITE[:6], packed=True, workers=4)
    bench.simulated_round(bench.SUITE[:6], packed=False, workers=4)
    assert slept == []  # every wait was the scheduler's step, on the virtual clock


def test_the_command_prints_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    assert bench.main(["--simulated", "--runs", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SIMULATED (virtual clock)" in printed
    assert "out-of-memory 0; over budget 0" in printed
    import json

    doc = json.loads(out.read_text())
    assert doc["ratio"] >= 3.0  # the target, on the simulated platform
    assert doc["packed"]["runs"] == 3
    for mode in ("sequential", "packed", "learned", "enforced"):
        assert doc[mode]["ooms"] == doc[mode]["over_budget"] == 0
    # learned from the first run (whole devices, measured): at least as fast as declared budgets
    assert doc["learned"]["wall_s_median"] <= doc["packed"]["wall_s_median"]
    # a test over its budget, enforced: it fails alone, every run; its neighbours are untouched
    enforced = doc["misdeclared"]["enforced"]
    assert enforced["neighbours_harmed"] == 0
    assert enforced["misdeclared_failed"] == enforced["ooms"] == 3
    assert "budgets enforced: out-of-memory 3, neighbours harmed 0, it failed in 3" in printed


def test_the_real_test_body_compiles_and_names_its_opt_in() -> None:
    body = bench.REAL_BODY.replace("__BODY__", repr(bench.REAL_BODY))
    compile(body, "packed_suite test body", "exec")
    assert "set_per_process_memory_fraction" in body
    assert "ACCELPLAT_LEASE_MEMORY_FRACTION" in body


def test_the_pytest_benchmark_writes_a_suite_that_compiles(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "pack_pytest", ROOT / "benchmarks" / "pack_pytest.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.shapes(6, 6.0, 1.5, 2.5)
    assert sorted({g for g, _, _ in rows}) == [3.0, 6.0, 9.0]
    marked = module.write_suite(tmp_path / "m", rows, 10.0, simulated=False, marked=True)
    text = marked.read_text()
    compile(text, str(marked), "exec")
    assert 'accelplat_requires(device_memory="11GiB")' in text
    unmarked = module.write_suite(tmp_path / "u", rows, 10.0, simulated=True, marked=False)
    assert "accelplat_requires" not in unmarked.read_text()
