"""The face: whole-device leases across real processes, memory back first, bad input at once,
the environment of a lease on every backend, and lease units (MIG slices)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_VISIBLE, SimulatedClock, SimulatedPlatform
from accelplat._leasing import RETURN_TOLERANCE_BYTES, lease, lease_status
from accelplat._platform import default_subset_environment, subset_environment
from accelplat._types import GIB, DeviceInfo
from accelplat._visible.oneapi import Hierarchy, affinity_mask_for, visible_targets
from accelplat.errors import ConfigurationError, LeaseTimeoutError, LeaseUnsatisfiableError
from tests.leasing._common import TWO, child_env, sim

# --------------------------------------------------------------------------------------------
# one process


def test_two_leases_get_different_devices_most_free_first(tmp_path: Path) -> None:
    plat = sim()
    with lease(1, platform=plat, lock_dir=tmp_path) as first:
        assert [d.uuid for d in first.devices] == ["SIM-1"]  # 70 GiB free
        with lease(1, platform=plat, lock_dir=tmp_path, timeout_s=0) as second:
            assert [d.uuid for d in second.devices] == ["SIM-0"]  # 50 GiB free
            with pytest.raises(LeaseTimeoutError) as info:
                lease(2, platform=plat, lock_dir=tmp_path, timeout_s=0).acquire()
            assert "fewer than 2 of 3" in str(info.value)
            assert f"pid {os.getpid()}" in str(info.value)
    # all released: a three-device lease now succeeds
    with lease(3, platform=plat, lock_dir=tmp_path, timeout_s=0) as every:
        assert sorted(d.uuid or "" for d in every.devices) == ["SIM-0", "SIM-1", "SIM-2"]


def test_environment_names_the_devices_by_identity_and_applies(tmp_path: Path) -> None:
    plat = sim()
    env: dict[str, str] = {ENV_VISIBLE: "0,1,2", "OTHER": "x"}
    with lease(2, platform=plat, lock_dir=tmp_path) as held:
        assert held.environ == {ENV_VISIBLE: "SIM-1,SIM-0"}
        assert held.child_environ(env) == {ENV_VISIBLE: "SIM-1,SIM-0", "OTHER": "x"}
        restore = held.apply(env)
        assert env[ENV_VISIBLE] == "SIM-1,SIM-0"
        restore()
        assert env == {ENV_VISIBLE: "0,1,2", "OTHER": "x"}


def test_leases_stay_inside_the_visible_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VISIBLE, "SIM-2,SIM-0")  # an outer scheduler's assignment
    plat = sim()
    with lease(2, platform=plat, lock_dir=tmp_path) as held:
        assert sorted(d.uuid or "" for d in held.devices) == ["SIM-0", "SIM-2"]
        assert [d.physical_index for d in held.devices] == [0, 2]
    with pytest.raises(LeaseUnsatisfiableError, match="shows this process only 2"):
        lease(3, platform=plat, lock_dir=tmp_path)


def test_the_lock_is_keyed_by_identity_not_by_visible_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plat = sim()
    with lease(1, platform=plat, lock_dir=tmp_path, prefer=["simulated.SIM-2"]) as held:
        assert held.device_ids == ("simulated.SIM-2",)
        monkeypatch.setenv(ENV_VISIBLE, "SIM-2")  # the same device is visible index 0 here
        with pytest.raises(LeaseTimeoutError):
            lease(1, platform=plat, lock_dir=tmp_path, timeout_s=0).acquire()


def test_a_lease_cannot_be_acquired_twice_and_release_is_idempotent(tmp_path: Path) -> None:
    held = lease(1, platform=sim(), lock_dir=tmp_path).acquire()
    with pytest.raises(ConfigurationError, match="held already"):
        held.acquire()
    held.release()
    held.release()
    assert not held.held


# --------------------------------------------------------------------------------------------
# memory must be back before hand-out


def test_waits_for_the_previous_holders_memory_to_come_back(tmp_path: Path) -> None:
    clock = SimulatedClock()
    spec = {
        "devices": [
            {
                "total": "80GiB",
                "used": "1GiB",
                "timeline": [{"at": 1.0, "used": "9GiB"}, {"at": 3.0, "used": "1GiB"}],
            }
        ]
    }
    plat = sim(spec, clock)
    first = lease(1, platform=plat, lock_dir=tmp_path).acquire()  # hands out at 1 GiB used
    clock.advance(2.0)  # the holder uses 8 GiB more, then lets go at t=2
    first.release()
    second = lease(1, platform=plat, lock_dir=tmp_path, timeout_s=60).acquire()
    assert plat.elapsed() == pytest.approx(3.0, abs=0.05)  # waited until the memory came back
    assert second.waited_s == pytest.approx(1.0, abs=0.05)
    second.release()


def test_a_process_taking_back_its_own_device_does_not_wait_for_its_own_memory(
    tmp_path: Path,
) -> None:
    clock = SimulatedClock()
    timeline = [{"at": 1.0, "used": "9GiB"}]  # this process's runtime, which stays
    spec = {"devices": [{"total": "80GiB", "used": "1GiB", "timeline": timeline}]}
    plat = sim(spec, clock)
    first = lease(1, platform=plat, lock_dir=tmp_path).acquire()
    clock.advance(2.0)
    first.release()
    with pytest.raises(LeaseTimeoutError):  # without prefer, the memory is waited for
        lease(1, platform=plat, lock_dir=tmp_path, timeout_s=5).acquire()
    again = lease(1, platform=plat, lock_dir=tmp_path, prefer=first.device_ids, timeout_s=5)
    with again:
        assert again.waited_s == 0.0
    (record,) = lease_status(tmp_path)
    assert record.baseline_used_bytes == 1 * GIB  # the idle figure, kept for the next holder


def test_memory_that_never_comes_back_times_out_naming_it(tmp_path: Path) -> None:
    clock = SimulatedClock()
    timeline = [{"at": 1.0, "used": "9GiB"}]
    spec = {"devices": [{"total": "80GiB", "used": "1GiB", "timeline": timeline}]}
    plat = sim(spec, clock)
    first = lease(1, platform=plat, lock_dir=tmp_path).acquire()
    clock.advance(2.0)
    first.release()
    with pytest.raises(LeaseTimeoutError, match="memory did not come back"):
        lease(1, platform=plat, lock_dir=tmp_path, timeout_s=5).acquire()
    # the tolerance: a little more than the hand-out figure still counts as back
    assert RETURN_TOLERANCE_BYTES < 8 * GIB


def test_minimum_free_memory_is_waited_for(tmp_path: Path) -> None:
    clock = SimulatedClock()
    timeline = [{"at": 4.0, "used": "5GiB"}]
    spec = {"devices": [{"total": "80GiB", "used": "50GiB", "timeline": timeline}]}
    plat = sim(spec, clock)
    with lease(1, platform=plat, lock_dir=tmp_path, min_free_bytes=70 * GIB) as held:
        assert held.waited_s == pytest.approx(4.0, abs=0.05)
    with lease(1, platform=plat, lock_dir=tmp_path, min_free_ratio=0.9) as held:
        assert held.waited_s < 0.05  # 75 of 80 GiB free now


def test_lazy_platform_applies_its_stability_window(tmp_path: Path) -> None:
    clock = SimulatedClock()
    spec = {
        "release": {"lazy": True, "stable_duration_s": 2.0},
        "devices": [{"total": "80GiB", "used": "50GiB", "timeline": [{"at": 1.0, "used": "5GiB"}]}],
    }
    plat = sim(spec, clock)
    with lease(1, platform=plat, lock_dir=tmp_path, min_free_bytes=70 * GIB) as held:
        assert held.waited_s == pytest.approx(3.0, abs=0.05)


# --------------------------------------------------------------------------------------------
# bad input, at once


@pytest.mark.parametrize("count", [0, -1, True, 1.5, "1", None])
def test_bad_counts_are_refused(tmp_path: Path, count: Any) -> None:
    with pytest.raises(ConfigurationError, match="count must be"):
        lease(count, platform=sim(), lock_dir=tmp_path)


def test_more_devices_than_visible_can_never_be_leased(tmp_path: Path) -> None:
    clock = SimulatedClock()
    with pytest.raises(LeaseUnsatisfiableError, match="cannot lease 4 device"):
        lease(4, platform=sim(clock=clock), lock_dir=tmp_path, timeout_s=600).acquire()
    assert clock.monotonic() == 0.0  # refused without one sleep of the 600 s it could wait


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_free_bytes": 81 * GIB}, "only 0 of 3"),
        ({"min_free_bytes": 50 * GIB, "count": 3}, "only 2 of 3"),
    ],
)
def test_minimums_no_device_could_meet_can_never_be_leased(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(LeaseUnsatisfiableError, match=message):
        lease(platform=sim(), lock_dir=tmp_path, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_free_bytes": -1}, "min_free_bytes must be"),
        ({"min_free_bytes": 1.5}, "min_free_bytes must be"),
        ({"min_free_bytes": 2**63}, "min_free_bytes must be"),
        ({"min_free_ratio": 1.5}, "min_free_ratio must be"),
        ({"min_free_ratio": float("nan")}, "min_free_ratio must be"),
        ({"timeout_s": -1}, "timeout_s must be"),
        ({"timeout_s": float("inf")}, "timeout_s must be"),
        ({"prefer": "SIM-0"}, "prefer must be"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        lease(platform=sim(), lock_dir=tmp_path, **kwargs)
    assert not isinstance(info.value, LeaseUnsatisfiableError)  # a mistake, not a skip


# --------------------------------------------------------------------------------------------
# several real processes


HOLDER = textwrap.dedent(
    """
    import json, sys, time
    import accelplat
    count, hold, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    with accelplat.lease(count, timeout_s=60) as held:
        start = time.time()
        print("held", ",".join(held.device_ids), flush=True)
        time.sleep(hold)
        end = time.time()
    with open(out, "a") as fh:
        fh.write(json.dumps({"ids": list(held.device_ids), "start": start, "end": end}) + "\\n")
    """
)


def _holder(tmp_path: Path, count: int, hold: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(count), str(hold), str(tmp_path / "log.jsonl")],
        env=child_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )


def test_contending_processes_never_share_a_device(tmp_path: Path) -> None:
    procs = [_holder(tmp_path, 1, 0.4) for _ in range(4)] + [_holder(tmp_path, 2, 0.2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    spans: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        for ident in row["ids"]:
            spans.setdefault(ident, []).append((row["start"], row["end"]))
    assert set(spans) == {"simulated.SIM-0", "simulated.SIM-1"}
    for ident, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, f"{ident} was held by two processes at once"
    two = [row for row in rows if len(row["ids"]) == 2]
    assert len(two) == 1  # the two-device lease got both, together


def test_a_sigkilled_holder_frees_its_devices_at_once(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 2, 600)
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("held ")
    clock = SimulatedClock()  # waits below are virtual: no sleep is real, none is timed
    plat = sim(TWO, clock)
    locks = tmp_path / "locks"
    with pytest.raises(LeaseTimeoutError):
        lease(1, platform=plat, lock_dir=locks, timeout_s=0.2).acquire()
    status = {r.device_id: r for r in lease_status(locks)}
    assert status["simulated.SIM-0"].held
    assert status["simulated.SIM-0"].pid == holder.pid
    assert "-c" in status["simulated.SIM-0"].command
    assert status["simulated.SIM-0"].since is not None
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with lease(2, platform=plat, lock_dir=locks, timeout_s=10) as held:
        assert held.waited_s == 0.0  # the first attempt got both locks: nothing to wait for
        assert len(held.devices) == 2
        status = {r.device_id: r for r in lease_status(locks)}
        assert status["simulated.SIM-0"].pid == os.getpid()
    status = {r.device_id: r for r in lease_status(locks)}
    assert not status["simulated.SIM-0"].held
    assert status["simulated.SIM-0"].released


def test_status_tells_a_crashed_holder_from_a_released_one(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 1, 600)
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("held ")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    (record,) = lease_status(tmp_path / "locks")
    assert not record.held
    assert not record.released
    assert record.pid == holder.pid


# --------------------------------------------------------------------------------------------
# how backends express a device subset


def test_default_subset_environment_uses_uuid_then_physical_index() -> None:
    devices = [DeviceInfo(0, 3, "a", uuid="GPU-aa"), DeviceInfo(1, 5, "b")]
    assert default_subset_environment("X_VISIBLE", devices) == {"X_VISIBLE": "GPU-aa,5"}
    assert default_subset_environment(None, devices) == {}


def test_subset_environment_rejects_a_malformed_backend_answer() -> None:
    class Odd(SimulatedPlatform):
        def visible_devices_environment(self, devices: Any) -> Any:
            return {"X": 5}

    with pytest.raises(ConfigurationError, match="visible_devices_environment"):
        subset_environment(Odd(TWO), [])


@pytest.mark.parametrize("hierarchy", ["FLAT", "COMPOSITE", "COMBINED"])
def test_xpu_affinity_mask_shows_exactly_the_chosen_devices(hierarchy: str) -> None:
    tiles = [2, 1, 2]
    env = {"ZE_FLAT_DEVICE_HIERARCHY": hierarchy}
    every = visible_targets(tiles, env)
    for chosen in ([every[-1]], [every[0], every[2]], every[1:]):
        mask = affinity_mask_for(chosen, tiles, Hierarchy(hierarchy))
        assert visible_targets(tiles, {**env, "ZE_AFFINITY_MASK": mask}) == chosen


def test_rocm_names_the_subset_in_both_hip_variables() -> None:
    from accelplat._backends.rocm import RocmPlatform

    devices = [DeviceInfo(0, 1, "mi300", uuid="GPU-0123456789abcdef"), DeviceInfo(1, 0, "mi300")]
    env = RocmPlatform().visible_devices_environment(devices)
    assert env == {
        "HIP_VISIBLE_DEVICES": "GPU-0123456789abcdef,1",
        "CUDA_VISIBLE_DEVICES": "GPU-0123456789abcdef,1",
    }


def test_cuda_leases_by_uuid_inside_an_outer_cuda_visible_devices(
    install: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from accelplat._backends.cuda import CudaPlatform
    from tests.fakes.nvml import FakeNvml, h200

    gpus = [h200(0, used=30 * GIB), h200(1, used=1 * GIB), h200(2, used=2 * GIB)]
    install(FakeNvml(gpus))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # a scheduler granted physical 2 and 0
    plat = CudaPlatform()
    with lease(1, platform=plat, lock_dir=tmp_path) as held:
        # GPU 1 has the most free memory but is not visible; GPU 2 is the best visible one
        assert held.environ == {"CUDA_VISIBLE_DEVICES": gpus[2].uuid}
        assert (held.devices[0].index, held.devices[0].physical_index) == (0, 2)
        with lease(1, platform=plat, lock_dir=tmp_path, timeout_s=0) as other:
            assert other.environ == {"CUDA_VISIBLE_DEVICES": gpus[0].uuid}
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus[2].uuid)  # as the child sees it
        (seen,) = CudaPlatform().devices()
        assert seen.uuid == gpus[2].uuid
        assert seen.physical_index == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    with pytest.raises(ConfigurationError, match="shows this process only 2"):
        lease(3, platform=plat, lock_dir=tmp_path)


# --------------------------------------------------------------------------------------------
# lease units: a host of MIG slices is a host of small devices

SLICE = {"name": "1g.18gb", "total": "17.75GiB"}
SEVEN = {"devices": [{"name": "H200", "total": "140GiB", "slices": [SLICE] * 7}]}

SLICE_HOLDER = textwrap.dedent(
    """
    import json, os, sys
    import accelplat
    from accelplat._backends.simulated import SimulatedPlatform
    with accelplat.lease(1, timeout_s=60) as held:
        os.environ.update(held.child_environ())  # what a child of the lease sees
        seen = SimulatedPlatform()
        (device,) = seen.devices()
        doc = {"env": held.environ, "id": held.device_ids[0], "seen": device.uuid,
               "name": device.name, "total": seen.memory_info(0).total}
        print(json.dumps(doc), flush=True)
        sys.stdin.read()
    """
)


def test_seven_workers_lease_a_seven_slice_host_each_its_own_slice(tmp_path: Path) -> None:
    env = child_env(tmp_path, SEVEN)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", SLICE_HOLDER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(7)
    ]
    try:
        docs = [json.loads(w.stdout.readline()) for w in workers if w.stdout is not None]
        values = {d["env"][ENV_VISIBLE] for d in docs}
        assert values == {f"MIG-SIM-0-{i}" for i in range(7)}  # seven slices, one each
        assert all(d["seen"] == d["env"][ENV_VISIBLE] for d in docs)  # the child sees its slice
        assert {(d["name"], d["total"]) for d in docs} == {("1g.18gb", int(17.75 * GIB))}
        assert len({d["id"] for d in docs}) == 7
        with pytest.raises(LeaseTimeoutError, match="fewer than 1 of 7"):
            lease(
                platform=SimulatedPlatform(SEVEN), lock_dir=tmp_path / "locks", timeout_s=0
            ).acquire()
    finally:
        for w in workers:
            w.communicate("", timeout=60)
    assert [w.returncode for w in workers] == [0] * 7


def test_shares_of_a_slice_and_a_whole_slice_exclude_each_other(tmp_path: Path) -> None:
    plat = SimulatedPlatform({"devices": [{"total": "80GiB", "slices": [SLICE] * 2}]})
    first = lease(memory="8GiB", platform=plat, lock_dir=tmp_path, timeout_s=0).acquire()
    second = lease(memory="8GiB", platform=plat, lock_dir=tmp_path, timeout_s=0).acquire()
    assert first.environ[ENV_VISIBLE] != second.environ[ENV_VISIBLE]  # the most room first
    assert first.environ["ACCELPLAT_LEASE_MEMORY_BYTES"] == str(8 * GIB)
    with pytest.raises(LeaseTimeoutError, match=r"MIG-SIM-0-0 .* shared by"):
        lease(platform=plat, lock_dir=tmp_path, timeout_s=0).acquire()
    first.release()
    with lease(platform=plat, lock_dir=tmp_path, timeout_s=0) as whole:
        assert whole.environ == {ENV_VISIBLE: "MIG-SIM-0-0"}
        assert whole.devices[0].name == "1g.18gb"
    second.release()
    with pytest.raises(LeaseUnsatisfiableError, match="only 2 lease units"):
        lease(3, platform=plat, lock_dir=tmp_path)
    with pytest.raises(LeaseUnsatisfiableError, match="only 0 of 2 visible device"):
        lease(memory="18GiB", platform=plat, lock_dir=tmp_path)  # a slice is 17.75 GiB


def test_a_process_given_one_slice_leases_that_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VISIBLE, "MIG-SIM-0-1")  # a scheduler's grant: the units are its own
    plat = SimulatedPlatform(SEVEN)
    with lease(platform=plat, lock_dir=tmp_path, timeout_s=0) as held:
        assert held.environ == {ENV_VISIBLE: "MIG-SIM-0-1"}
        assert held.device_ids == ("simulated.MIG-SIM-0-1",)
