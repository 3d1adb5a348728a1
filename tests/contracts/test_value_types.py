"""The value types behave exactly as ``@dataclass(frozen=True)`` would make them.

They are built by ``accelplat._types.value_type``, which compiles less code at import; each is held
here against a twin made by ``dataclasses.make_dataclass(..., frozen=True)`` from its own fields.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelplat import _types, _usage
from accelplat._registry import DetectionReport

VALUE_TYPES: tuple[type, ...] = (
    _types.MemoryInfo,
    _types.DeviceInfo,
    _types.FeatureRule,
    _types.ReleaseProfile,
    _types.GraphSupport,
    _types.ProbeResult,
    _types.Candidate,
    _usage.MemoryHolder,
    _usage.UsageSnapshot,
    _usage.SettleResult,
    DetectionReport,
)


def _twin(cls: type) -> type:
    """``cls`` as ``@dataclass(frozen=True)`` makes it from the same fields."""
    specs: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        kwargs: dict[str, Any] = {"repr": f.repr, "compare": f.compare, "hash": f.hash}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = f.default_factory
        specs.append((f.name, f.type, dataclasses.field(**kwargs)))
    namespace = {"__post_init__": cls.__post_init__} if hasattr(cls, "__post_init__") else {}
    return dataclasses.make_dataclass(cls.__name__, specs, frozen=True, namespace=namespace)


TWINS = {cls: _twin(cls) for cls in VALUE_TYPES}

_VALUES = st.one_of(
    st.integers(min_value=0, max_value=2**70),
    st.floats(min_value=0, max_value=1e6),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.tuples(st.integers(0, 9), st.integers(0, 9)),
    st.dictionaries(st.integers(0, 3), st.integers(0, 9), max_size=2),
)


def _for_twin(cls: type, args: list[Any]) -> list[Any]:
    """``args`` as the twin takes them: ``None`` for a defaulted mapping means an empty one."""
    return [
        {} if v is None and f.default_factory is not dataclasses.MISSING else v
        for f, v in zip(dataclasses.fields(cls), args, strict=True)
    ]


def _outcome(make: Any) -> tuple[str, Any]:
    try:
        return "ok", make()
    except Exception as exc:  # both must fail alike
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("cls", VALUE_TYPES, ids=lambda c: c.__name__)
def test_the_signature_is_the_dataclass_one(cls: type) -> None:
    ours = inspect.signature(cls).parameters
    twin = inspect.signature(TWINS[cls]).parameters
    assert list(ours) == list(twin)
    factories = {
        f.name for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING
    }
    for name, param in ours.items():
        if name in factories:
            assert param.default is None  # None gives a fresh empty mapping
        else:
            assert param.default == twin[name].default
        assert param.kind is twin[name].kind
    assert dataclasses.is_dataclass(cls)
    assert cls.__match_args__ == TWINS[cls].__match_args__  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", VALUE_TYPES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_a_value_type_compares_hashes_prints_and_refuses_changes_as_its_twin(
    cls: type, data: st.DataObject
) -> None:
    twin = TWINS[cls]
    n = len(dataclasses.fields(cls))
    a = data.draw(st.lists(_VALUES, min_size=n, max_size=n))
    b = data.draw(st.one_of(st.just(list(a)), st.lists(_VALUES, min_size=n, max_size=n)))
    ta, tb = _for_twin(cls, a), _for_twin(cls, b)
    made = _outcome(lambda: cls(*a))
    assert made[0] == _outcome(lambda: twin(*ta))[0]
    if made[0] != "ok":
        assert made == _outcome(lambda: twin(*ta))  # the same refusal (__post_init__)
        return
    x, tx = cls(*a), twin(*ta)
    assert repr(x) == repr(tx)
    assert _outcome(lambda: hash(x)) == _outcome(lambda: hash(tx))
    if _outcome(lambda: cls(*b))[0] == "ok":
        assert (x == cls(*b)) == (tx == twin(*tb))
        assert (x != cls(*b)) == (tx != twin(*tb))
    assert x != tx  # another class, as between two dataclasses
    assert (x == object()) is False
    field = dataclasses.fields(cls)[0].name
    assert _outcome(lambda: setattr(x, field, 1)) == _outcome(lambda: setattr(tx, field, 1))
    assert _outcome(lambda: setattr(x, "other", 1)) == _outcome(lambda: setattr(tx, "other", 1))
    assert _outcome(lambda: delattr(x, field)) == _outcome(lambda: delattr(tx, field))
    assert dataclasses.asdict(x) == dataclasses.asdict(tx)
    assert dataclasses.astuple(x) == dataclasses.astuple(tx)
    assert dataclasses.replace(x) == x
    assert pickle.loads(pickle.dumps(x)) == x
    assert copy.deepcopy(x) == x


def test_assigning_a_field_raises_the_dataclass_error() -> None:
    info = _types.MemoryInfo(1, 2, 1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'free'"):
        info.free = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'free'"):
        del info.free


def test_replace_builds_through_the_checks_of_the_type() -> None:
    profile = _types.ReleaseProfile(True, 1.0, 10.0)
    with pytest.raises(ValueError, match="stable_duration_s"):
        dataclasses.replace(profile, stable_duration_s=float("nan"))
    assert dataclasses.replace(profile, idle_floor_bytes=5).idle_floor_bytes == 5


def test_a_default_mapping_is_fresh_for_each_value() -> None:
    first = _usage.UsageSnapshot(0.0, 0.0, {})
    second = _usage.UsageSnapshot(0.0, 0.0, {})
    assert first.holders == {}
    assert first.holders is not second.holders
    assert _usage.SettleResult(0.0, 1, first, True).targets == {}


def test_the_decorator_refuses_a_value_type_that_is_not_frozen() -> None:
    with pytest.raises(TypeError, match="frozen"):
        _types.value_type(frozen=False)


def test_a_frozen_dataclass_may_extend_a_value_type() -> None:
    @dataclasses.dataclass(frozen=True)
    class VendorDevice(_types.DeviceInfo):
        numa_node: int = -1

    device = VendorDevice(0, 3, "accelerator", numa_node=1)
    assert isinstance(device, _types.DeviceInfo)
    assert device.physical_index == 3
    assert repr(device).startswith("test_a_frozen_dataclass_may_extend_a_value_type.<locals>.")
    assert dataclasses.replace(device, numa_node=2).numa_node == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.name = "other"  # type: ignore[misc]
    assert _types.DeviceInfo.__dataclass_params__.frozen  # type: ignore[attr-defined]
