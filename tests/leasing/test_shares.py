"""Memory shares: several holders per device within budgets, the share rule with owners, all or
nothing across devices, crash release, bad input, users sharing a directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_VISIBLE, SimulatedClock, SimulatedPlatform
from accelplat._leasing import lease, lease_status
from accelplat._leasing._locks import try_lock, unlock
from accelplat._leasing._shares import ENV_MEMORY_BYTES, ENV_MEMORY_FRACTION
from accelplat._types import GIB
from accelplat.errors import ConfigurationError, LeaseTimeoutError, LeaseUnsatisfiableError
from tests.leasing._common import ROOT, as_root, exit_code, fork_as, shared_dir

TWO = {"devices": [{"total": "80GiB", "used": "0GiB"}, {"total": "80GiB", "used": "20GiB"}]}


def sim(spec: dict[str, Any] = TWO) -> SimulatedPlatform:
    return SimulatedPlatform(spec)


def share(plat: SimulatedPlatform, lock_dir: Path, memory: str | int, **kw: Any) -> Any:
    return lease(memory=memory, platform=plat, lock_dir=lock_dir, timeout_s=0, **kw)


def test_shares_pack_one_device_while_budgets_fit(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "80GiB"}]})
    held = [share(plat, tmp_path, "30GiB").acquire(), share(plat, tmp_path, "30GiB").acquire()]
    assert all(h.device_ids == held[0].device_ids for h in held)  # the same device, twice
    share(plat, tmp_path, "20GiB").acquire().release()  # 80 - 60 = 20 left: fits exactly
    with pytest.raises(LeaseTimeoutError) as info:
        share(plat, tmp_path, "21GiB").acquire()
    message = str(info.value)
    assert "room for memory=21.00 GiB" in message
    assert "60.00 GiB promised" in message
    assert f"30.00 GiB to pid {os.getpid()} (" in message
    held[0].release()
    share(plat, tmp_path, "50GiB").acquire().release()  # its budget came back
    held[1].release()


def test_memory_in_use_beyond_the_budgets_counts(tmp_path: Path) -> None:
    # device 1 has 20 GiB used by someone without a lease: only 60 GiB room there
    plat = sim()
    with share(plat, tmp_path, "70GiB") as big:
        assert [d.index for d in big.devices] == [0]
    with share(plat, tmp_path, "60GiB", count=2) as both:
        assert sorted(d.index for d in both.devices) == [0, 1]
    with pytest.raises(LeaseTimeoutError):
        share(plat, tmp_path, "61GiB", count=2).acquire()


def test_without_holders_the_larger_of_used_and_promised_is_what_is_taken(tmp_path: Path) -> None:
    # the driver lists no holders: the 50 GiB used may be the share's own
    plat = sim({"devices": [{"total": "80GiB", "used": "50GiB"}]})
    with share(plat, tmp_path, "20GiB"):  # promised 20, used 50: 30 room
        share(plat, tmp_path, "30GiB").acquire().release()
        with pytest.raises(LeaseTimeoutError):
            share(plat, tmp_path, "31GiB").acquire()


def test_all_or_nothing_across_devices(tmp_path: Path) -> None:
    plat = sim()
    with share(plat, tmp_path, "50GiB"):  # takes device 0 (most room)
        with pytest.raises(LeaseTimeoutError):
            share(plat, tmp_path, "40GiB", count=2).acquire()
        records = [r for r in lease_status(tmp_path) if r.budget_bytes is not None]
        assert [(r.held, r.budget_bytes) for r in records] == [(True, 50 * GIB)]


def test_whole_devices_and_shares_exclude_each_other(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "80GiB"}]})
    whole = lease(platform=plat, lock_dir=tmp_path, timeout_s=0)
    with share(plat, tmp_path, "1GiB"), pytest.raises(LeaseTimeoutError) as info:
        whole.acquire()
    assert f"(simulated.SIM-0) shared by 1.00 GiB to pid {os.getpid()} (" in str(info.value)
    with whole, pytest.raises(LeaseTimeoutError, match="leased whole"):
        share(plat, tmp_path, "1GiB").acquire()


def test_a_share_environment_carries_the_budget(tmp_path: Path) -> None:
    plat = sim()
    with share(plat, tmp_path, "20GiB") as held:
        assert held.environ == {
            ENV_VISIBLE: "SIM-0",
            ENV_MEMORY_BYTES: str(20 * GIB),
            ENV_MEMORY_FRACTION: "0.250000",
        }
    with lease(platform=plat, lock_dir=tmp_path) as whole:
        assert ENV_MEMORY_BYTES not in whole.environ


def test_a_killed_share_holder_gives_its_budget_back_at_once(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text('{"devices": [{"total": "80GiB"}]}')
    holder = textwrap.dedent(
        """
        import sys, accelplat
        from accelplat._backends.simulated import SimulatedPlatform
        held = accelplat.lease(memory="60GiB", platform=SimulatedPlatform(sys.argv[1]),
                               lock_dir=sys.argv[2]).acquire()
        print("held", flush=True)
        sys.stdin.read()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", holder, str(spec), str(tmp_path / "locks")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"held\n"
        plat = SimulatedPlatform(spec)
        with pytest.raises(LeaseTimeoutError, match=f"60.00 GiB to pid {child.pid} "):
            share(plat, tmp_path / "locks", "30GiB").acquire()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        (crashed,) = [r for r in lease_status(tmp_path / "locks") if r.budget_bytes is not None]
        assert (crashed.held, crashed.released, crashed.pid) == (False, False, child.pid)
        share(plat, tmp_path / "locks", "80GiB").acquire().release()  # back at once
    finally:
        child.kill()
        child.wait(timeout=60)


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (12, "memory=12 is 12 bytes, below 1 MiB: give a size with a unit ('12GiB')"),
        ("9" * 330 + "GiB", "memory must be from 1MiB to 8EiB, got '99999"),
        (2**63, "memory must be from 1MiB to 8EiB"),
        ("12", "memory"),
        ("12 parsecs", "memory"),
        (-1, "memory"),
        (True, "memory"),
        ("100KiB", "memory must be from 1MiB"),
        (1.5, "memory"),
    ],
    ids=str,
)
def test_bad_budgets_are_refused_naming_the_argument(
    tmp_path: Path, memory: Any, expected: str
) -> None:
    with pytest.raises(ConfigurationError, match="memory") as info:
        share(sim(), tmp_path, memory)
    assert expected in str(info.value)


