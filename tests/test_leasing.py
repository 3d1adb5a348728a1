"""Device leases: exclusion across real processes, crash release, memory-back waits, bad input."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_SPEC, ENV_VISIBLE, SimulatedClock, SimulatedPlatform
from accelplat._leasing import (
    ENV_LEASE_DIR,
    RETURN_TOLERANCE_BYTES,
    default_lease_dir,
    lease,
    lease_status,
)
from accelplat._platform import default_subset_environment, subset_environment
from accelplat._types import GIB, DeviceInfo
from accelplat._visible.oneapi import Hierarchy, affinity_mask_for, visible_targets
from accelplat.errors import ConfigurationError, LeaseTimeoutError

ROOT = Path(__file__).resolve().parent.parent

THREE = {
    "devices": [
        {"total": "80GiB", "used": "30GiB"},
        {"total": "80GiB", "used": "10GiB"},
        {"total": "40GiB", "used": "20GiB"},
    ]
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VISIBLE, raising=False)
    monkeypatch.delenv(ENV_LEASE_DIR, raising=False)


def sim(spec: dict[str, Any] = THREE, clock: Any = None) -> SimulatedPlatform:
    return SimulatedPlatform(spec, clock=clock)


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
    with pytest.raises(ConfigurationError, match="shows this process only 2"):
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


def test_more_devices_than_visible_is_refused_at_once(tmp_path: Path) -> None:
    clock = SimulatedClock()
    with pytest.raises(ConfigurationError, match="cannot lease 4 device"):
        lease(4, platform=sim(clock=clock), lock_dir=tmp_path, timeout_s=600).acquire()
    assert clock.monotonic() == 0.0  # refused without one sleep of the 600 s it could wait


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_free_bytes": 81 * GIB}, "only 0 of 3"),
        ({"min_free_bytes": 50 * GIB, "count": 3}, "only 2 of 3"),
        ({"min_free_bytes": -1}, "min_free_bytes must be"),
        ({"min_free_bytes": 1.5}, "min_free_bytes must be"),
        ({"min_free_ratio": 1.5}, "min_free_ratio must be"),
        ({"min_free_ratio": float("nan")}, "min_free_ratio must be"),
        ({"timeout_s": -1}, "timeout_s must be"),
        ({"timeout_s": float("inf")}, "timeout_s must be"),
        ({"prefer": "SIM-0"}, "prefer must be"),
    ],
)
def test_bad_or_unsatisfiable_arguments_are_refused(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        lease(platform=sim(), lock_dir=tmp_path, **kwargs)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_lock_dir_that_is_not_writable_is_named(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigurationError, match=f"{locked} is not writable"):
            lease(platform=sim(), lock_dir=locked)
    finally:
        locked.chmod(0o700)


def test_a_lock_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(ConfigurationError, match=str(plain)):
        lease(platform=sim(), lock_dir=plain)


def test_default_lock_dir_follows_the_variable_then_the_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LEASE_DIR, str(tmp_path / "mine"))
    assert default_lease_dir() == tmp_path / "mine"
    monkeypatch.delenv(ENV_LEASE_DIR)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_lease_dir() == tmp_path / "accelplat" / "leases"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_lease_dir().name == "leases"
    assert f"accelplat-{os.getuid()}" in str(default_lease_dir())


def test_hostile_metadata_is_ignored(tmp_path: Path) -> None:
    plat = sim()
    with lease(1, platform=plat, lock_dir=tmp_path) as held:
        key = held.device_ids[0]
    meta = tmp_path / f"{key}.json"
    meta.unlink()
    meta.symlink_to("/dev/zero")  # not a regular file: never read
    (tmp_path / "simulated.SIM-0.json").write_bytes(b"{" * 100_000)  # oversized
    (tmp_path / "simulated.SIM-2.json").write_text('{"baseline_used_bytes": -5, "pid": "x"}')
    (tmp_path / "simulated.SIM-2.lock").touch()
    records = {r.device_id: r for r in lease_status(tmp_path)}
    assert records["simulated.SIM-2"].pid is None  # "x" is no pid
    assert records["simulated.SIM-2"].baseline_used_bytes is None
    with lease(3, platform=plat, lock_dir=tmp_path, timeout_s=0) as every:
        assert len(every.devices) == 3  # no wait on a nonsense baseline, no crash
    records = {r.device_id: r for r in lease_status(tmp_path)}
    assert records["simulated.SIM-2"].pid == os.getpid()  # rewritten by the new holder


# --------------------------------------------------------------------------------------------
# several real processes


SPEC_2 = {"devices": [{"total": "80GiB"}, {"total": "80GiB"}]}

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


def _env(tmp_path: Path) -> dict[str, str]:
    spec = tmp_path / "spec.json"
    if not spec.exists():
        spec.write_text(json.dumps(SPEC_2))
    env = dict(os.environ)
    env.update(
        {
            "ACCELPLAT_PLATFORM": "simulated",
            ENV_SPEC: str(spec),
            ENV_LEASE_DIR: str(tmp_path / "locks"),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.pop(ENV_VISIBLE, None)
    return env


def _holder(tmp_path: Path, count: int, hold: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(count), str(hold), str(tmp_path / "log.jsonl")],
        env=_env(tmp_path),
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
    plat = sim(SPEC_2, clock)
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
        subset_environment(Odd(SPEC_2), [])


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


def test_metadata_behind_a_link_is_not_followed(tmp_path: Path) -> None:
    from accelplat._leasing import _read_metadata

    real = tmp_path / "elsewhere.json"
    real.write_text('{"pid": 7}')
    link = tmp_path / "simulated.SIM-0.json"
    link.symlink_to(real)
    assert _read_metadata(real) == {"pid": 7}
    assert _read_metadata(link) == {}  # another user's link in a shared directory
    fifo = tmp_path / "simulated.SIM-1.json"
    os.mkfifo(fifo)
    box: list[object] = []
    reader = threading.Thread(target=lambda: box.append(_read_metadata(fifo)), daemon=True)
    reader.start()
    reader.join(30)  # a FIFO without a writer would block a plain open() for ever
    assert box == [{}]


# --------------------------------------------------------------------------------------------
# hostile lock directories and metadata (issue 23)

OTHER_UID = 4242  # no account needed: os.chown to it stands for another user
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can chown to another uid")


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory for ``<tmp>/accelplat-<uid>/leases``, and no variable set."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path / f"accelplat-{os.getuid()}"


def test_the_private_default_is_created_0700(private_tmp: Path) -> None:
    with lease(1, platform=sim()):
        pass
    for level in (private_tmp, private_tmp / "leases"):
        assert stat.S_IMODE(level.lstat().st_mode) == 0o700
    assert [r.device_id for r in lease_status()] == ["simulated.SIM-1"]


def _plant(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "link to a directory of ours":
        (tmp_path / "real").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "real")
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "file":
        path.write_text("x")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "other owner":
        path.mkdir(mode=0o700)
        os.chown(path, OTHER_UID, -1)
    else:  # a mode
        path.mkdir()
        path.chmod(int(kind, 8))


PLANTED = [
    "link to a directory of ours",
    "dangling link",
    "file",
    "fifo",
    pytest.param("other owner", marks=as_root),
    "770",
    "720",
    "707",
    "777",
    "1777",
]


@pytest.mark.parametrize("level", ["base", "leases"])
@pytest.mark.parametrize("kind", PLANTED)
def test_a_planted_private_default_is_refused_naming_it(
    private_tmp: Path, tmp_path: Path, level: str, kind: str
) -> None:
    target = private_tmp if level == "base" else private_tmp / "leases"
    if level == "leases":
        private_tmp.mkdir(mode=0o700)
    _plant(kind, target, tmp_path)
    for call in (lambda: lease(1, platform=sim()), lease_status):
        with pytest.raises(ConfigurationError, match=f"{target} (is|cannot)") as info:
            call()
        assert "ACCELPLAT_LEASE_DIR" in str(info.value) or "cannot be created" in str(info.value)
    assert not (tmp_path / "real" / "leases").exists()  # nothing made through the link


@as_root
def test_a_shared_directory_named_by_the_variable_may_belong_to_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    os.chown(shared, OTHER_UID, -1)
    monkeypatch.setenv(ENV_LEASE_DIR, str(shared))
    with lease(1, platform=sim()) as held:
        assert held.lock_dir == shared


class _EmptyPath(os.PathLike[str]):
    def __fspath__(self) -> str:
        return ""


@pytest.mark.parametrize("empty", ["", _EmptyPath()], ids=["''", "PathLike ''"])
def test_an_empty_lock_dir_is_refused(empty: Any) -> None:
    with pytest.raises(ConfigurationError, match="must not be empty"):
        lease(platform=sim(), lock_dir=empty)
    with pytest.raises(ConfigurationError, match="must not be empty"):
        lease_status(empty)


@pytest.mark.parametrize("args", [["--", "true"], ["--status"], ["--status", "--json"]])
def test_the_cli_refuses_an_empty_lock_dir(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from accelplat._cli import main

    assert main(["lease", "--lock-dir", "", *args]) == 2
    assert "must not be empty" in capsys.readouterr().err


def _unlockable(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "directory":
        path.mkdir()
    elif kind == "link to a file":
        (tmp_path / "target").write_text("")
        path.symlink_to(tmp_path / "target")
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "link to a directory":
        path.symlink_to(tmp_path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()


UNLOCKABLE = ["directory", "link to a file", "dangling link", "link to a directory", "fifo"]
UNLOCKABLE += ["socket", "permission denied"]


@pytest.mark.parametrize("kind", UNLOCKABLE)
def test_a_device_that_cannot_be_locked_is_skipped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    bad = locks / "simulated.SIM-1.lock"  # the device with the most free memory
    if kind == "permission denied":  # another user's 0600 file, as a non-root user sees it
        bad.touch(mode=0o600)
        real_open = os.open

        def refuse(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if Path(path) == bad:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    else:
        _unlockable(kind, bad, tmp_path)
    plat = sim()
    with lease(1, platform=plat, lock_dir=locks, timeout_s=0) as held:
        assert held.device_ids == ("simulated.SIM-0",)  # the next best, not a traceback
        with lease(1, platform=plat, lock_dir=locks, timeout_s=0) as other:
            assert other.device_ids == ("simulated.SIM-2",)
    with pytest.raises(LeaseTimeoutError, match=f"device 1 cannot be locked \\({bad}: "):
        lease(3, platform=plat, lock_dir=locks, timeout_s=0).acquire()
    assert "simulated.SIM-1" not in {r.device_id for r in lease_status(locks)}
    if kind == "link to a file":
        assert (tmp_path / "target").read_text() == ""  # nothing written through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another uid")
def test_another_users_0600_lock_file_is_skipped_by_the_others() -> None:
    shared = Path(tempfile.mkdtemp(prefix="accelplat-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        spec = shared / "spec.json"
        spec.write_text(json.dumps(THREE))
        spec.chmod(0o644)
        (shared / "simulated.SIM-1.lock").touch(mode=0o600)  # root's, unreadable to the child
        # the interpreter lives under /root (0700): import as root, then become uid 65534
        script = textwrap.dedent(
            f"""
            import os, sys, tempfile, accelplat
            from accelplat.errors import LeaseTimeoutError
            def attempt(where):
                with accelplat.lease(1, timeout_s=0, lock_dir=where) as held:
                    first = held.device_ids[0]
                try:
                    accelplat.lease(3, timeout_s=0, lock_dir=where).acquire()
                except LeaseTimeoutError as exc:
                    return first, str(exc)
            attempt(tempfile.mkdtemp())  # every import made while still root
            os.setegid(65534)
            os.seteuid(65534)
            print(*attempt({str(shared)!r}), sep="\\n")
            """
        )
        env = {**_env(shared), ENV_SPEC: str(spec)}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        first, message = done.stdout.splitlines()
        assert first == "simulated.SIM-0"
        assert "device 1 cannot be locked" in message
        assert "Permission denied" in message
    finally:
        shutil.rmtree(shared)


HOSTILE_SINCE = [1e18, 1e300, 253_402_300_800, -1, "2024", True, None, [], 10**400]
HOSTILE_SINCE_TEXT = ["NaN", "Infinity", "-Infinity", "1e400"]  # JSON Python reads anyway


@pytest.mark.parametrize("since", [json.dumps(s) for s in HOSTILE_SINCE] + HOSTILE_SINCE_TEXT)
def test_status_shows_an_out_of_range_time_as_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], since: str
) -> None:
    from accelplat._cli import main

    (tmp_path / "simulated.SIM-0.lock").touch()
    (tmp_path / "simulated.SIM-0.json").write_text(f'{{"pid": 5, "since": {since}}}')
    (record,) = lease_status(tmp_path)
    assert record.since is None
    assert main(["lease", "--status", "--lock-dir", str(tmp_path)]) == 0
    assert "pid 5 since ?" in capsys.readouterr().out
    assert main(["lease", "--status", "--json", "--lock-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["since"] is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pid", 0),
        ("pid", -1),
        ("pid", 2**22 + 1),
        ("pid", 2**63),
        ("pid", 1.5),
        ("pid", True),
        ("pid", "5"),
        ("baseline_used_bytes", -5),
        ("baseline_used_bytes", 2**63),
        ("baseline_used_bytes", 1e30),
        ("baseline_used_bytes", False),
        ("command", 5),
        ("command", ["x"]),
        ("platform", {"a": 1}),
        ("released", "yes"),
        ("device_id", "simulated.SIM-2"),
    ],
)
def test_every_metadata_field_is_range_checked(tmp_path: Path, field: str, value: Any) -> None:
    (tmp_path / "simulated.SIM-0.lock").touch()
    (tmp_path / "simulated.SIM-0.json").write_text(json.dumps({field: value}))
    (record,) = lease_status(tmp_path)
    assert record.device_id == "simulated.SIM-0"  # the file's name, whatever the metadata says
    assert record.pid in (None, 0)[: 1 + (value == 0)]
    assert record.baseline_used_bytes is None
    assert (record.command, record.platform, record.released) == ("", "", False)
    with lease(3, platform=sim(), lock_dir=tmp_path, timeout_s=0):
        pass  # a lease through it neither crashes nor waits


def test_metadata_text_is_bounded_and_escaped(tmp_path: Path) -> None:
    (tmp_path / "simulated.SIM-0.lock").touch()
    meta = {"command": "\x1b]0;owned\x07" + "x" * 5000, "platform": "\x1b[2J"}
    (tmp_path / "simulated.SIM-0.json").write_text(json.dumps(meta))
    (record,) = lease_status(tmp_path)
    assert record.command.startswith("?]0;owned?x")
    assert len(record.command) == 1024
    assert record.platform == "?[2J"
