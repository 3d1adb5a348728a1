"""Whose memory it is: attribution, waits on owners (settle, release), on a virtual clock."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import accelplat
from accelplat import _owners
from accelplat._backends.simulated import SimulatedClock, SimulatedPlatform
from accelplat._types import GIB, MIB, HolderState, MemoryHolder, MemoryInfo, ReleaseProfile
from accelplat._vendor import procs
from accelplat.errors import ConfigurationError, MemoryNotSettledError

TOTAL = 80 * GIB
EAGER = {"lazy": False, "stable_duration_s": 0.0, "settle_timeout_s": 60.0}
LAZY = {"lazy": True, "stable_duration_s": 2.0, "settle_timeout_s": 60.0}


def make(*devices: dict[str, Any], release: dict[str, Any] | None = None) -> SimulatedPlatform:
    spec: dict[str, Any] = {"devices": [{"total": TOTAL, **d} for d in devices]}
    spec["release"] = release or EAGER
    return SimulatedPlatform.from_spec(spec, clock=SimulatedClock())


def holder(pid: int, used: Any, state: str = "alive", **more: Any) -> dict[str, Any]:
    return {"pid": pid, "used": used, "state": state, **more}


# -- attribution -------------------------------------------------------------------------------


def test_a_snapshot_says_whose_memory_it_is() -> None:
    platform = make(
        {
            "holders": [
                holder(10, 527 * MIB, "self"),
                holder(11, 2 * GIB, "child", name="engine"),
                holder(12, 20 * GIB, "alive", name="tenant"),
            ]
        }
    )
    owners = accelplat.snapshot(platform=platform).attribution[0]
    assert owners.available
    assert owners.reason == ""
    assert owners.self_bytes == 527 * MIB
    assert [h.pid for h in owners.children] == [11]
    assert owners.children_bytes == 2 * GIB
    assert owners.others_bytes == 20 * GIB
    assert owners.ours_bytes == 527 * MIB + 2 * GIB
    assert "pid 12 'tenant' 20.00 GiB" in owners.describe()


def test_an_exited_child_still_listed_stays_ours_once_seen() -> None:
    gone = MemoryHolder(pid=4242, used_bytes=GIB, state=HolderState.GONE)
    platform = make({"holders": [holder(4242, GIB, "gone")]})
    assert _owners.attribute(platform, 0, GIB, [gone]).others == (gone,)
    procs.remember({4242})
    try:
        assert _owners.attribute(platform, 0, GIB, [gone]).children == (gone,)
    finally:
        procs._seen.discard(4242)


@pytest.mark.parametrize(
    ("device", "fragment"),
    [
        ({"used": GIB, "report_holders": False}, "cannot list the processes"),
        ({"used": 3 * GIB, "holders": [holder(12, GIB)]}, "does not list"),
    ],
    ids=["no process list", "a list that leaves memory unexplained"],
)
def test_attribution_says_plainly_why_not(device: dict[str, Any], fragment: str) -> None:
    platform = make(device)
    owners = accelplat.snapshot(platform=platform).attribution[0]
    assert not owners.available
    assert fragment in owners.reason
    assert owners.self_bytes is None
    assert owners.ours_bytes is None


def test_no_attribution_on_the_host_cpu() -> None:
    platform = accelplat.get_platform("cpu")
    owners = accelplat.snapshot(platform=platform).attribution[0]
    assert "memory is the host's" in owners.reason


def test_holders_without_bytes_are_named_but_not_counted() -> None:
    platform = make({})
    listed = [MemoryHolder(pid=7, used_bytes=None, state=HolderState.ALIVE)]
    owners = _owners.attribute(platform, 0, GIB, listed)
    assert "not their bytes (MIG" in owners.reason
    assert owners.others == tuple(listed)


def test_host_pids_are_not_matched_inside_a_pid_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class HostPids(SimulatedPlatform):
        holder_pids_are_host_pids = True

    spec = {"devices": [{"total": TOTAL, "holders": [holder(5, GIB, "self")]}]}
    platform = HostPids(spec, clock=SimulatedClock())
    assert accelplat.snapshot(platform=platform).attribution[0].available
    monkeypatch.setattr(procs, "foreign_pid_namespace", lambda: True)
    owners = accelplat.snapshot(platform=platform).attribution[0]
    assert owners.reason == _owners.FOREIGN_NAMESPACE


def test_the_pid_namespace_is_read_from_proc() -> None:
    link = os.readlink("/proc/self/ns/pid")
    assert procs.foreign_pid_namespace() is (link != "pid:[4026531836]")


def test_descendants_are_listed_and_remembered() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in procs.descendants()
        assert procs.was_ours(child.pid)
        assert procs.classify_pid(child.pid)[0] is HolderState.CHILD
    finally:
        child.kill()
        child.wait()
    assert procs.was_ours(child.pid)  # gone, still ours


# -- the settle wait on ours -------------------------------------------------------------------


def test_settle_waits_for_our_child_not_for_a_co_tenant() -> None:
    platform = make(
        {
            "holders": [
                holder(11, 30 * GIB, "child", end=4.0),
                holder(12, 20 * GIB, "alive", name="tenant"),
            ]
        }
    )
    result = accelplat.wait_for_memory_to_settle(platform=platform)
    assert result.waited_s == pytest.approx(4.0, abs=0.05)
    assert result.owners == "ours"
    assert "pid 12 'tenant' 20.00 GiB" in result.note
    with pytest.raises(MemoryNotSettledError, match="pid 12 'tenant'"):  # 20 of 80 GiB > 10 %
        accelplat.wait_for_memory_to_settle(platform=platform, owners="all", timeout_s=1)


def test_settle_on_ours_times_out_naming_our_holder_and_the_others() -> None:
    platform = make(
        {"holders": [holder(11, 30 * GIB, "child", name="engine"), holder(12, GIB, "alive")]}
    )
    with pytest.raises(MemoryNotSettledError) as info:
        accelplat.wait_for_memory_to_settle(platform=platform, timeout_s=2)
    text = str(info.value)
    assert "this process and its descendants held did not come back" in text
    assert "ours 30.00 GiB" in text
    assert "pid 11 'engine' (child) 30.00 GiB" in text
    assert "others, not waited for: pid 12 (alive) 1.00 GiB" in text
    assert info.value.snapshot.memory[0].used == 31 * GIB  # the real reading


def test_settle_falls_back_to_the_whole_device_and_says_why() -> None:
    platform = make({"used": GIB, "report_holders": False})
    result = accelplat.wait_for_memory_to_settle(platform=platform)
    assert result.already_settled
    assert "judged whole" in result.note
    assert "cannot list" in result.note


def test_settle_owners_must_be_ours_or_all() -> None:
    with pytest.raises(ConfigurationError, match="owners must be 'ours' or 'all'"):
        accelplat.wait_for_memory_to_settle(platform=make({}), owners="mine")


# -- wait_for_release --------------------------------------------------------------------------


def test_release_returns_at_the_first_sample_without_the_holder() -> None:
    platform = make({"holders": [holder(11, 8 * GIB, "child", end=1.5), holder(12, GIB)]})
    result = accelplat.wait_for_release([11], platform=platform, descendants=False)
    assert 1.5 <= result.waited_s <= 1.5 + 0.04 + 1e-9  # at most one longest poll late
    assert not result.already_settled
    assert [h.pid for h in result.snapshot.holders[0]] == [12]


def test_release_of_a_process_that_holds_nothing_is_immediate() -> None:
    platform = make({"holders": [holder(12, GIB)]})
    result = accelplat.wait_for_release([99], platform=platform, descendants=False)
    assert result.already_settled
    assert result.polls == 1


def test_a_dead_process_still_listed_is_still_holding() -> None:
    platform = make({"holders": [holder(11, 8 * GIB, "gone", end=3.0)]})
    result = accelplat.wait_for_release([11], platform=platform, descendants=False)
    assert result.waited_s == pytest.approx(3.0, abs=0.05)


def test_on_a_lazy_platform_release_waits_for_the_counter_to_move() -> None:
    # KFD drops the process's files at t=1; TTM frees its 8 GiB at t=3 (the step down).
    platform = make(
        {
            "used": 0,
            "timeline": [{"at": 1.0, "used": 8 * GIB}, {"at": 3.0, "used": 0}],
            "holders": [holder(11, 8 * GIB, "gone", end=1.0)],
        },
        release=LAZY,
    )
    result = accelplat.wait_for_release([11], platform=platform, descendants=False)
    assert result.waited_s == pytest.approx(3.0, abs=0.05)


def test_release_times_out_naming_who_still_holds() -> None:
    platform = make({"holders": [holder(11, 8 * GIB, "alive", name="server")]})
    with pytest.raises(MemoryNotSettledError) as info:
        accelplat.wait_for_release([11], platform=platform, timeout_s=1, descendants=False)
    assert "processes 11 did not release device memory within 1.00 s" in str(info.value)
    assert "still listed: pid 11 'server' (alive) 8.00 GiB" in str(info.value)


def test_release_without_attribution_waits_for_exit_then_a_quiet_counter() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    platform = make(
        {"used": 8 * GIB, "report_holders": False, "timeline": [{"at": 0.5, "used": GIB}]}
    )
    try:
        with pytest.raises(MemoryNotSettledError, match="still running: "):
            accelplat.wait_for_release([child.pid], platform=platform, timeout_s=1)
    finally:
        child.kill()
        child.wait()
    result = accelplat.wait_for_release([child.pid], platform=platform, timeout_s=5)
    assert "judged whole" in result.note
    assert result.waited_s == pytest.approx(_FALLBACK, abs=0.05)


_FALLBACK = 1.0  # accelplat._memory.FALLBACK_RELEASE_WINDOW_S


@pytest.mark.parametrize(
    ("pids", "match"),
    [([], "non-empty"), ("12", "non-empty"), ([0], r"pids\[0\]"), ([True], r"pids\[0\]")],
)
def test_release_arguments_are_checked(pids: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        accelplat.wait_for_release(pids, platform=make({}))


class _Racing:
    """A device whose co-tenant frees 6 GiB between the counter and the process list."""

    name = "racing"
    release = ReleaseProfile(lazy=False, stable_duration_s=0, settle_timeout_s=1)

    def __init__(self) -> None:
        self.reads = 0

    def memory_info(self, device: int) -> MemoryInfo:
        self.reads += 1
        used = 7 * GIB if self.reads == 1 else GIB
        return MemoryInfo(free=TOTAL - used, total=TOTAL, used=used)

    def memory_holders(self, device: int) -> list[MemoryHolder]:
        return [MemoryHolder(pid=12, used_bytes=GIB, state=HolderState.ALIVE)]


def test_a_co_tenant_freeing_between_two_driver_calls_is_read_again() -> None:
    platform = _Racing()
    reading = _owners.sample(platform, [0])  # type: ignore[arg-type]
    assert reading.memory[0].used == GIB
    assert platform.reads == 2
    assert reading.attribution[0].available
    assert reading.attribution[0].others_bytes == GIB


def test_ours_is_this_process_and_its_descendants_by_the_one_rule() -> None:
    platform = make(
        {
            "holders": [
                holder(os.getpid(), GIB, "self"),
                holder(11, 2 * GIB, "child"),
                holder(12, GIB),
            ]
        }
    )
    assert _owners.sample(platform, (0,)).attribution[0].ours_bytes == 3 * GIB
    hidden = make({"used": GIB, "report_holders": False})
    assert _owners.sample(hidden, (0,)).attribution[0].ours_bytes is None


def test_held_by_tree_counts_running_processes_not_exited_ones_still_listed() -> None:
    me, other = os.getpid(), 10**7 + 2  # another process, whose tree is read from the table
    holders = [
        MemoryHolder(pid=me, used_bytes=1 * GIB, state=HolderState.SELF),
        MemoryHolder(pid=10**7, used_bytes=2 * GIB, state=HolderState.CHILD),
        # a test body that ended: its memory is still coming back, beside every promise
        MemoryHolder(pid=10**7 + 1, used_bytes=4 * GIB, state=HolderState.GONE),
        MemoryHolder(pid=other, used_bytes=8 * GIB, state=HolderState.ALIVE),
    ]
    assert _owners.held_by_tree(holders, me) == 3 * GIB
    assert _owners.held_by_tree(holders, other) == 8 * GIB