def test_a_budget_no_device_can_hold_can_never_be_leased(tmp_path: Path) -> None:
    with pytest.raises(LeaseUnsatisfiableError, match=r"for memory=81.00 GiB; 1 asked for"):
        share(sim(), tmp_path, "81GiB")
    with pytest.raises(LeaseUnsatisfiableError, match=r"only 0 of 2 visible device"):
        share(sim(), tmp_path, 80 * GIB + 1, count=2)
    with pytest.raises(ConfigurationError, match="give one or the other"):
        share(sim(), tmp_path, "8GiB", min_free_bytes=GIB)


def test_a_share_with_a_budget_it_cannot_read_counts_as_the_whole_device(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "80GiB"}]})
    with share(plat, tmp_path, "1GiB") as held:
        (meta,) = (tmp_path / "shares").glob("*.json")
        meta.write_text('{"budget_bytes": "lots"}')  # planted or damaged
        with pytest.raises(LeaseTimeoutError, match=r"80\.00 GiB promised"):
            share(plat, tmp_path, "1GiB").acquire()
        assert held.held


def test_the_environment_grant_is_respected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VISIBLE, "SIM-1")
    with share(sim(), tmp_path, "10GiB") as held:
        assert [d.uuid for d in held.devices] == ["SIM-1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as a second user")
