"""ROCm and oneAPI visible-device variables: a ``ConfigurationError`` or a valid answer, nothing
else.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelplat._visible.oneapi import Hierarchy, XpuTarget, visible_targets
from accelplat._visible.rocm import visible_physical_indices
from accelplat.errors import (
    ConfigurationError,
)
from tests._hostile import FAST, LONG_DIGITS

# =============================================================================================
# ROCm and oneAPI variables: ConfigurationError or a valid answer, nothing else
# =============================================================================================

_variable_text = st.one_of(
    st.text(max_size=30),
    st.lists(
        st.one_of(
            st.integers(-3, 12).map(str),
            st.sampled_from(["", " ", "GPU-", "GPU-0123", "0x1", "07", "-0", "*", "1.2", "0.*"]),
            st.text(alphabet="0123456789abcdefxGPU-.*:;!,", max_size=8),
        ),
        max_size=5,
    ).map(",".join),
    st.sampled_from([LONG_DIGITS, f"0,{LONG_DIGITS}", f"0x{'f' * 5000}", "0" * 5000 + "1"]),
)


@FAST
@given(
    count=st.integers(0, 6),
    with_uuids=st.booleans(),
    rocr=st.none() | _variable_text,
    hip=st.none() | _variable_text,
    cuda=st.none() | _variable_text,
)
def test_rocm_variables_never_raise_anything_but_configuration_error(
    count: int, with_uuids: bool, rocr: str | None, hip: str | None, cuda: str | None
) -> None:
    env = {
        k: v
        for k, v in (
            ("ROCR_VISIBLE_DEVICES", rocr),
            ("HIP_VISIBLE_DEVICES", hip),
            ("CUDA_VISIBLE_DEVICES", cuda),
        )
        if v is not None
    }
    uuids = [f"GPU-{i:016x}" if i % 3 else None for i in range(count)] if with_uuids else None
    try:
        picked = visible_physical_indices(count, env, uuids)
    except ConfigurationError:
        return
    assert len(set(picked)) == len(picked)
    assert all(type(i) is int and 0 <= i < count for i in picked)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ROCR_VISIBLE_DEVICES": f"1,{LONG_DIGITS},0"}, [1]),
        ({"HIP_VISIBLE_DEVICES": f"1,{LONG_DIGITS},0"}, [1]),
        ({"ROCR_VISIBLE_DEVICES": "0x" + "f" * 5000}, []),
        ({"ROCR_VISIBLE_DEVICES": "0" * 5000 + "1"}, [1]),  # octal, as strtol reads it
    ],
)
def test_rocm_variables_with_very_long_numbers_end_the_list(
    env: dict[str, str], expected: list[int]
) -> None:
    assert visible_physical_indices(2, env) == expected


_TILES = st.lists(st.integers(0, 3), max_size=4)


@FAST
@given(
    tiles=_TILES,
    hierarchy=st.none() | st.sampled_from(["FLAT", "COMPOSITE", "COMBINED", "flat", "x"]),
    mask=st.none() | _variable_text,
    selector=st.none()
    | _variable_text
    | st.builds(
        lambda neg, backend, items: f"{neg}{backend}:{items}",
        st.sampled_from(["", "!"]),
        st.sampled_from(["level_zero", "*", "opencl", "ext_oneapi_level_zero", "cuda"]),
        _variable_text,
    ),
)
def test_oneapi_variables_never_raise_anything_but_configuration_error(
    tiles: list[int], hierarchy: str | None, mask: str | None, selector: str | None
) -> None:
    env = {
        k: v
        for k, v in (
            ("ZE_FLAT_DEVICE_HIERARCHY", hierarchy),
            ("ZE_AFFINITY_MASK", mask),
            ("ONEAPI_DEVICE_SELECTOR", selector),
        )
        if v is not None
    }
    try:
        targets = visible_targets(tiles, env)
    except ConfigurationError:
        return
    for target in targets:
        assert isinstance(target, XpuTarget)
        assert 0 <= target.card < len(tiles)
        if target.tiles is not None:
            assert all(0 <= t < max(1, tiles[target.card]) for t in target.tiles)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ZE_AFFINITY_MASK": f"0,{LONG_DIGITS}"}, [XpuTarget(0, (0,))]),
        ({"ZE_AFFINITY_MASK": f"0.{LONG_DIGITS}", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, []),
        ({"ONEAPI_DEVICE_SELECTOR": f"level_zero:0,{LONG_DIGITS}"}, [XpuTarget(0, (0,))]),
        (
            {"ONEAPI_DEVICE_SELECTOR": f"!level_zero:{LONG_DIGITS}"},
            [XpuTarget(c, (t,)) for c in (0, 1) for t in (0, 1)],
        ),
        (
            {
                "ONEAPI_DEVICE_SELECTOR": f"level_zero:0.{LONG_DIGITS}",
                "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
            },
            [],
        ),
    ],
    ids=["mask", "mask-tile", "selector", "selector-negative", "selector-tile"],
)
def test_oneapi_variables_with_very_long_numbers_name_no_device(
    env: dict[str, str], expected: list[XpuTarget]
) -> None:
    # two two-tile cards of a Data Center GPU Max, whose default (driver 23.43+) is FLAT
    assert visible_targets([2, 2], env, Hierarchy.FLAT) == expected
