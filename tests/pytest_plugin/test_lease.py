"""``--accelplat-lease`` with pytest-xdist: a device per worker; multi-device tests widened."""

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
from accelplat._leasing import ENV_LEASE_DIR

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = textwrap.dedent(
    """
    import json, os
    with open(os.environ["LEASE_LOG"], "a") as fh:  # what the conftest saw at import
        fh.write(json.dumps({"conftest": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                             "visible": os.environ.get("VISIBLE"), "pid": os.getpid()}) + "\\n")
    """
).replace("VISIBLE", ENV_VISIBLE)

TESTS = textwrap.dedent(
    """
    import json, os, time
    import pytest
    import accelplat

    def log(name):
        row = {"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
               "visible": os.environ.get("VISIBLE"),
               "count": accelplat.current_platform().device_count(), "time": time.time(),
               "pid": os.getpid(), "ppid": os.getppid()}
        with open(os.environ["LEASE_LOG"], "a") as fh:
            fh.write(json.dumps(row) + "\\n")

    @pytest.mark.parametrize("i", range(6))
    def test_single(i):
        log(f"single{i}")
        time.sleep(0.2)

    @pytest.mark.accelplat_requires(devices=2)
    def test_two():
        log("two")

    @pytest.mark.accelplat_requires(devices=5)
    def test_five():
        log("five")
    """
).replace("VISIBLE", ENV_VISIBLE)


def run(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_lease_demo.py").write_text(TESTS)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"total": "80GiB"}] * 3}))
    log = tmp_path / "log.jsonl"
    log.unlink(missing_ok=True)
    # an outer xdist worker's variables would make the inner pytest act as a worker (issue 23)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(
        {
            "ACCELPLAT_PLATFORM": "simulated",
            ENV_SPEC: str(spec),
            ENV_LEASE_DIR: str(tmp_path / "locks"),
            "LEASE_LOG": str(log),
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


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Any]]:
    """One ``pytest -n 2 --accelplat-lease`` run, shared by the tests that inspect it."""
    return run(tmp_path_factory.mktemp("xdist"), "-n", "2", "--accelplat-lease")


def test_each_worker_gets_its_own_device_before_conftests_load(
    two_workers: tuple[Any, list[Any]],
) -> None:
    done, rows = two_workers
    assert done.returncode == 0, done.stdout + done.stderr
    conftests = {r["conftest"]: r["visible"] for r in rows if "conftest" in r}
    assert set(conftests) >= {"gw0", "gw1"}
    assert conftests.get("main") is None  # the controller runs no test and leases nothing
    singles = [r for r in rows if r.get("test", "").startswith("single")]
    assert len(singles) == 6
    by_worker: dict[str, set[str]] = {}
    for row in singles:
        assert row["count"] == 1
        by_worker.setdefault(row["worker"], set()).add(row["visible"])
    for worker, seen in by_worker.items():
        assert len(seen) == 1, f"{worker} moved between devices: {seen}"
        assert seen == {conftests[worker]}  # applied before the conftest was imported
    devices = [next(iter(seen)) for seen in by_worker.values()]
    assert len(set(devices)) == len(devices)  # distinct devices per worker


def test_a_multi_device_test_gets_that_many_for_its_duration(
    two_workers: tuple[Any, list[Any]],
) -> None:
    done, rows = two_workers
    assert done.returncode == 0, done.stdout + done.stderr
    (two,) = [r for r in rows if r.get("test") == "two"]
    worker_pid = {r["conftest"]: r["pid"] for r in rows if "conftest" in r}[two["worker"]]
    assert two["pid"] != worker_pid  # the body ran in a new process
    assert two["ppid"] == worker_pid  # started by the worker
    assert two["count"] == 2
    assert len(set(two["visible"].split(","))) == 2
    assert "needs 5 devices" in done.stdout
    assert "shows this process only 3" in done.stdout
    after = [r for r in rows if r.get("worker") == two["worker"] and r["time"] > two["time"]]
    assert all(r["count"] == 1 for r in after)  # back to one device afterwards