def test_users_sharing_a_directory_count_each_others_shares() -> None:
    import json
    import shutil
    import tempfile

    from accelplat._backends.simulated import ENV_SPEC

    shared = Path(tempfile.mkdtemp(prefix="accelplat-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        spec = shared / "spec.json"
        spec.write_text(json.dumps({"devices": [{"total": "80GiB"}]}))
        spec.chmod(0o644)
        plat = SimulatedPlatform(spec)
        mine = lease(memory="50GiB", platform=plat, lock_dir=shared, timeout_s=0).acquire()
        script = textwrap.dedent(
            f"""
            import os, psutil, accelplat  # psutil too: after seteuid the stdlib is unreadable
            from accelplat.errors import LeaseTimeoutError
            accelplat.lease(memory="1GiB", timeout_s=0, lock_dir=os.environ["TMPDIR"])
            os.setegid(65534)
            os.seteuid(65534)
            try:
                accelplat.lease(memory="40GiB", timeout_s=0, lock_dir={str(shared)!r}).acquire()
            except LeaseTimeoutError as exc:
                print(exc)
            with accelplat.lease(memory="30GiB", timeout_s=0, lock_dir={str(shared)!r}) as held:
                print(held.environ["ACCELPLAT_LEASE_MEMORY_BYTES"])
            """
        )
        env = {**os.environ, "ACCELPLAT_PLATFORM": "simulated", ENV_SPEC: str(spec)}
        env.update({"PYTHONPATH": str(ROOT), "TMPDIR": tempfile.mkdtemp()})
        env.pop(ENV_VISIBLE, None)
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        mine.release()
        assert done.returncode == 0, done.stderr
        refused, granted = done.stdout.splitlines()
        assert f"50.00 GiB to pid {os.getpid()} " in refused  # root's share, read by another user
        assert granted == str(30 * GIB)
        owners = {p.stat().st_uid for p in (shared / "shares").glob("*.json")}
        assert owners == {0, 65534}  # each user wrote its own slots
    finally:
        shutil.rmtree(shared)


# --------------------------------------------------------------------------------------------
# the share rule with owners (docs/leasing.md, "What fits")

STRANGER = 2**31 - 2  # a pid no lease holder's tree holds


def test_the_worked_example_others_memory_counts_beside_each_budget(tmp_path: Path) -> None:
    # 15 GiB promised on a 16 GiB device whose other processes use 1 GiB: nothing is left
    # (the rule before owners, 16 - max(1, 15), left 1 GiB to another share)
    others = {"used": "1GiB", "pid": STRANGER, "name": "someone else"}
    plat = sim({"devices": [{"total": "16GiB", "holders": [others]}]})
    with share(plat, tmp_path, "15GiB"), pytest.raises(LeaseTimeoutError) as info:
        share(plat, tmp_path, "512MiB").acquire()
    assert "0 B room (1.00 GiB used, 15.00 GiB promised" in str(info.value)
    assert "1.00 GiB of it used by others" in str(info.value)
    share(plat, tmp_path, "15GiB").acquire().release()  # its budget came back


def test_a_holder_using_more_than_its_budget_counts_its_use(tmp_path: Path) -> None:
    ours = {"used": "10GiB", "pid": os.getpid()}  # this process holds the 4 GiB share
    others = {"used": "1GiB", "pid": STRANGER}
    plat = sim({"devices": [{"total": "16GiB", "holders": [others, ours]}]})
    with share(plat, tmp_path, "4GiB"):
        share(plat, tmp_path, "5GiB").acquire().release()  # 16 - 1 - max(4, 10)
        with pytest.raises(LeaseTimeoutError, match=r"5\.00 GiB room"):
            share(plat, tmp_path, "6GiB").acquire()


TREE_HOLDER = textwrap.dedent(
    """
    import subprocess, sys, accelplat
    from accelplat._backends.simulated import SimulatedPlatform
    plat = SimulatedPlatform({"devices": [{"total": "16GiB"}]})
    held = accelplat.lease(memory="8GiB", platform=plat, lock_dir=sys.argv[1], timeout_s=0)
    held.acquire()
    worker = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    print(worker.pid, flush=True)
    sys.stdin.read()
    worker.communicate(b"\\n")
    """
)


def test_a_holders_use_is_its_process_trees(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", TREE_HOLDER, str(tmp_path)]
    holder = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        worker = int(holder.stdout.readline())  # the holder's child, using 3 GiB of its 8
        holders = [{"used": "3GiB", "pid": worker}, {"used": "1GiB", "pid": STRANGER}]
        plat = sim({"devices": [{"total": "16GiB", "holders": holders}]})
        share(plat, tmp_path, "7GiB").acquire().release()  # 16 - 1 - max(8, 3)
        with pytest.raises(LeaseTimeoutError, match=r"1\.00 GiB of it used by others"):
            share(plat, tmp_path, "7.5GiB").acquire()
    finally:
        holder.communicate(b"", timeout=60)


def test_a_budget_on_each_of_two_devices_all_or_nothing(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "16GiB"}, {"total": "16GiB"}]})
    with share(plat, tmp_path, "10GiB", count=2) as both:
        assert len(set(both.device_ids)) == 2  # never both budgets on one card
        slots = [r for r in lease_status(tmp_path) if r.budget_bytes is not None]
        assert sorted((r.device_id, r.budget_bytes) for r in slots) == [
            ("simulated.SIM-0", 10 * GIB),
            ("simulated.SIM-1", 10 * GIB),
        ]
        with pytest.raises(LeaseTimeoutError, match="fewer than 1 device"):
            share(plat, tmp_path, "7GiB").acquire()  # 6 GiB left on each
    lopsided = sim({"devices": [{"total": "80GiB"}, {"total": "16GiB", "used": "10GiB"}]})
    with pytest.raises(LeaseTimeoutError, match=r"device 1: 6\.00 GiB room"):
        share(lopsided, tmp_path / "b", "10GiB", count=2).acquire()  # 80 GiB free is one card
    assert [r for r in lease_status(tmp_path / "b") if r.held] == []  # nothing kept of a part


