"""accelplat.integrations.vllm: vLLM-compatible memory helpers, runner hooks, process isolation."""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from accelplat import registry
from accelplat._types import GIB
from accelplat.backends.simulated import SimulatedClock, SimulatedPlatform
from accelplat.errors import ConfigurationError, DeviceNotFoundError, MemoryNotSettledError
from accelplat.integrations import vllm as av
from tests.fakes.hostfs import HostFS

# --------------------------------------------------------------------------------------------
# simulated platforms

EAGER = {"lazy": False, "stable_duration_s": 0.0, "settle_timeout_s": 30.0}
LAZY = {"lazy": True, "stable_duration_s": 2.0, "settle_timeout_s": 60.0, "idle_floor": "4GiB"}


def make_platform(
    devices: list[dict[str, Any]],
    *,
    release: Mapping[str, Any] = EAGER,
    **top: Any,
) -> tuple[SimulatedPlatform, SimulatedClock]:
    clock = SimulatedClock()
    spec = {"devices": devices, "release": dict(release), **top}
    platform = SimulatedPlatform.from_spec(spec, clock=clock)
    registry.set_current_platform(platform)
    return platform, clock


def device(total: str = "80GiB", used: str = "0GiB", **extra: Any) -> dict[str, Any]:
    return {"total": total, "used": used, **extra}


# --------------------------------------------------------------------------------------------
# record_gpu_memory_usage_stats


def test_record_stats_returns_used_and_total_gib_per_visible_device() -> None:
    make_platform([device("80GiB", "20GiB"), device("40GiB", "1GiB")])
    assert av.record_gpu_memory_usage_stats(devices=[1, 0]) == {1: (1.0, 40.0), 0: (20.0, 80.0)}


def test_record_stats_rejects_an_invisible_device_as_index_error() -> None:
    make_platform([device()])
    with pytest.raises(DeviceNotFoundError) as info:
        av.record_gpu_memory_usage_stats(devices=[3])
    assert isinstance(info.value, IndexError)


# --------------------------------------------------------------------------------------------
# wait_for_gpu_memory_to_clear


def test_clear_returns_without_sleeping_when_already_free() -> None:
    _, clock = make_platform([device("80GiB", "1GiB")])
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1)
    assert clock.sleeps == []


def test_poll_interval_is_a_cap_of_an_adaptive_poll_not_a_fixed_sleep() -> None:
    _, clock = make_platform([device("80GiB", "60GiB", timeline=[{"at": 3.0, "used": "1GiB"}])])
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, poll_interval_s=0.5)
    assert clock.sleeps[0] < 0.1  # starts fast
    assert max(clock.sleeps) <= 0.5 + 1e-9  # never longer than the cap
    assert 3.0 <= clock.monotonic() <= 3.5  # seen within one cap of the release


def test_timeout_raises_value_error_and_memory_not_settled_in_vllm_shape() -> None:
    stuck = {"stuck": {"used": "30GiB", "pid": 4242, "name": "engine-core", "at": 0}}
    _, clock = make_platform([device("80GiB", "0GiB", timeline=[stuck])])
    with pytest.raises(av.VllmMemoryNotFreeError) as info:
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=2 * GIB, timeout_s=3)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, MemoryNotSettledError)
    first = str(err).splitlines()[0]
    assert first.startswith("Memory of devices devices=[0] not free after dur_s=3.00")
    assert "(threshold='2.0 GiB')" in first
    assert "pid 4242" in str(err)
    assert "'engine-core'" in str(err)
    assert err.targets == {0: 2 * GIB}
    assert err.snapshot.memory[0].used == 30 * GIB
    assert clock.monotonic() == pytest.approx(3.0)


def test_vllm_callers_catching_value_error_still_catch_the_timeout() -> None:
    make_platform([device("80GiB", "70GiB")])
    caught: list[str] = []
    try:
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.5, timeout_s=1)
    except ValueError as exc:
        caught.append(str(exc))
    assert len(caught) == 1
    assert "threshold='0.50'" in caught[0]


