"""ZE_FLAT_DEVICE_HIERARCHY, ZE_AFFINITY_MASK and ONEAPI_DEVICE_SELECTOR."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelplat._visible.oneapi import (
    Hierarchy,
    XpuTarget,
    apply_device_selector,
    default_devices,
    parse_affinity_mask,
    parse_hierarchy,
    visible_targets,
)
from accelplat.errors import ConfigurationError

T = XpuTarget
TWO_BY_FOUR = [4, 4]  # the specification's example: two cards of four tiles
MIXED = [2, 1]  # a two-tile card, then a single-tile card
FLAT, COMPOSITE, COMBINED = Hierarchy.FLAT, Hierarchy.COMPOSITE, Hierarchy.COMBINED


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, COMPOSITE),  # the specification's default, and the driver's for most GPUs
        ("", COMPOSITE),
        ("FLAT", FLAT),
        ("COMPOSITE", COMPOSITE),
        ("COMBINED", COMBINED),
        ("composite", COMPOSITE),  # the driver compares exactly; anything else is the default
    ],
)
def test_hierarchy(value, expected):
    assert parse_hierarchy(value) is expected


@pytest.mark.parametrize("value", [None, "", "flat", "bogus"])
def test_hierarchy_default_is_the_callers(value):
    # a Data Center GPU Max on a 23.43+ driver defaults to FLAT
    assert parse_hierarchy(value, FLAT) is FLAT


def test_default_devices_by_model():
    assert default_devices(MIXED, FLAT) == [T(0, (0,)), T(0, (1,)), T(1)]
    assert default_devices(MIXED, COMBINED) == [T(0, (0,)), T(0, (1,)), T(1)]
    assert default_devices(MIXED, COMPOSITE) == [T(0), T(1)]


# -- ZE_AFFINITY_MASK, FLAT ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, list(range(8))),
        ("", list(range(8))),
        ("default", list(range(8))),
        ("0", [0]),  # tile 0 of card 0
        ("1", [1]),  # tile 1 of card 0
        ("0, 4", [0, 4]),  # white space allowed, as in the specification's examples
        ("1,2,7", [1, 2, 7]),
        ("7,1", [1, 7]),  # the mask never reorders
        ("3,3", [3]),
        ("2,99", [2]),  # out of range is ignored
    ],
)
def test_affinity_mask_flat(value, expected):
    devices = default_devices(TWO_BY_FOUR, FLAT)
    assert parse_affinity_mask(value, TWO_BY_FOUR, FLAT) == [devices[i] for i in expected]


def test_affinity_mask_flat_maps_to_cards_and_tiles():
    assert parse_affinity_mask("1,2", MIXED, FLAT) == [T(0, (1,)), T(1)]


@pytest.mark.parametrize("hierarchy", [FLAT, COMBINED])
def test_affinity_mask_sub_device_form_is_invalid_in_flat(hierarchy):
    with pytest.raises(ConfigurationError, match=r"ZE_AFFINITY_MASK.*'0\.1'.*COMPOSITE"):
        parse_affinity_mask("0.1", TWO_BY_FOUR, hierarchy)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0x1", [T(0, (1,))]),  # std::stoul(s, nullptr, 0): hex
        ("02", [T(1)]),  # octal 2
        ("010", []),  # octal 8: out of range, ignored
        ("1abc", [T(0, (1,))]),  # reading stops at the first non-digit
        (" 2", [T(1)]),
        ("-1", []),  # stoul wraps a negative around: out of range
    ],
)
def test_affinity_mask_numbers_are_read_as_the_driver_reads_them(value, expected):
    assert parse_affinity_mask(value, MIXED, FLAT) == expected


def test_affinity_mask_composite_numbers_are_read_as_the_driver_reads_them():
    assert parse_affinity_mask("0x0.0x1", MIXED, COMPOSITE) == [T(0, (1,))]


@pytest.mark.parametrize("value", ["a", "0,x", "1.5e0", "0,,1"])
def test_affinity_mask_garbage(value):
    with pytest.raises(ConfigurationError, match="ZE_AFFINITY_MASK"):
        parse_affinity_mask(value, TWO_BY_FOUR, FLAT)


# -- ZE_AFFINITY_MASK, COMPOSITE ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0, 1", [T(0), T(1)]),
        ("0", [T(0)]),
        ("1", [T(1)]),
        ("0.0", [T(0, (0,))]),  # a single tile becomes the device
        ("1.1, 1.2", [T(1, (1, 2))]),  # the card, restricted to two tiles
        ("0.2, 1.3, 1.0, 0.3", [T(0, (2, 3)), T(1, (0, 3))]),  # order unchanged
        ("0.0,0.1,0.2,0.3", [T(0)]),  # every tile is the whole card
        ("0,0.1", [T(0)]),  # the whole card wins
        ("0.9", []),  # a tile out of range is ignored
        ("5", []),
    ],
)
def test_affinity_mask_composite(value, expected):
    assert parse_affinity_mask(value, TWO_BY_FOUR, COMPOSITE) == expected


def test_affinity_mask_composite_single_tile_card():
    assert parse_affinity_mask("1.0", MIXED, COMPOSITE) == [T(1)]
    assert parse_affinity_mask("1.1", MIXED, COMPOSITE) == []


def test_affinity_mask_composite_rejects_deeper_forms():
    with pytest.raises(ConfigurationError, match="sub-sub-device"):
        parse_affinity_mask("0.1.2", TWO_BY_FOUR, COMPOSITE)


# -- ONEAPI_DEVICE_SELECTOR ---------------------------------------------------------------------

THREE = [T(0), T(1), T(2)]
TILES3 = [1, 1, 1]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2]),
        ("", [0, 1, 2]),
        ("level_zero:0,1", [0, 1]),
        ("level_zero:1,0", [0, 1]),  # order stays the backend's
        ("level_zero:*", [0, 1, 2]),
        ("level_zero:gpu", [0, 1, 2]),
        ("*:gpu", [0, 1, 2]),
        ("LEVEL_ZERO:2", [2]),  # names are case-insensitive
        ("!level_zero:1", [0, 2]),  # only discard terms: everything else stays
        ("level_zero:*;!level_zero:1", [0, 2]),
        ("level_zero:0,1;!level_zero:0", [1]),
        ("opencl:*", []),  # a positive term for another backend only: no XPU device
        ("opencl:*;level_zero:2", [2]),
        ("!opencl:*", [0, 1, 2]),
        ("level_zero:cpu", []),
        ("level_zero:7", []),
        ("level_zero:0;", [0]),  # an empty term is ignored
        ("!level_zero:*", []),
    ],
)
def test_device_selector(value, expected):
    assert apply_device_selector(value, THREE, TILES3) == [THREE[i] for i in expected]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("level_zero", "backend:devices"),
        ("0,1", "backend:devices"),
        ("level_zero:", "backend:devices"),
        ("vulkan:0", "unknown backend"),
        ("level_zero:0.1.2", "unsupported device"),
        ("level_zero:first", "unsupported device"),
        ("!level_zero:0.1", "cannot name a sub-device"),
    ],
)
def test_device_selector_errors_name_the_variable(value, match):
    with pytest.raises(ConfigurationError, match="ONEAPI_DEVICE_SELECTOR") as info:
        apply_device_selector(value, THREE, TILES3)
    assert match in str(info.value)


def test_device_selector_sub_devices_in_composite():
    devices = [T(0), T(1)]
    tiles = [2, 1]
    assert apply_device_selector("level_zero:0.1", devices, tiles, COMPOSITE) == [T(0, (1,))]
    assert apply_device_selector("level_zero:0.*", devices, tiles, COMPOSITE) == [
        T(0, (0,)),
        T(0, (1,)),
    ]
    # a device without tiles has no sub-devices to select
    assert apply_device_selector("level_zero:1.0", devices, tiles, COMPOSITE) == []


def test_device_selector_sub_device_numbers_count_exposed_tiles():
    # ZE_AFFINITY_MASK=1.1,1.3 exposes card 1 with tiles 1 and 3 as its sub-devices 0 and 1
    masked = parse_affinity_mask("1.1,1.3", TWO_BY_FOUR, COMPOSITE)
    assert apply_device_selector("level_zero:0.1", masked, TWO_BY_FOUR, COMPOSITE) == [T(1, (3,))]


def test_device_selector_sub_devices_invalid_in_flat():
    with pytest.raises(ConfigurationError, match="sub-device"):
        apply_device_selector("level_zero:0.0", THREE, TILES3, FLAT)


# -- all three ----------------------------------------------------------------------------------


def test_selector_indices_count_devices_left_by_the_mask():
    env = {"ZE_AFFINITY_MASK": "1,2", "ONEAPI_DEVICE_SELECTOR": "level_zero:1"}
    # the mask leaves tile 1 of card 0 and card 1; the selector's 1 is card 1
    assert visible_targets(MIXED, env, FLAT) == [T(1)]


def test_composite_via_environment():
    env = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.1"}
    assert visible_targets(MIXED, env) == [T(0, (1,))]


def test_no_variables_on_a_max_with_a_current_driver():
    assert visible_targets(MIXED, {}, FLAT) == [T(0, (0,)), T(0, (1,)), T(1)]


def test_no_variables_elsewhere_is_composite():
    assert visible_targets(MIXED, {}) == [T(0), T(1)]


def test_sub_device_mask_is_valid_on_single_tile_cards_by_default():
    # Arc/Flex/BMG default to COMPOSITE, where "0.0" is tile 0 of card 0 (the whole card)
    assert visible_targets([1, 1], {"ZE_AFFINITY_MASK": "0.0"}) == [T(0)]
    env = {"ONEAPI_DEVICE_SELECTOR": "level_zero:0.0"}
    visible_targets([1, 1], env)  # accepted (COMPOSITE); what SYCL exposes then is unverified


@pytest.mark.parametrize("value", ["level_zero:acc", "*:acc"])
def test_selector_has_no_acc_device_type(value):
    with pytest.raises(ConfigurationError, match="ONEAPI_DEVICE_SELECTOR"):
        apply_device_selector(value, [T(0), T(1)], [1, 1])


def test_selector_discard_terms_must_come_last():
    devices, tiles = [T(0), T(1), T(2)], [1, 1, 1]
    assert apply_device_selector("level_zero:*;!level_zero:1", devices, tiles) == [T(0), T(2)]
    with pytest.raises(ConfigurationError, match="after the accepting terms"):
        apply_device_selector("!level_zero:1;level_zero:*", devices, tiles)


@given(st.lists(st.integers(min_value=0, max_value=9), max_size=8), st.booleans())
def test_mask_selects_a_subsequence(indices, composite):
    hierarchy = COMPOSITE if composite else FLAT
    devices = default_devices(TWO_BY_FOUR, hierarchy)
    out = parse_affinity_mask(",".join(map(str, indices)), TWO_BY_FOUR, hierarchy)
    if indices:
        positions = [devices.index(d) for d in out]
        assert positions == sorted(set(positions))  # a subsequence, in order, no repeats
        assert {devices[i] for i in indices if i < len(devices)} == set(out)
    else:
        assert out == devices
