"""Memory shares: several holders per device within budgets, crash release, the queue, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_VISIBLE, SimulatedPlatform
from accelplat._leasing import (
    ENV_LEASE_DIR,
    ENV_MEMORY_BYTES,
    ENV_MEMORY_FRACTION,
    lease,
    lease_status,
)
from accelplat._types import GIB
from accelplat.errors import ConfigurationError, LeaseTimeoutError

ROOT = Path(__file__).resolve().parent.parent

TWO = {"devices": [{"total": "80GiB", "used": "0GiB"}, {"total": "80GiB", "used": "20GiB"}]}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VISIBLE, raising=False)
    monkeypatch.delenv(ENV_LEASE_DIR, raising=False)


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
    assert f"pid {os.getpid()}: 30.00 GiB" in message
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


def test_the_larger_of_used_and_promised_is_what_is_taken(tmp_path: Path) -> None:
    # a holder using less than its budget still has its budget; one using more has its use
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
    assert f"(simulated.SIM-0) shared by pid {os.getpid()}: 1.00 GiB" in str(info.value)
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
        with pytest.raises(LeaseTimeoutError, match=f"pid {child.pid}: 60.00 GiB"):
            share(plat, tmp_path / "locks", "30GiB").acquire()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        (crashed,) = [r for r in lease_status(tmp_path / "locks") if r.budget_bytes is not None]
        assert (crashed.held, crashed.released, crashed.pid) == (False, False, child.pid)
        share(plat, tmp_path / "locks", "80GiB").acquire().release()  # back at once
    finally:
        child.kill()
        child.wait(timeout=60)


def _queued(lock_dir: Path) -> list[str]:
    queue = lock_dir / "queue"
    return [n for n in os.listdir(queue) if n.endswith(".ticket")] if queue.is_dir() else []


def test_a_large_request_is_not_starved_by_small_ones(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "80GiB"}]})
    first = share(plat, tmp_path, "50GiB").acquire()
    outcome: list[object] = []

    def big() -> None:  # 60 GiB: waits until the 50 GiB holder leaves
        try:
            with lease(memory="60GiB", platform=plat, lock_dir=tmp_path, timeout_s=60):
                outcome.append("got")
        except Exception as exc:  # reported below
            outcome.append(exc)

    waiter = threading.Thread(target=big)
    waiter.start()
    try:
        for _ in range(2000):
            if _queued(tmp_path):
                break
            time.sleep(0.005)
        (ticket,) = _queued(tmp_path)
        assert "~64424509440~1.ticket" in ticket  # 60 GiB, one device
        # 30 GiB room: a 25 GiB newcomer would fit, but it would take the waiter's room
        with pytest.raises(LeaseTimeoutError, match="kept for an older request"):
            share(plat, tmp_path, "25GiB").acquire()
        first.release()
        waiter.join(60)
        assert outcome == ["got"]
    finally:
        first.release()
        waiter.join(60)
    assert _queued(tmp_path) == []  # the ticket left with its waiter
    share(plat, tmp_path, "80GiB").acquire().release()


def test_a_dead_waiters_ticket_is_removed_and_blocks_nobody(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "80GiB"}]})
    queue = tmp_path / "queue"
    queue.mkdir()
    dead = queue / f"simulated~1~{os.getpid()}~0~all~1.ticket"
    dead.write_text("")  # nobody holds its lock
    share(plat, tmp_path, "10GiB").acquire().release()
    assert not dead.exists()


def test_a_whole_device_waiter_is_not_starved_by_shares(tmp_path: Path) -> None:
    plat = sim({"devices": [{"total": "80GiB"}]})
    first = share(plat, tmp_path, "10GiB").acquire()
    got = threading.Event()

    def whole() -> None:
        with lease(platform=plat, lock_dir=tmp_path, timeout_s=60):
            got.set()

    waiter = threading.Thread(target=whole)
    waiter.start()
    try:
        for _ in range(2000):
            if _queued(tmp_path):
                break
            time.sleep(0.005)
        assert _queued(tmp_path)
        with pytest.raises(LeaseTimeoutError, match="kept for an older request"):
            share(plat, tmp_path, "1GiB").acquire()
    finally:
        first.release()
        waiter.join(60)
    assert got.is_set()


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (12, "memory=12 is 12 bytes, below 1 MiB: give a size with a unit ('12GiB')"),
        ("12", "memory"),
        ("12 parsecs", "memory"),
        (-1, "memory"),
        (True, "memory"),
        ("100KiB", "memory must be at least 1MiB"),
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


def test_a_budget_no_device_can_hold_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"have memory=81.00 GiB in total; 1 asked for"):
        share(sim(), tmp_path, "81GiB")
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
            import os, accelplat
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
        assert f"pid {os.getpid()}: 50.00 GiB" in refused  # root's share, read by another user
        assert granted == str(30 * GIB)
        owners = {p.stat().st_uid for p in (shared / "shares").glob("*.json")}
        assert owners == {0, 65534}  # each user wrote its own slots
    finally:
        shutil.rmtree(shared)