def test_with_both_thresholds_the_larger_target_wins() -> None:
    make_platform([device("80GiB", "10GiB")])
    # ratio 0.1 -> 8 GiB; bytes 12 GiB: the device at 10 GiB is clear
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=12 * GIB, threshold_ratio=0.1)
    with pytest.raises(ValueError, match="not free"):
        av.wait_for_gpu_memory_to_clear(
            devices=[0], threshold_bytes=9 * GIB, threshold_ratio=0.1, timeout_s=0
        )


def test_dict_thresholds_must_name_exactly_the_devices() -> None:
    make_platform([device(), device()])
    with pytest.raises(ValueError, match="exactly the devices"):
        av.wait_for_gpu_memory_to_clear(devices=[0, 1], threshold_bytes={0: GIB})
    av.wait_for_gpu_memory_to_clear(devices=[0, 1], threshold_bytes={0: GIB, 1: GIB})


def test_a_threshold_is_required() -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="threshold"):
        av.wait_for_gpu_memory_to_clear(devices=[0])


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5"])
def test_poll_interval_must_be_a_positive_number(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ConfigurationError, match="poll_interval_s"):
        av.wait_for_gpu_memory_to_clear(
            devices=[0],
            threshold_ratio=0.1,
            poll_interval_s=bad,  # type: ignore[arg-type]
        )


def test_idle_floor_comes_from_the_release_profile() -> None:
    # 3 GiB resident at idle on an 80 GiB device; ratio 0.01 asks for 0.8 GiB
    make_platform([device("80GiB", "3GiB")], release=LAZY)
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.01, timeout_s=1)
    make_platform([device("80GiB", "3GiB")], release=EAGER)
    with pytest.raises(ValueError):
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.01, timeout_s=1)


def test_stable_duration_requires_usage_to_stay_within_tolerance() -> None:
    timeline = [
        {"at": 1.0, "used": "1GiB"},
        {"at": 1.5, "used": "3GiB"},  # jumps by 2 GiB: the window restarts
        {"at": 2.0, "used": "1GiB"},
    ]
    _, clock = make_platform([device("80GiB", "20GiB", timeline=timeline)])
    av.wait_for_gpu_memory_to_clear(
        devices=[0],
        threshold_ratio=0.1,
        stable_duration_s=1.0,
        stable_tolerance_bytes=GIB,
        poll_interval_s=0.1,
    )
    assert clock.monotonic() >= 3.0 - 1e-9


def test_progress_goes_to_the_logger_in_vllm_text_at_most_once_per_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    make_platform([device("80GiB", "60GiB", timeline=[{"at": 10.0, "used": "0GiB"}])])
    with caplog.at_level(logging.INFO, logger="accelplat.integrations.vllm"):
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, poll_interval_s=2)
    lines = [r.getMessage() for r in caplog.records]
    progress = [m for m in lines if m.startswith("gpu memory used/total (GiB): ")]
    assert progress[0] == "gpu memory used/total (GiB): 0=60.00/80.00"
    assert len(progress) <= 10 / 2 + 2
    assert any(
        m.startswith("Done waiting for free GPU memory on devices devices=[0]") for m in lines
    )


# --------------------------------------------------------------------------------------------
# wait_for_memory_to_settle


def test_settle_does_nothing_on_an_eager_platform_even_when_full() -> None:
    _, clock = make_platform([device("80GiB", "79GiB")], release=EAGER)
    av.wait_for_memory_to_settle()
    assert clock.sleeps == []


def test_settle_waits_on_every_device_with_the_profile_window_on_a_lazy_platform() -> None:
    lazy_tail = {"lazy": {"start": 0.0, "delay": 1.0, "tau": 0.5, "to": "2GiB"}}
    _, clock = make_platform(
        [device("80GiB", "60GiB", timeline=[lazy_tail]), device("80GiB", "1GiB")], release=LAZY
    )
    av.wait_for_memory_to_settle(threshold_ratio=0.1)
    # 60 GiB -> below 8 GiB once exp(-(t-1)/0.5) * 58 < 6, i.e. t > 2.13; then a 2 s window
    assert clock.monotonic() >= 4.1


