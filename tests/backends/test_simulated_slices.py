"""Simulated slices (MIG instances): the spec's ``slices``, the lease units, a child's view."""

from __future__ import annotations

from typing import Any

import pytest

from accelplat._backends.simulated import ENV_VISIBLE, SimulatedPlatform
from accelplat._types import GIB
from accelplat.errors import ConfigurationError

SLICE = {"name": "1g.18gb", "total": "17.75GiB"}
HOST = {
    "devices": [
        {"name": "H200", "total": "140GiB", "slices": [SLICE, {**SLICE, "uuid": "MIG-x"}]},
        {"name": "H200", "total": "140GiB"},
    ]
}


@pytest.fixture(autouse=True)
def _no_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VISIBLE, raising=False)


def test_the_units_are_each_slice_and_each_device_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plat = SimulatedPlatform(HOST)
    assert [d.uuid for d in plat.devices()] == ["SIM-0", "SIM-1"]  # the GPUs themselves
    assert plat.lease_units() == ("MIG-SIM-0-0", "MIG-x", "SIM-1")
    monkeypatch.setenv(ENV_VISIBLE, "SIM-1")
    assert plat.lease_units() == ()  # no slice visible: the visible devices are the units
    monkeypatch.setenv(ENV_VISIBLE, "MIG-x")
    assert plat.lease_units() == ()  # given one slice: it is the unit


def test_a_child_given_a_slice_sees_that_slice_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    plat = SimulatedPlatform(HOST)
    view = plat.restricted("MIG-x")
    (device,) = view.devices()
    assert (device.index, device.physical_index, device.name, device.uuid) == (
        0,
        0,
        "1g.18gb",
        "MIG-x",
    )
    assert view.memory_info(0).total == int(17.75 * GIB)
    assert plat.device_count() == 2  # the view is its own; the platform is unchanged
    monkeypatch.setenv(ENV_VISIBLE, "MIG-x,SIM-1")  # as CUDA: one MIG device at most
    assert [d.uuid for d in SimulatedPlatform(HOST).devices()] == ["MIG-x"]
    monkeypatch.setenv(ENV_VISIBLE, "SIM-1,MIG-x")
    assert [d.uuid for d in SimulatedPlatform(HOST).devices()] == ["SIM-1"]


def test_a_slice_holds_memory_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelplat._backends.simulated import SimulatedHolder

    monkeypatch.setenv(ENV_VISIBLE, "MIG-SIM-0-0")
    plat = SimulatedPlatform(HOST)
    plat.set_holder(0, SimulatedHolder(used=4 * GIB, pid=42))
    assert plat.memory_info(0).used == 4 * GIB
    assert [h.pid for h in plat.memory_holders(0) or ()] == [42]
    with pytest.raises(ConfigurationError, match="exceed its total"):
        plat.set_holder(0, SimulatedHolder(used=14 * GIB, pid=43))  # 18 GiB on a 17.75 slice


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ({"total": "16GiB", "slices": [{"total": "9GiB"}] * 2}, "slices' totals exceed total"),
        ({"total": "80GiB", "slices": [{"total": "1GiB"}] * 9}, "slices"),
        ({"total": "80GiB", "slices": [{"total": "1GiB", "slices": []}]}, "slices"),
        ({"total": "80GiB", "slices": [{"total": "1GiB", "count": 2}]}, "count"),
        ({"total": "80GiB", "slices": {"total": "1GiB"}}, "slices"),
        ({"total": "80GiB", "slices": [{"total": "lots"}]}, r"slices\[0\]\.total"),
    ],
)
def test_bad_slices_are_refused_naming_the_field(device: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SimulatedPlatform({"devices": [device]})
