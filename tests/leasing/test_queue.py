"""The queue: tickets, their order rule (the oldest waiter first), dead waiters, strays, users."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import SimulatedPlatform
from accelplat._leasing import lease
from accelplat._leasing._locks import LeaseRecord, read_holder
from accelplat._leasing._queue import kept_free
from accelplat._types import GIB
from accelplat.errors import LeaseTimeoutError
from tests.leasing._common import as_root, exit_code, fork_as, shared_dir

ONE = {"devices": [{"total": "80GiB"}]}


def share(plat: SimulatedPlatform, lock_dir: Path, memory: str, **kw: Any) -> Any:
    return lease(memory=memory, platform=plat, lock_dir=lock_dir, timeout_s=0, **kw)


def _tickets(lock_dir: Path) -> list[Path]:
    queue = lock_dir / "queue"
    return sorted(queue.glob("*.ticket")) if queue.is_dir() else []


def test_the_order_rule_keeps_what_the_oldest_waiter_waits_for() -> None:
    assert kept_free(None, 80 * GIB) == 0  # nobody older waits: nothing kept
    assert kept_free(LeaseRecord(budget_bytes=None), 80 * GIB) == 80 * GIB  # a whole device
    assert kept_free(LeaseRecord(budget_bytes=60 * GIB), 80 * GIB) == 60 * GIB  # its budget


def test_a_large_request_is_not_starved_by_small_ones(tmp_path: Path) -> None:
    plat = SimulatedPlatform(ONE)
    first = share(plat, tmp_path, "50GiB").acquire()
    big = share(plat, tmp_path, "60GiB")
    assert big.try_acquire() is not None  # refused: it keeps its place in the queue
    (ticket,) = _tickets(tmp_path)
    said = read_holder(ticket)  # the request, in the holder document's format
    assert (said.budget_bytes, said.pid) == (60 * GIB, os.getpid())
    # 30 GiB room: a 25 GiB newcomer would fit, but it would take the waiter's room
    with pytest.raises(LeaseTimeoutError, match=r"kept for an older request \(pid"):
        share(plat, tmp_path, "25GiB").acquire()
    first.release()
    assert big.try_acquire() is None
    assert _tickets(tmp_path) == []  # the ticket left with its waiter
    big.release()
    share(plat, tmp_path, "80GiB").acquire().release()


def test_a_whole_device_waiter_is_not_starved_by_shares(tmp_path: Path) -> None:
    plat = SimulatedPlatform(ONE)
    first = share(plat, tmp_path, "10GiB").acquire()
    got = threading.Event()

    def whole() -> None:
        with lease(platform=plat, lock_dir=tmp_path, timeout_s=60):
            got.set()

    waiter = threading.Thread(target=whole)
    waiter.start()
    try:
        for _ in range(2000):
            if _tickets(tmp_path):
                break
            time.sleep(0.005)
        assert _tickets(tmp_path)
        with pytest.raises(LeaseTimeoutError, match="kept for an older request"):
            share(plat, tmp_path, "1GiB").acquire()
    finally:
        first.release()
        waiter.join(60)
    assert got.is_set()


def test_a_dead_waiters_ticket_is_removed_and_blocks_nobody(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    dead = queue / f"simulated~1~{os.getpid()}~0.ticket"
    dead.write_text('{"budget_bytes": null, "count": 1}')  # nobody holds its lock
    share(SimulatedPlatform(ONE), tmp_path, "10GiB").acquire().release()
    assert not dead.exists()


def test_strays_in_the_queue_hide_no_ticket(tmp_path: Path) -> None:
    plat = SimulatedPlatform(ONE)
    first = share(plat, tmp_path, "50GiB").acquire()
    big = share(plat, tmp_path, "60GiB")
    assert big.try_acquire() is not None
    for i in range(5000):  # names that sort before the tickets: none of them is one
        (tmp_path / "queue" / f"a-stray-{i:05}").touch()
    with pytest.raises(LeaseTimeoutError, match="kept for an older request"):
        share(plat, tmp_path, "25GiB").acquire()
    big.release()
    first.release()


@as_root
def test_another_users_ticket_is_seen_whatever_its_umask() -> None:
    with shared_dir(ONE) as (shared, spec):
        plat = SimulatedPlatform(spec)
        first = share(plat, shared, "50GiB").acquire()
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()

        def wait_in_the_queue() -> None:
            big = share(plat, shared, "60GiB")
            assert big.try_acquire() is not None
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            big.release()

        def newcomer() -> None:
            with pytest.raises(LeaseTimeoutError, match="kept for an older request"):
                share(plat, shared, "25GiB").acquire()

        waiter = fork_as(65534, 0o077, wait_in_the_queue)
        try:
            assert os.read(ready_r, 1) == b"x"
            assert exit_code(fork_as(65533, 0o022, newcomer)) == 0
        finally:
            os.write(go_w, b"x")
            assert exit_code(waiter) == 0
            first.release()