@pytest.mark.parametrize("options", [[], ["-n", "0"], ["--tx", "2*popen"]], ids=str)
def test_without_workers_the_single_process_leases(tmp_path: Path, options: list[str]) -> None:
    done, rows = run(tmp_path, *options, "--accelplat-lease", "--accelplat-lease-count", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    singles = [r for r in rows if r.get("test", "").startswith("single")]
    assert {r["count"] for r in singles} == {2}


def test_nothing_changes_without_the_option(tmp_path: Path) -> None:
    done, rows = run(tmp_path, "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "locks").exists()
    singles = [r for r in rows if r.get("test", "").startswith("single")]
    assert {r["visible"] for r in singles} == {None}
    assert {r["count"] for r in singles} == {3}


def test_asking_for_more_devices_than_visible_is_a_usage_error(tmp_path: Path) -> None:
    done, _ = run(tmp_path, "--accelplat-lease", "--accelplat-lease-count", "4")
    assert done.returncode != 0
    assert "--accelplat-lease: cannot lease 4 device(s)" in done.stdout + done.stderr


def test_isolated_tests_are_recognised_and_left_to_isolate_themselves() -> None:
    from accelplat.testing._isolation import is_isolated, isolate

    def body() -> None:
        pass

    assert not is_isolated(body)
    assert is_isolated(isolate("fork")(body))


@pytest.mark.parametrize(
    ("options", "numbers", "fix"),
    [
        (["-n", "4"], "4 xdist workers x 1 device(s) each", "Use -n auto"),
        (["-n", "2", "--accelplat-lease-count", "2"], "need 4", "Use -n auto"),
        (["--tx", "3*popen", "--tx", "popen", "--dist", "load"], "4 xdist workers", "Use -n auto"),
        (["-n", "1", "--accelplat-lease-count", "4"], "need 4", "Use --accelplat-lease-count 3"),
    ],
    ids=["-n 4", "2 x 2", "--tx", "count > visible"],
)
def test_more_workers_than_devices_fail_the_session_before_any_worker_starts(
    tmp_path: Path, options: list[str], numbers: str, fix: str
) -> None:
    done, rows = run(tmp_path, *options, "--accelplat-lease")
    assert done.returncode == 4, done.stdout + done.stderr  # a usage error
    assert numbers in done.stderr
    assert "shows this process 3" in done.stderr
    assert fix in done.stderr
    assert [r["conftest"] for r in rows] == ["main"]  # refused before any worker started


def test_a_worker_whose_lease_fails_stops_the_session_loudly(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    holder = textwrap.dedent(
        """
        import sys, accelplat
        with accelplat.lease(3, timeout_s=60):
            print("held", flush=True)
            sys.stdin.read()
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"total": "80GiB"}] * 3}))
    env.update({ENV_SPEC: str(spec), ENV_LEASE_DIR: str(locks), "PYTHONPATH": str(ROOT)})
    env.update({"ACCELPLAT_PLATFORM": "simulated"})
    env.pop(ENV_VISIBLE, None)
    other = subprocess.Popen(
        [sys.executable, "-c", holder], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert other.stdout is not None
        assert other.stdout.readline() == b"held\n"
        done, rows = run(tmp_path, "-n", "2", "--accelplat-lease", "--accelplat-lease-timeout=0")
    finally:
        other.communicate(b"", timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode not in (0, 4), output
    assert "--accelplat-lease on gw" in output
    assert "could not lease 1 device(s)" in output
    assert "replacing crashed worker" not in output  # never restarted
    assert not [r for r in rows if "test" in r]  # no test ran


def test_the_ini_option_leases_as_the_command_line_option_does(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naccelplat_lease = true\n")
    done, rows = run(tmp_path, "-k", "single", "-v")  # -v against run's -q: the header shows
    assert done.returncode == 0, done.stdout + done.stderr
    conftests = {r["conftest"]: r["visible"] for r in rows if "conftest" in r}
    assert conftests["main"] is not None  # leased before the conftest was imported
    singles = [r for r in rows if r.get("test", "").startswith("single")]
    assert {r["visible"] for r in singles} == {conftests["main"]}
    assert "; on: lease (1 device per test process)" in done.stdout
