"""ROCR_, HIP_ and CUDA_VISIBLE_DEVICES on ROCm, as ROCr and HIP apply them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelplat._visible.rocm import (
    hip_uuid,
    parse_hip_visible_devices,
    parse_rocr_visible_devices,
    select_hip_variable,
    visible_physical_indices,
)
from accelplat.errors import ConfigurationError

UUIDS = [
    "GPU-5a1b2c3d4e5f6000",
    "GPU-5a1b2c3d4e5f6001",
    "GPU-0123456789abcdef",
    None,  # a GPU without unique_id
]


def test_hip_uuid_format():
    assert hip_uuid(0x5A1B2C3D4E5F6000) == "GPU-5a1b2c3d4e5f6000"
    assert hip_uuid(1) == "GPU-0000000000000001"
    assert hip_uuid(0) is None


# -- ROCR_VISIBLE_DEVICES -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2, 3]),  # unset: every GPU
        ("", []),  # set but empty: none
        ("0", [0]),
        ("2,0", [2, 0]),  # order as named
        (" 1 , 3 ", [1, 3]),  # tokens are trimmed
        ("0x2,1", [2, 1]),  # strtol base 0: hex
        ("010", []),  # octal 8: out of range ends the list at once
        ("03,1", [3, 1]),  # octal 3
        ("07", []),  # octal 7: out of range
        ("1,", [1]),  # a trailing comma is not a token
        ("1,9,0", [1]),  # out of range ends the list
        ("1,abc,0", [1]),  # invalid ends the list
        ("1,1,0", [1]),  # a repeat ends the list (ROCr treats it as a terminator)
        ("-1", []),
        ("+1", [1]),
        ("1.0", []),
        ("08", []),  # "0" then "8": strtol stops early, so invalid
        ("0x", []),
    ],
)
def test_rocr_indices(value, expected):
    assert parse_rocr_visible_devices(value, 4, UUIDS) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("GPU-0123456789abcdef", [2]),  # full UUID
        ("gpu-0123456789ABCDEF", [2]),  # ROCr upper-cases both sides
        ("GPU-0123", [2]),  # an unambiguous prefix
        ("GPU-5a1b2c3d4e5f600", []),  # ambiguous prefix (two GPUs) ends the list
        ("GPU-5a1b2c3d4e5f6001,0", [1, 0]),  # UUIDs and indices mix
        ("GPU-", []),  # shorter than 5 characters
        ("GPU-ffff", []),  # matches nothing
        ("GPU-0123456789abcdef0000", []),  # longer than 20 characters
        ("GPU-XX", []),  # a GPU without unique_id matches nothing in ROCr
        ("2,GPU-0123", [2]),  # the same GPU twice ends the list
    ],
)
def test_rocr_uuids(value, expected):
    assert parse_rocr_visible_devices(value, 4, UUIDS) == expected


def test_rocr_only_the_first_count_tokens_are_read():
    # ROCr evaluates at most as many tokens as there are GPUs: the empty token after them is
    # never reached, so it does not fail.
    assert parse_rocr_visible_devices("1,0,,5", 2, ["GPU-a0000", "GPU-b0000"]) == [1, 0]


def test_rocr_empty_inner_token_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="ROCR_VISIBLE_DEVICES"):
        parse_rocr_visible_devices("0,,1", 4, UUIDS)


def test_rocr_uuid_without_topology_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="UUID"):
        parse_rocr_visible_devices("GPU-0123", 4, None)
    assert parse_rocr_visible_devices("1,0", 4, None) == [1, 0]


def test_rocr_rejects_a_uuid_table_of_the_wrong_length():
    with pytest.raises(ValueError, match="entries"):
        parse_rocr_visible_devices("0", 4, UUIDS[:2])


# -- HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),  # empty means no filter in HIP (unlike CUDA)
        ("0", [0]),
        ("3,1", [3, 1]),
        ("1,", [1]),
        ("1,1,0", [1, 0]),  # a repeat is skipped, not a terminator
        ("0, 1", [0]),  # " 1" is not canonical decimal: the list ends
        ("01", []),  # nor is "01"
        ("+1", []),
        ("-1", []),  # HIP_VISIBLE_DEVICES=-1 hides every GPU
        (",1", []),  # an empty first token ends the list at once
        ("1,7,0", [1]),
        ("0x1", []),
    ],
)
def test_hip_indices(value, expected):
    assert parse_hip_visible_devices(value, 4, UUIDS) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("GPU-0123456789abcdef", [2]),
        ("GPU-0123", [2]),  # a prefix: the token is a substring of the UUID
        ("GPU-5a1b2c3d4e5f600", [0]),  # HIP takes the first match, no ambiguity check
        ("GPU-0123456789ABCDEF", []),  # HIP compares case-sensitively with lower-case hex
        ("GPU-XX", [3]),  # the GPU without unique_id reports "GPU-XX"
        ("1,GPU-5a1b2c3d4e5f6001,0", [1, 0]),  # repeat via UUID skipped
        ("gpu-0123", []),  # not a UUID token in HIP, and not a number
    ],
)
def test_hip_uuids(value, expected):
    assert parse_hip_visible_devices(value, 4, UUIDS) == expected


def test_hip_uuid_without_topology_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="UUID"):
        parse_hip_visible_devices("GPU-0123", 4, None)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"HIP_VISIBLE_DEVICES": "1"}, ("HIP_VISIBLE_DEVICES", "1")),
        ({"CUDA_VISIBLE_DEVICES": "2"}, ("CUDA_VISIBLE_DEVICES", "2")),
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}, ("HIP_VISIBLE_DEVICES", "1")),
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": ""}, ("HIP_VISIBLE_DEVICES", "1")),
        ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""}, None),
        # empty counts as unset (HIP's rocdevice.cpp; vLLM's _sync_hip_cuda_env_vars)
        ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "1"}, ("CUDA_VISIBLE_DEVICES", "1")),
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": ""}, ("HIP_VISIBLE_DEVICES", "0")),
    ],
)
def test_select_hip_variable(env, expected):
    assert select_hip_variable(env) == expected


@pytest.mark.parametrize(
    "env",
    [
        {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"},
        {"HIP_VISIBLE_DEVICES": "GPU-5a1b", "CUDA_VISIBLE_DEVICES": "0"},
    ],
)
def test_hip_and_cuda_disagreeing_is_a_configuration_error(env):
    with pytest.raises(ConfigurationError, match=r"HIP_VISIBLE_DEVICES.*CUDA_VISIBLE_DEVICES"):
        select_hip_variable(env)


# -- both layers --------------------------------------------------------------------------------


def test_hip_indices_count_what_rocr_left():
    env = {"ROCR_VISIBLE_DEVICES": "3,1,2", "HIP_VISIBLE_DEVICES": "2,0"}
    # ROCr surfaces physical 3, 1, 2; HIP's 2 and 0 are its third and first: physical 2 and 3.
    assert visible_physical_indices(4, env, UUIDS) == [2, 3]


def test_cuda_visible_devices_applies_when_hip_is_unset():
    env = {"ROCR_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "1"}
    assert visible_physical_indices(4, env, UUIDS) == [2]


def test_hip_uuid_matches_among_rocr_survivors_only():
    env = {"ROCR_VISIBLE_DEVICES": "2", "HIP_VISIBLE_DEVICES": "GPU-5a1b2c3d4e5f6000"}
    # the named GPU was hidden by ROCr, so HIP finds no match and shows nothing
    assert visible_physical_indices(4, env, UUIDS) == []
    env = {"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "GPU-0123"}
    assert visible_physical_indices(4, env, UUIDS) == [2]


def test_no_variables_means_every_gpu_in_physical_order():
    assert visible_physical_indices(3, {}, None) == [0, 1, 2]


def test_empty_hip_keeps_rocr_choice():
    env = {"ROCR_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": ""}
    assert visible_physical_indices(4, env) == [3]


@given(
    st.lists(st.integers(min_value=0, max_value=5), max_size=6),
    st.lists(st.integers(min_value=0, max_value=5), max_size=6),
)
def test_result_is_always_distinct_valid_physical_indices(rocr, hip):
    env = {
        "ROCR_VISIBLE_DEVICES": ",".join(map(str, rocr)),
        "HIP_VISIBLE_DEVICES": ",".join(map(str, hip)),
    }
    out = visible_physical_indices(4, env, UUIDS)
    assert len(out) == len(set(out))
    surfaced = parse_rocr_visible_devices(env["ROCR_VISIBLE_DEVICES"], 4, UUIDS)
    assert set(out) <= set(surfaced)
    if not hip:
        assert out == surfaced