def test_settle_timeout_raises_value_error() -> None:
    make_platform([device("80GiB", "60GiB")], release=LAZY)
    with pytest.raises(ValueError, match=r"^Memory of devices devices=\[0\] not free"):
        av.wait_for_memory_to_settle(threshold_ratio=0.1, timeout_s=5)


def test_settle_rejects_a_missing_ratio() -> None:
    make_platform([device()], release=LAZY)
    with pytest.raises(ValueError, match="threshold_ratio"):
        av.wait_for_memory_to_settle(threshold_ratio=None)


# --------------------------------------------------------------------------------------------
# engine_kwargs


def test_engine_kwargs_fills_the_platform_default_in_a_new_dict() -> None:
    make_platform([device()], default_memory_utilization=0.9)
    given = {"model": "m", "max_model_len": 128}
    result = av.engine_kwargs(given)
    assert result == {"model": "m", "max_model_len": 128, "gpu_memory_utilization": 0.9}
    assert "gpu_memory_utilization" not in given
    assert av.engine_kwargs({"gpu_memory_utilization": None})["gpu_memory_utilization"] == 0.9


def test_engine_kwargs_keeps_a_valid_given_value() -> None:
    make_platform([device()], default_memory_utilization=0.9)
    assert av.engine_kwargs({"gpu_memory_utilization": 0.5})["gpu_memory_utilization"] == 0.5


