"""``--accelplat-pack``: xdist workers share devices within budgets, declared or learned."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_SPEC, ENV_VISIBLE, SimulatedPlatform
from accelplat._enforce import ENV_ENFORCE, MPS_LIMIT, MPS_PIPE
from accelplat._leasing import ENV_LEASE_DIR, ENV_MEMORY_BYTES
from accelplat._types import GIB
from accelplat.pytest_plugin._footprints import budget_for, load_footprints, save_footprints
from tests.fakes.mps import install_mps_control

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[2]

TESTS = textwrap.dedent(
    """
    import json, os, time
    import pytest

    def log(name):
        start = time.time()
        time.sleep(0.4)
        row = {"test": name, "visible": os.environ.get("VISIBLE"), "start": start,
               "end": time.time(), "budget": os.environ.get("BUDGET"), "pid": os.getpid(),
               "limit": os.environ.get("LIMIT"), "pipe": os.environ.get("PIPE")}
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

    @pytest.mark.parametrize("i", range(4))
    def test_unknown(i):
        log(f"unknown{i}")

    @pytest.mark.accelplat_requires(devices=2, device_memory="30GiB")
    def test_two():
        log("two")

    @pytest.mark.accelplat_requires(device_memory="200GiB")
    def test_huge():
        log("huge")

    @pytest.mark.accelplat_requires(device_memory="10GiB")
    def test_greedy():
        # an MPS client (the vendor's behaviour, faked): 30 GiB past a pinned limit fails
        limit = os.environ.get("LIMIT")
        if limit and 30 * 1024 > int(limit.split(",")[0].split("=")[1].rstrip("M")):
            raise RuntimeError("CUDA error: out of memory (the client's pinned memory limit)")
        log("greedy")
    """
)
for name, value in {"VISIBLE": ENV_VISIBLE, "BUDGET": ENV_MEMORY_BYTES, "LIMIT": MPS_LIMIT}.items():
    TESTS = TESTS.replace(f'"{name}"', f'"{value}"')
TESTS = TESTS.replace('"PIPE"', f'"{MPS_PIPE}"')

ONE = {"devices": [{"total": "80GiB"}]}
HELD_30 = {
    "devices": [{"total": "80GiB", "holders": [{"used": "30GiB", "pid": 1, "state": "child"}]}]
}
NOTHING_HELD = {"devices": [{"total": "80GiB", "report_holders": True}]}


def run(
    tmp_path: Path,
    *options: str,
    spec: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    (tmp_path / "test_pack_demo.py").write_text(TESTS)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec or ONE))
    log = tmp_path / "log.jsonl"
    log.unlink(missing_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    for name in (ENV_VISIBLE, ENV_ENFORCE, MPS_PIPE):
        environ.pop(name, None)
    environ.update(
        {
            "ACCELPLAT_PLATFORM": "simulated",
            ENV_SPEC: str(spec_path),
            ENV_LEASE_DIR: str(tmp_path / "locks"),
            "PACK_LOG": str(log),
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *options],
        cwd=tmp_path,
        env=environ,
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
    tmp = tmp_path_factory.mktemp("pack")
    return run(tmp, "-n", "4", "--accelplat-pack", "-k", "small or large or whole")


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
    assert budget["whole"] == 80 * GIB  # nothing known: the whole device
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


def test_a_test_over_its_declared_budget_is_named_with_its_peak(tmp_path: Path) -> None:
    # the driver says a child of the worker holds 30 GiB throughout: every test measures 30 GiB
    options = ("-n", "2", "--accelplat-pack", "-k", "small and 0 or large")
    done, _ = run(tmp_path, *options, spec=HELD_30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests over their memory budget" in done.stdout
    assert "test_pack_demo.py::test_small[0]: peak 30.00 GiB, budget 20.00 GiB" in done.stdout
    assert "test_large" not in done.stdout.split("over their memory budget")[1]


def test_the_suite_learns_footprints_alone_first_then_packed(tmp_path: Path) -> None:
    store = tmp_path / "fp.json"
    options = ("-n", "3", "--accelplat-pack", "--accelplat-footprints", str(store))
    held = [{"used": "30GiB", "pid": 1, "state": "child"}]  # 30 GiB beside 31 GiB budgets
    big = {"devices": [{"total": "120GiB", "holders": held}]}
    done, first = run(tmp_path, *options, "-k", "unknown", spec=big)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {r["budget"] for r in first} == {None}  # nothing known: each alone on the device
    assert not any(_overlap(a, b) for a in first for b in first if a is not b)
    # every worker's figures reach the store, written once by the controller
    learned = load_footprints(store)
    assert learned == {f"test_pack_demo.py::test_unknown[{i}]": (30 * GIB,) for i in range(4)}
    assert "footprints of 4 test(s) in" in done.stdout
    done, second = run(tmp_path, *options, "-k", "unknown", spec=big)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {int(r["budget"]) for r in second} == {budget_for([30 * GIB])}
    assert any(_overlap(a, b) for a in second for b in second if a is not b)  # packed now
    assert load_footprints(store)["test_pack_demo.py::test_unknown[0]"] == (30 * GIB, 30 * GIB)


def test_a_test_that_used_no_device_memory_takes_no_lease(tmp_path: Path) -> None:
    store = tmp_path / "fp.json"
    options = ("--accelplat-pack", "--accelplat-footprints", str(store), "-k", "unknown")
    done, _ = run(tmp_path, *options, spec=NOTHING_HELD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(load_footprints(store).values()) == {(0,)}
    shutil.rmtree(tmp_path / "locks")
    done, rows = run(tmp_path, *options, spec=NOTHING_HELD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {(r["budget"], r["visible"]) for r in rows} == {(None, None)}  # no lease, no view
    assert len({r["pid"] for r in rows}) == 1  # run here, as pytest runs them
    assert not list((tmp_path / "locks").glob("**/*.json"))  # no lease was ever taken


def test_stale_footprints_are_named_and_learned_anew(tmp_path: Path) -> None:
    store = tmp_path / "fp.json"
    too_small, too_large = (
        "test_pack_demo.py::test_unknown[0]",
        "test_pack_demo.py::test_unknown[1]",
    )
    save_footprints(store, {too_small: 2 * GIB, too_large: 31 * GIB})
    save_footprints(store, {too_large: 30 * GIB})
    options = ("--accelplat-pack", "--accelplat-footprints", str(store), "-k", "unknown")
    held = [{"used": "10GiB", "pid": 1, "state": "child"}]
    done, _ = run(tmp_path, *options, spec={"devices": [{"total": "80GiB", "holders": held}]})
    assert done.returncode == 0, done.stdout + done.stderr
    section = done.stdout.split("footprints out of date, updated")[1]
    small = budget_for([2 * GIB]) / GIB
    assert f"{too_small}: peak 10.00 GiB, learned budget {small:.2f} GiB" in section
    assert f"{too_large}: peak 10.00 GiB, learned budget 31.00 GiB" in section  # far under
    learned = load_footprints(store)
    assert learned[too_small] == learned[too_large] == (10 * GIB,)  # older figures dropped


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf"])
def test_a_bad_timeout_is_a_usage_error_not_a_skip_of_every_test(
    tmp_path: Path, timeout: str
) -> None:
    done, rows = run(tmp_path, "--accelplat-pack", f"--accelplat-lease-timeout={timeout}")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--accelplat-lease-timeout" in done.stderr
    assert rows == []


def test_an_unusable_lock_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    env = {ENV_LEASE_DIR: str(tmp_path / "file")}
    done, rows = run(tmp_path, "--accelplat-pack", "-k", "small", env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"--accelplat-pack: lease lock directory {tmp_path / 'file'}" in done.stderr
    assert rows == []


def test_a_budget_no_device_can_hold_skips_at_the_tests_line(tmp_path: Path) -> None:
    store = tmp_path / "fp.json"
    save_footprints(store, {"test_pack_demo.py::test_unknown[0]": 100 * GIB})
    options = ("--accelplat-pack", "--accelplat-footprints", str(store))
    done, rows = run(tmp_path, *options, "-k", "unknown or huge")
    assert done.returncode == 0, done.stdout + done.stderr
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 2, done.stdout
    assert all("test_pack_demo.py:" in line and "_pack.py" not in line for line in skips)
    assert any("footprint" in line and "100" not in line.split(":")[0] for line in skips)
    assert sorted(r["test"] for r in rows) == [f"unknown{i}" for i in range(1, 4)]


def test_a_budget_on_two_devices_is_on_each_of_them(tmp_path: Path) -> None:
    spec = {"devices": [{"total": "40GiB", "count": 2}]}
    done, rows = run(tmp_path, "--accelplat-pack", "-k", "two", spec=spec)
    assert done.returncode == 0, done.stdout + done.stderr
    (two,) = rows
    assert sorted(two["visible"].split(",")) == ["SIM-0", "SIM-1"]
    assert int(two["budget"]) == 30 * GIB  # on each: never charged to one device


def test_the_header_names_pack_and_its_enforcement(tmp_path: Path) -> None:
    done, _ = run(tmp_path, "--accelplat-pack", "-k", "whole", "-v", env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("accelplat "))
    assert "; on: pack (budgets promised, not enforced (MPS: no nvidia-cuda-mps-control" in header


@pytest.fixture
def mps_control(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    install_mps_control(bin_dir)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return {"PATH": path, "MPS_FAKE_LOG": str(tmp_path / "mps.log")}


def test_mps_started_for_the_run_holds_each_test_to_its_budget(
    tmp_path: Path, mps_control: dict[str, str]
) -> None:
    env = {**mps_control, ENV_ENFORCE: "mps"}
    done, rows = run(
        tmp_path, "-n", "2", "--accelplat-pack", "-k", "small or greedy", "-v", env=env
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "budgets enforced by MPS per-client memory limits (a control daemon started" in done.stdout
    )
    smalls = [r for r in rows if r["test"].startswith("small")]
    assert len(smalls) == 6
    assert {r["limit"] for r in smalls} == {f"0={20 * 1024}M"}
    (pipe,) = {r["pipe"] for r in smalls}
    assert not Path(pipe).exists()  # the run's directories went with the daemon
    said = Path(mps_control["MPS_FAKE_LOG"]).read_text().splitlines()
    assert (said[0], said[-1]) == (f"-d {pipe}", f"quit {pipe}")
    # the test past its budget failed alone, its budget and peak named
    assert " test_greedy _" in done.stdout  # the failure shown is its own
    assert "1 failed, 6 passed" in done.stdout
    section = done.stdout.split("accelplat budget")[1]
    assert "10.00 GiB (accelplat_requires(device_memory=))" in section
    assert "enforced by MPS" in section
    assert "its processes held" in section


def test_a_running_mps_daemon_is_used_not_started(
    tmp_path: Path, mps_control: dict[str, str]
) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "nvidia-cuda-mps-control.pid").write_text("1")
    env = {**mps_control, MPS_PIPE: str(pipe)}
    done, rows = run(tmp_path, "--accelplat-pack", "-k", "small", "-v", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"MPS per-client memory limits (the control daemon of {pipe})" in done.stdout
    assert {r["limit"] for r in rows} == {f"0={20 * 1024}M"}
    said = Path(mps_control["MPS_FAKE_LOG"]).read_text()
    assert ("-d" in said, "quit" in said) == (False, False)  # not ours to start or stop
    assert (pipe / "nvidia-cuda-mps-control.pid").exists()


def test_minus_n_auto_counts_devices_and_learned_budgets(tmp_path: Path) -> None:
    store = tmp_path / "fp.json"
    options = ("-n", "auto", "--accelplat-pack", "--accelplat-footprints", str(store), "-v")
    done, _ = run(tmp_path, *options, "-k", "whole")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "-n auto: 1 workers (1 device(s), no learned budgets" in done.stdout
    save_footprints(store, {"a": 30 * GIB, "b": 20 * GIB, "c": 30 * GIB})  # median 31 GiB
    done, _ = run(tmp_path, *options, "-k", "whole")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "-n auto: 2 workers (1 device(s), median learned budget 31.00 GiB" in done.stdout


def test_pack_and_per_process_leases_are_exclusive(tmp_path: Path) -> None:
    done, _ = run(tmp_path, "--accelplat-pack", "--accelplat-lease")
    assert done.returncode == 4
    assert "give one" in done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "footprints top level: expected an object"),
        ('{"format": "accelplat.footprints", "tests": {"a": {"peaks": [-1]}}}', "peaks"),
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
    assert store.read_text() == content  # never overwritten


def test_the_peak_is_ours_by_the_one_rule() -> None:
    from accelplat.pytest_plugin._pack import PeakMonitor

    holders = [
        {"used": "4GiB", "pid": 11, "state": "child"},
        {"used": "50GiB", "pid": 12, "state": "alive"},
        {"used": "1GiB", "pid": 13, "state": "self"},
    ]
    platform = SimulatedPlatform({"devices": [{"total": "80GiB", "holders": holders}]})
    assert (
        PeakMonitor([(platform, 0)], whole=False).finish() == 5 * GIB
    )  # this process and its child, never another process
    silent = SimulatedPlatform({"devices": [{"total": "80GiB", "used": "9GiB"}]})
    assert PeakMonitor([(silent, 0)], whole=False).finish() is None  # cannot tell: no figure
    assert PeakMonitor([(silent, 0)], whole=True).finish() == 0  # alone: its growth, none