def test_a_held_admission_lock_is_waited_for_up_to_the_deadline_and_named(
    tmp_path: Path,
) -> None:
    clock = SimulatedClock()
    plat = SimulatedPlatform({"devices": [{"total": "16GiB"}]}, clock=clock)
    (tmp_path / "queue").mkdir()
    admit = tmp_path / "queue" / "simulated.admit"
    guard = try_lock(admit)  # another leaser stopped with Ctrl-Z inside its admission
    try:
        held = lease(memory="1GiB", platform=plat, lock_dir=tmp_path, timeout_s=5)
        with pytest.raises(LeaseTimeoutError) as info:
            held.acquire()
        assert clock.monotonic() == pytest.approx(5.0, abs=0.1)  # the deadline, not for ever
        assert f"{admit} is held by pid {os.getpid()} (" in str(info.value)
    finally:
        assert guard is not None
        unlock(guard)
    lease(memory="1GiB", platform=plat, lock_dir=tmp_path, timeout_s=0).acquire().release()


# --------------------------------------------------------------------------------------------
# other users of a shared directory, with their own umask (real uids: root only)


def _hold(plat: SimulatedPlatform, shared: Path, memory: str) -> tuple[int, int]:
    """A share held by uid 65534 under umask 077 until the returned descriptor is written."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def hold() -> None:
        with lease(memory=memory, platform=plat, lock_dir=shared, timeout_s=0):
            os.write(ready_w, b"x")
            os.read(go_r, 1)

    pid = fork_as(65534, 0o077, hold)
    assert os.read(ready_r, 1) == b"x"
    return pid, go_w


@as_root
def test_another_users_share_counts_whatever_its_umask() -> None:
    with shared_dir({"devices": [{"total": "16GiB"}]}) as (shared, spec):
        plat = SimulatedPlatform(spec)
        pid, go = _hold(plat, shared, "12GiB")

        def other() -> None:  # another user: the 0644 slot, document and admission lock open
            with pytest.raises(LeaseTimeoutError, match=r"12\.00 GiB promised"):
                lease(memory="8GiB", platform=plat, lock_dir=shared, timeout_s=0).acquire()
            lease(memory="4GiB", platform=plat, lock_dir=shared, timeout_s=0).acquire().release()

        try:
            assert exit_code(fork_as(65533, 0o022, other)) == 0
        finally:
            os.write(go, b"x")
            assert exit_code(pid) == 0


@as_root
def test_a_slot_that_cannot_be_told_counts_as_held() -> None:
    with shared_dir({"devices": [{"total": "16GiB"}]}) as (shared, spec):
        (shared / "shares").mkdir(mode=0o1777)
        (shared / "shares").chmod(0o1777)
        for suffix in (".lock", ".json"):  # an older version's, under umask 077: unreadable
            path = shared / "shares" / f"simulated.SIM-0.65534-0{suffix}"
            path.touch(mode=0o600)
            os.chown(path, 65534, 65534)
        plat = SimulatedPlatform(spec)

        def other() -> None:
            with pytest.raises(LeaseTimeoutError, match=r"16\.00 GiB promised"):
                lease(memory="1GiB", platform=plat, lock_dir=shared, timeout_s=0).acquire()

        assert exit_code(fork_as(65533, 0o022, other)) == 0


@as_root
def test_an_admission_lock_others_cannot_open_is_named() -> None:
    with shared_dir({"devices": [{"total": "16GiB"}]}) as (shared, spec):
        (shared / "queue").mkdir()
        (shared / "queue").chmod(0o1777)
        admit = shared / "queue" / "simulated.admit"
        admit.touch(mode=0o600)  # an older version's, under umask 077
        os.chown(admit, 65534, 65534)
        plat = SimulatedPlatform(spec)

        def other() -> None:
            with pytest.raises(ConfigurationError, match=f"{admit} cannot be opened") as info:
                lease(memory="1GiB", platform=plat, lock_dir=shared, timeout_s=0).acquire()
            assert not isinstance(info.value, LeaseUnsatisfiableError)

        assert exit_code(fork_as(65533, 0o022, other)) == 0
        pid, go = _hold(plat, shared, "1GiB")  # its owner still uses it, and opens it up
        os.write(go, b"x")
        assert exit_code(pid) == 0
        assert admit.stat().st_mode & 0o777 == 0o644