@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.1, float("nan"), "0.5", True])
def test_engine_kwargs_rejects_a_bad_utilization(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        av.engine_kwargs({"gpu_memory_utilization": bad})


def test_engine_kwargs_on_cpu_uses_what_the_host_has_free(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    fs.meminfo(total=16 * GIB, available=8 * GIB)
    fs.proc_self_cgroup("0::/\n")
    platform = fs.platform()
    result = av.engine_kwargs({}, platform=platform)
    assert result["gpu_memory_utilization"] == pytest.approx(0.45)  # 90 % of 8/16


# --------------------------------------------------------------------------------------------
# before_engine_start / after_engine_shutdown


def test_before_start_waits_on_a_lazy_platform_for_one_minus_utilization() -> None:
    timeline = [{"at": 2.0, "used": "6GiB"}]  # 6 GiB <= (1 - 0.92) * 80 = 6.4 GiB
    _, clock = make_platform([device("80GiB", "40GiB", timeline=timeline)], release=LAZY)
    result = av.before_engine_start({"gpu_memory_utilization": 0.92})
    assert result.targets == {0: int(0.08 * 80 * GIB)}
    assert clock.monotonic() >= 2.0 + 2.0  # release, then the profile's 2 s window


def test_before_start_checks_once_on_an_eager_platform() -> None:
    _, clock = make_platform(
        [device("80GiB", "10GiB", timeline=[{"at": 1.0, "used": "0GiB"}])], release=EAGER
    )
    with pytest.raises(av.VllmMemoryNotFreeError, match=r"not free after dur_s=0\.00"):
        av.before_engine_start({"gpu_memory_utilization": 0.92})
    assert clock.sleeps == []


def test_before_start_passes_at_once_when_there_is_room() -> None:
    make_platform([device("80GiB", "2GiB")], release=EAGER)
    assert av.before_engine_start({}).already_settled


def test_before_start_uses_the_platform_default_utilization() -> None:
    # default 0.5 -> up to 40 GiB used is fine
    make_platform([device("80GiB", "30GiB")], default_memory_utilization=0.5)
    assert av.before_engine_start({}).targets == {0: 40 * GIB}


def test_before_start_looks_only_at_the_devices_the_engine_uses() -> None:
    make_platform([device("80GiB", "1GiB"), device("80GiB", "1GiB"), device("80GiB", "70GiB")])
    result = av.before_engine_start({"tensor_parallel_size": 2})
    assert sorted(result.snapshot.memory) == [0, 1]
    with pytest.raises(ValueError, match=r"devices=\[0, 1, 2\]"):
        av.before_engine_start({"tensor_parallel_size": 1, "pipeline_parallel_size": 4})


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_before_start_rejects_a_bad_parallel_size(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        av.before_engine_start({"tensor_parallel_size": bad})


def test_after_shutdown_settles_at_one_minus_utilization_on_a_lazy_platform() -> None:
    lazy_tail = {"lazy": {"start": 0.0, "tau": 1.0, "to": "1GiB"}}
    _, clock = make_platform([device("80GiB", "70GiB", timeline=[lazy_tail])], release=LAZY)
    result = av.after_engine_shutdown({"gpu_memory_utilization": 0.9})
    assert result.targets == {0: 8 * GIB}
    assert result.snapshot.memory[0].used <= 8 * GIB
    assert clock.monotonic() >= 2.0  # at least the profile's window


def test_after_shutdown_on_an_eager_platform_returns_at_once_when_memory_is_back() -> None:
    _, clock = make_platform([device("80GiB", "1GiB")], release=EAGER)
    assert av.after_engine_shutdown({"gpu_memory_utilization": 0.9}).already_settled
    assert clock.sleeps == []


def test_after_shutdown_timeout_is_a_value_error() -> None:
    make_platform(
        [device("80GiB", "70GiB")],
        release={**LAZY, "settle_timeout_s": 3.0},
    )
    with pytest.raises(ValueError, match=r"not free after dur_s=3\.00"):
        av.after_engine_shutdown({"gpu_memory_utilization": 0.9})


# --------------------------------------------------------------------------------------------
# memory_baseline (HfRunner)


def test_memory_baseline_waits_for_usage_back_within_tolerance_on_a_lazy_platform() -> None:
    timeline = [
        {"at": 1.0, "used": "30GiB"},  # the HF model loads
        {"lazy": {"start": 2.0, "tau": 0.5, "to": "2GiB"}},  # and is freed lazily
    ]
    _, clock = make_platform([device("80GiB", "2GiB", timeline=timeline)], release=LAZY)
    with av.memory_baseline() as baseline:
        assert baseline.memory[0].used == 2 * GIB
        clock.advance(2.0)
    # back within 2 GiB + 5 % of 80 GiB = 6 GiB, for the profile's window
    assert av.record_gpu_memory_usage_stats(devices=[0])[0][0] <= 6.0
    assert clock.monotonic() >= 2.0 + 2.0


def test_memory_baseline_does_not_wait_on_an_eager_platform() -> None:
    _, clock = make_platform(
        [device("80GiB", "2GiB", timeline=[{"at": 1.0, "used": "30GiB"}])], release=EAGER
    )
    with av.memory_baseline():
        clock.advance(1.0)
    assert clock.sleeps == []


def test_memory_baseline_lets_the_body_error_through_without_waiting() -> None:
    _, clock = make_platform(
        [device("80GiB", "2GiB", timeline=[{"at": 1.0, "used": "30GiB"}])], release=LAZY
    )

    def body() -> None:
        with av.memory_baseline():
            clock.advance(1.0)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        body()
    assert clock.sleeps == []


def test_memory_baseline_times_out_with_a_value_error() -> None:
    _, clock = make_platform(
        [device("80GiB", "2GiB", timeline=[{"at": 1.0, "used": "30GiB"}])], release=LAZY
    )
    with (
        pytest.raises(ValueError, match=r"not free after dur_s=4\.00"),
        av.memory_baseline(0.1, timeout_s=4),
    ):
        clock.advance(1.0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "0.05"])
def test_memory_baseline_rejects_a_bad_tolerance(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="tolerance"), av.memory_baseline(bad):  # type: ignore[arg-type]
        pass


# --------------------------------------------------------------------------------------------
# error pickling


def test_not_free_error_survives_pickling() -> None:
    make_platform([device("80GiB", "70GiB")])
    with pytest.raises(av.VllmMemoryNotFreeError) as info:
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, timeout_s=0)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is av.VllmMemoryNotFreeError
    assert str(copy) == str(info.value)
    assert copy.targets == info.value.targets
    assert copy.snapshot == info.value.snapshot


# --------------------------------------------------------------------------------------------
# process isolation

_STATE: dict[str, str] = {"set_in": "import"}


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


def _leave_a_grandchild(path: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(path).write_text(str(proc.pid))


def test_start_method_comes_from_the_platform() -> None:
    platform, _ = make_platform([device()], preferred_start_method="spawn")
    assert av.start_method() == "spawn"
    assert av.start_method(platform) == "spawn"


def test_fork_runs_the_function_in_another_process(tmp_path: Path) -> None:
    out = tmp_path / "pid"
    av.run_in_new_process(_write_pid, (str(out),), method="fork")
    assert int(out.read_text()) not in (os.getpid(), 0)


def test_a_child_failure_comes_back_as_the_same_exception_with_the_child_traceback() -> None:
    with pytest.raises(AssertionError, match="the child saw 41") as info:
        av.run_in_new_process(_fail_with_assertion, method="fork")
    cause = info.value.__cause__
    assert cause is not None
    assert "_fail_with_assertion" in str(cause)
    assert "Traceback in the child process" in str(cause)


def test_a_skip_in_the_child_skips_the_test() -> None:
    with pytest.raises(pytest.skip.Exception, match="nothing to do here"):
        av.run_in_new_process(_skip_in_child, method="fork")


def test_pytest_fail_and_xfail_in_the_child_come_back_as_such() -> None:
    with pytest.raises(pytest.fail.Exception, match="explicit failure"):
        av.run_in_new_process(pytest.fail, ("explicit failure",), method="fork")
    with pytest.raises(pytest.xfail.Exception, match="known bug"):
        av.run_in_new_process(pytest.xfail, ("known bug",), method="fork")


def test_a_child_that_exits_without_reporting_is_a_failure() -> None:
    with pytest.raises(av.ChildTestError, match="exited with code 3 without reporting"):
        av.run_in_new_process(_exit_hard, method="fork")
    with pytest.raises(av.ChildTestError, match="killed by SIGKILL"):
        av.run_in_new_process(_kill_self, method="fork")


def test_an_exception_that_cannot_be_pickled_is_reported_by_name_and_text() -> None:
    with pytest.raises(av.ChildTestError, match="_Unpicklable: custom failure text") as info:
        av.run_in_new_process(_raise_unpicklable, method="fork")
    assert "_raise_unpicklable" in str(info.value.__cause__)


def test_what_the_child_leaves_running_is_terminated(tmp_path: Path) -> None:
    out = tmp_path / "grandchild"
    av.run_in_new_process(_leave_a_grandchild, (str(out),), method="fork")
    pid = int(out.read_text())
    deadline = time.monotonic() + 5
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


def test_spawn_imports_the_function_afresh_and_reports_failures(tmp_path: Path) -> None:
    _STATE["set_in"] = "parent"
    try:
        out = tmp_path / "state"
        av.run_in_new_process(_record_state, (str(out),), method="fork")
        assert out.read_text() == "parent"
        av.run_in_new_process(_record_state, (str(out),), method="spawn")
        assert out.read_text() == "import"  # a fresh interpreter imported the module
        with pytest.raises(AssertionError, match="the child saw 41"):
            av.run_in_new_process(_fail_with_assertion, method="spawn")
    finally:
        _STATE["set_in"] = "import"


def test_spawn_explains_what_it_cannot_do() -> None:
    def local() -> None:
        pass

    with pytest.raises(ConfigurationError, match="module or class level"):
        av.run_in_new_process(local, method="spawn")
    with pytest.raises(ConfigurationError, match="picklable"):
        av.run_in_new_process(_write_pid, (lambda: None,), method="spawn")
    with pytest.raises(ConfigurationError, match="method"):
        av.run_in_new_process(_write_pid, ("x",), method="thread")  # type: ignore[arg-type]


def test_decorator_defaults_to_the_platform_start_method_at_call_time(tmp_path: Path) -> None:
    isolated = av.create_new_process_for_each_test()(_record_state)
    _STATE["set_in"] = "parent"
    try:
        make_platform([device()], preferred_start_method="fork")
        isolated(str(tmp_path / "a"))
        make_platform([device()], preferred_start_method="spawn")
        isolated(str(tmp_path / "b"))
    finally:
        _STATE["set_in"] = "import"
    assert (tmp_path / "a").read_text() == "parent"
    assert (tmp_path / "b").read_text() == "import"


def test_decorator_keeps_the_signature_for_fixture_injection() -> None:
    def test_something(tmp_path: Path, accel_platform: object) -> None:
        pass

    wrapped = av.create_new_process_for_each_test("fork")(test_something)
    assert list(inspect.signature(wrapped).parameters) == ["tmp_path", "accel_platform"]
    assert wrapped.__name__ == "test_something"
    with pytest.raises(ConfigurationError, match="method"):
        av.create_new_process_for_each_test("thread")  # type: ignore[arg-type]


@av.create_new_process_for_each_test("spawn")
def test_a_spawned_test_receives_its_fixtures(tmp_path: Path) -> None:
    assert multiprocessing.parent_process() is not None  # not the pytest process
    assert tmp_path.is_dir()


@av.create_new_process_for_each_test("fork")
def test_a_forked_test_runs_outside_the_pytest_process(tmp_path: Path) -> None:
    assert multiprocessing.parent_process() is not None
    assert tmp_path.is_dir()


# --------------------------------------------------------------------------------------------
# marks


def test_large_gpu_mark_counts_decimal_gigabytes() -> None:
    mark = av.large_gpu_mark(24)
    assert mark.name == "accelplat_requires_device_memory"
    assert mark.kwargs["bytes"] == 24 * 10**9
    assert mark.kwargs["label"] == "24 GB"
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(ConfigurationError, match="min_gb"):
            av.large_gpu_mark(bad)


def test_large_gpu_test_applies_the_mark() -> None:
    def test_x() -> None:
        pass

    marked = av.large_gpu_test(min_gb=48)(test_x)
    names = [m.name for m in marked.pytestmark]  # type: ignore[attr-defined]
    assert names == ["accelplat_requires_device_memory"]


@pytest.mark.parametrize("strict", [True, False])
def test_multi_gpu_test_marks_and_isolates(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    def test_x() -> None:
        pass

    # `distributed` is vLLM's marker: under --strict-markers, unregistered, it is left out.
    # pytest.mark consults the config it was bound to; bind it explicitly (pytester runs in
    # the same process may have re-bound it).
    assert pytestconfig.option.strict_markers
    monkeypatch.setattr(pytest.mark, "_config", pytestconfig if strict else None)
    expected = [] if strict else ["distributed"]
    marks = av.multi_gpu_marks(num_gpus=2)
    assert [m.name for m in marks] == [*expected, "accelplat_requires_devices"]
    assert marks[-1].args == (2,)
    wrapped = av.multi_gpu_test(num_gpus=4)(test_x)
    assert wrapped._accelplat_isolated is test_x  # type: ignore[attr-defined]
    names = [m.name for m in wrapped.pytestmark]  # type: ignore[attr-defined]
    assert sorted(names) == sorted([*expected, "accelplat_requires_devices"])
    with pytest.raises(ConfigurationError, match="num_gpus"):
        av.multi_gpu_marks(num_gpus=0)
