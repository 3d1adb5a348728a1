"""accelplat.testing._isolation: a function run in a new process, its outcome brought back."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from accelplat import _registry as registry
from accelplat._backends.simulated import SimulatedClock, SimulatedPlatform
from accelplat.errors import ConfigurationError
from accelplat.testing import _isolation as isolation

_STATE: dict[str, str] = {"set_in": "import"}


def _platform(method: str) -> None:
    spec = {"devices": [{"total": "1GiB"}], "preferred_start_method": method}
    registry.set_current_platform(SimulatedPlatform.from_spec(spec, clock=SimulatedClock()))


def _write_pid(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


def _fail_with_assertion() -> None:
    value = 41
    assert value == 42, "the child saw 41"


def _skip_in_child() -> None:
    pytest.skip("nothing to do here")


def _exit_hard() -> None:
    os._exit(3)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("no pickling")


def _raise_unpicklable() -> None:
    raise _Unpicklable("custom failure text")


def _record_state(path: str) -> None:
    Path(path).write_text(_STATE["set_in"])


def _record_env(path: str) -> None:
    Path(path).write_text(f"{os.environ.get('LEASED', '-')} {os.environ.get('DROPPED', '-')}")


def _leave_a_grandchild(path: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(path).write_text(str(proc.pid))


def test_start_method_comes_from_the_platform() -> None:
    _platform("spawn")
    assert isolation.run_child(_write_pid, (os.devnull,)).method == "spawn"


def test_fork_runs_the_function_in_another_process(tmp_path: Path) -> None:
    out = tmp_path / "pid"
    isolation.run_in_new_process(_write_pid, (str(out),), method="fork")
    assert int(out.read_text()) not in (os.getpid(), 0)


def test_run_child_reports_what_happened_as_data() -> None:
    ok = isolation.run_child(_write_pid, (os.devnull,), method="fork")
    assert (ok.status, ok.exitcode) == ("ok", 0)
    failed = isolation.run_child(_fail_with_assertion, method="fork")
    assert (failed.status, failed.exitcode) == ("error", 1)
    assert isinstance(failed.exception, AssertionError)
    assert failed.exception_type == "AssertionError"
    assert "_fail_with_assertion" in failed.traceback
    skipped = isolation.run_child(_skip_in_child, method="fork")
    assert skipped.status == "outcome"
    assert skipped.outcome is not None
    assert skipped.outcome[:2] == ("skip", "nothing to do here")
    silent = isolation.run_child(_exit_hard, method="fork")
    assert (silent.status, silent.exitcode) == ("silent", 3)
    assert silent.describe_exit() == "exited with code 3"


def test_a_child_failure_comes_back_as_the_same_exception_with_the_child_traceback() -> None:
    with pytest.raises(AssertionError, match="the child saw 41") as info:
        isolation.run_in_new_process(_fail_with_assertion, method="fork")
    cause = info.value.__cause__
    assert isinstance(cause, isolation.ChildTracebackError)
    assert "_fail_with_assertion" in str(cause)
    assert "Traceback in the child process" in str(cause)


def test_a_skip_in_the_child_skips_the_test() -> None:
    with pytest.raises(pytest.skip.Exception, match="nothing to do here"):
        isolation.run_in_new_process(_skip_in_child, method="fork")


def test_pytest_fail_and_xfail_in_the_child_come_back_as_such() -> None:
    with pytest.raises(pytest.fail.Exception, match="explicit failure"):
        isolation.run_in_new_process(pytest.fail, ("explicit failure",), method="fork")
    with pytest.raises(pytest.xfail.Exception, match="known bug"):
        isolation.run_in_new_process(pytest.xfail, ("known bug",), method="fork")


def test_a_child_that_exits_without_reporting_is_a_failure() -> None:
    with pytest.raises(isolation.ChildTestError, match="exited with code 3 without reporting"):
        isolation.run_in_new_process(_exit_hard, method="fork")
    with pytest.raises(isolation.ChildTestError, match="killed by SIGKILL"):
        isolation.run_in_new_process(_kill_self, method="fork")


def test_an_exception_that_cannot_be_pickled_is_reported_by_name_and_text() -> None:
    with pytest.raises(isolation.ChildTestError, match="_Unpicklable: custom failure text") as info:
        isolation.run_in_new_process(_raise_unpicklable, method="fork")
    assert "_raise_unpicklable" in str(info.value.__cause__)


def test_what_the_child_leaves_running_is_terminated(tmp_path: Path) -> None:
    out = tmp_path / "grandchild"
    isolation.run_in_new_process(_leave_a_grandchild, (str(out),), method="fork")
    pid = int(out.read_text())
    deadline = time.monotonic() + 60  # only reached if it is never terminated
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the grandchild was still running after the child exited")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_env_is_set_in_the_child_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: Any
) -> None:
    monkeypatch.setenv("DROPPED", "parent")
    monkeypatch.delenv("LEASED", raising=False)
    out = tmp_path / "env"
    env = {"LEASED": "0,1", "DROPPED": None}
    isolation.run_in_new_process(_record_env, (str(out),), method=method, env=env)
    assert out.read_text() == "0,1 -"
    assert os.environ["DROPPED"] == "parent"
    assert "LEASED" not in os.environ
    with pytest.raises(ConfigurationError, match="env"):
        isolation.run_child(_record_env, (str(out),), env={"A=B": "x"})
    with pytest.raises(ConfigurationError, match="env"):
        isolation.run_child(_record_env, (str(out),), env={"A": 1})  # type: ignore[dict-item]


def test_spawn_imports_the_function_afresh_and_reports_failures(tmp_path: Path) -> None:
    _STATE["set_in"] = "parent"
    try:
        out = tmp_path / "state"
        isolation.run_in_new_process(_record_state, (str(out),), method="fork")
        assert out.read_text() == "parent"
        isolation.run_in_new_process(_record_state, (str(out),), method="spawn")
        assert out.read_text() == "import"  # a fresh interpreter imported the module
        with pytest.raises(AssertionError, match="the child saw 41"):
            isolation.run_in_new_process(_fail_with_assertion, method="spawn")
    finally:
        _STATE["set_in"] = "import"


def test_spawn_explains_what_it_cannot_do() -> None:
    def local() -> None:
        pass

    class NoPickle:
        def __reduce__(self) -> Any:
            raise TypeError("never")

    with pytest.raises(ConfigurationError, match="module or class level"):
        isolation.run_in_new_process(local, method="spawn")
    with pytest.raises(ConfigurationError, match="picklable"):
        isolation.run_in_new_process(_write_pid, (NoPickle(),), method="spawn")
    with pytest.raises(ConfigurationError, match="method"):
        isolation.run_in_new_process(_write_pid, ("x",), method="thread")  # type: ignore[arg-type]


def test_isolate_defaults_to_the_platform_start_method_at_call_time(tmp_path: Path) -> None:
    isolated = isolation.isolate()(_record_state)
    _STATE["set_in"] = "parent"
    try:
        _platform("fork")
        isolated(str(tmp_path / "a"))
        _platform("spawn")
        isolated(str(tmp_path / "b"))
    finally:
        _STATE["set_in"] = "import"
    assert (tmp_path / "a").read_text() == "parent"
    assert (tmp_path / "b").read_text() == "import"


def test_isolate_keeps_the_signature_for_fixture_injection() -> None:
    def test_something(tmp_path: Path, accel_platform: object) -> None:
        pass

    wrapped = isolation.isolate("fork")(test_something)
    assert list(inspect.signature(wrapped).parameters) == ["tmp_path", "accel_platform"]
    assert wrapped.__name__ == "test_something"
    with pytest.raises(ConfigurationError, match="method"):
        isolation.isolate("thread")  # type: ignore[arg-type]


@isolation.isolate("spawn", env={"LEASED": "7"})
def test_a_spawned_test_receives_its_fixtures_and_env(tmp_path: Path) -> None:
    assert multiprocessing.parent_process() is not None  # not the pytest process
    assert tmp_path.is_dir()
    assert os.environ["LEASED"] == "7"


@isolation.isolate("fork")
def test_a_forked_test_runs_outside_the_pytest_process(tmp_path: Path) -> None:
    assert multiprocessing.parent_process() is not None
    assert tmp_path.is_dir()
