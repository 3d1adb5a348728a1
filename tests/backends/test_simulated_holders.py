"""SimulatedPlatform.set_holder: simulated processes taking and giving back memory on one clock."""

from __future__ import annotations

import pytest

from accelplat._backends.simulated import SimulatedClock, SimulatedHolder, SimulatedPlatform
from accelplat._types import GIB, HolderState
from accelplat.errors import ConfigurationError


def test_holders_come_replace_by_pid_and_go() -> None:
    clock = SimulatedClock()
    plat = SimulatedPlatform({"devices": [{"total": "80GiB", "used": "1GiB"}]}, clock=clock)
    plat.set_holder(0, SimulatedHolder(used=30 * GIB, pid=101, state="child"))
    plat.set_holder(0, SimulatedHolder(used=20 * GIB, pid=102))
    assert plat.memory_info(0).used == 51 * GIB
    assert {(h.pid, h.state) for h in plat.memory_holders(0) or ()} == {
        (101, HolderState.CHILD),
        (102, HolderState.ALIVE),
    }
    clock.advance(5)
    plat.set_holder(0, SimulatedHolder(used=30 * GIB, start=0, end=6, pid=101))  # exits at 6 s
    assert plat.memory_info(0).used == 51 * GIB
    clock.advance(1)
    assert plat.memory_info(0).used == 21 * GIB
    plat.set_holder(0, SimulatedHolder(used=GIB, start=7, pid=103))  # the ended one is dropped
    assert [h.pid for h in plat.spec.devices[0].holders] == [102, 103]


def test_a_holder_beyond_the_total_is_an_out_of_memory() -> None:
    plat = SimulatedPlatform({"devices": [{"total": "80GiB"}]}, clock=SimulatedClock())
    plat.set_holder(0, SimulatedHolder(used=60 * GIB, pid=1))
    with pytest.raises(ConfigurationError, match="would exceed its total"):
        plat.set_holder(0, SimulatedHolder(used=21 * GIB, pid=2))
    plat.set_holder(0, SimulatedHolder(used=80 * GIB, pid=1))  # replacing its own is fine
    with pytest.raises(IndexError):
        plat.set_holder(1, SimulatedHolder(used=GIB, pid=3))
