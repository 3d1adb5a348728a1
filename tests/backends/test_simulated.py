"""The simulated platform: timelines, clocks, spec files, probing, and hostile specs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from accelplat import _registry as registry
from accelplat._backends.simulated import (
    ENV_SPEC,
    LazyRelease,
    Linear,
    RealClock,
    SimulatedClock,
    SimulatedDevice,
    SimulatedHolder,
    SimulatedPlatform,
    SimulatedSpec,
    Step,
    load_spec,
)
from accelplat._backends.simulated._model import MAX_DEVICES, MAX_SPEC_BYTES
from accelplat._platform import Platform
from accelplat._types import GIB, MIB, GraphSupport, HolderState, MemoryHolder, ReleaseProfile
from accelplat.errors import ConfigurationError, DeviceNotFoundError, PlatformNotAvailableError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "simulated"


def one_device(**device: Any) -> dict[str, Any]:
    return {"devices": [{"total": "80GiB", **device}]}


def used_at(platform: SimulatedPlatform, clock: SimulatedClock, t: float, device: int = 0) -> int:
    clock.advance(t - platform.elapsed())
    return platform.memory_info(device).used


# ---------------------------------------------------------------------------------------------
# clocks


def test_simulated_clock_sleep_advances_instantly_and_records() -> None:
    clock = SimulatedClock(start=5.0, epoch=1000.0)
    assert clock.monotonic() == 5.0
    assert clock.time() == 1000.0
    clock.sleep(0.25)
    clock.advance(1.0)
    assert clock.monotonic() == pytest.approx(6.25)
    assert clock.time() == pytest.approx(1001.25)
    assert clock.sleeps == [0.25]


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, True, "1"])
def test_simulated_clock_rejects_bad_sleeps(bad: Any) -> None:
    clock = SimulatedClock()
    with pytest.raises(ConfigurationError, match="sleep"):
        clock.sleep(bad)
    assert clock.monotonic() == 0.0


def test_simulated_clock_rejects_non_finite_start() -> None:
    with pytest.raises(ConfigurationError, match="start"):
        SimulatedClock(start=math.nan)


def test_real_clock_is_the_default_and_time_passes() -> None:
    platform = SimulatedPlatform.from_spec(one_device())
    assert isinstance(platform.clock, RealClock)
    first = platform.elapsed()
    platform.clock.sleep(0.001)
    assert platform.elapsed() > first >= 0.0


def test_virtual_clock_from_spec() -> None:
    platform = SimulatedPlatform.from_spec({"clock": "virtual", **one_device()})
    assert isinstance(platform.clock, SimulatedClock)
    assert platform.elapsed() == 0.0


def test_timeline_starts_at_construction_time_of_the_clock() -> None:
    clock = SimulatedClock(start=100.0)
    platform = SimulatedPlatform.from_spec(
        one_device(used="10GiB", timeline=[{"at": 1.0, "used": "1GiB"}]), clock=clock
    )
    assert platform.memory_info(0).used == 10 * GIB
    clock.advance(1.0)
    assert platform.memory_info(0).used == 1 * GIB


# ---------------------------------------------------------------------------------------------
# timelines


def test_step_segments() -> None:
    clock = SimulatedClock()
    platform = SimulatedPlatform.from_spec(
        one_device(
            used="8GiB",
            timeline=[{"at": 1.0, "used": "2GiB"}, {"at": 2.5, "used": 0}],
        ),
        clock=clock,
    )
    assert used_at(platform, clock, 0.0) == 8 * GIB
    assert used_at(platform, clock, 0.999) == 8 * GIB
    assert used_at(platform, clock, 1.0) == 2 * GIB
    assert used_at(platform, clock, 2.49) == 2 * GIB
    assert used_at(platform, clock, 2.5) == 0


def test_linear_release_interpolates_and_defaults_from_to_previous_level() -> None:
    clock = SimulatedClock()
    platform = SimulatedPlatform.from_spec(
        one_device(
            used="10GiB",
            timeline=[{"linear": {"start": 1, "end": 3, "to": "2GiB"}}],
        ),
        clock=clock,
    )
    assert used_at(platform, clock, 0.5) == 10 * GIB
    assert used_at(platform, clock, 1.0) == 10 * GIB
    assert used_at(platform, clock, 2.0) == 6 * GIB
    assert used_at(platform, clock, 3.0) == 2 * GIB
    assert used_at(platform, clock, 50.0) == 2 * GIB
    info = platform.memory_info(0)
    assert info.free == info.total - info.used
    assert info.source == "simulated"


def test_linear_with_explicit_from_jumps() -> None:
    dev = SimulatedDevice(
        total=80 * GIB, used=0, timeline=(Linear(start=1.0, end=2.0, to=0, from_=4 * GIB),)
    )
    assert dev.used_at(0.5) == 0
    assert dev.used_at(1.0) == 4 * GIB
    assert dev.used_at(1.5) == 2 * GIB


def test_lazy_release_holds_then_decays_exactly_to_target() -> None:
    seg = LazyRelease(start=1.0, to=2 * GIB, tau_s=0.5, from_=66 * GIB, delay_s=0.5)
    dev = SimulatedDevice(total=80 * GIB, used=66 * GIB, timeline=(seg,))
    assert dev.used_at(1.2) == 66 * GIB  # deferred: nothing yet
    assert dev.used_at(1.5) == 66 * GIB
    mid = dev.used_at(2.0)
    assert 2 * GIB < mid < 66 * GIB
    expected = 2 * GIB + 64 * GIB * math.exp(-1.0)
    assert abs(mid - expected) <= MIB
    values = [dev.used_at(1.5 + 0.01 * k) for k in range(1000)]
    assert values == sorted(values, reverse=True)  # monotone
    assert all((v - 2 * GIB) % MIB == 0 for v in values)  # chunks of the granularity
    quiet = dev.quiet_after()
    assert dev.used_at(quiet + 1e-6) == 2 * GIB
    assert dev.used_at(quiet - 0.01) > 2 * GIB


def test_stuck_holder_adds_usage_and_is_reported() -> None:
    clock = SimulatedClock()
    spec = one_device(
        used="60GiB",
        timeline=[
            {"at": 1.0, "used": 0},
            {
                "stuck": {
                    "at": 0.5,
                    "used": "8GiB",
                    "pid": 4242,
                    "name": "python",
                    "state": "zombie",
                }
            },
        ],
    )
    platform = SimulatedPlatform.from_spec(spec, clock=clock)
    assert platform.memory_holders(0) == ()  # reported, none active yet
    assert used_at(platform, clock, 0.6) == 68 * GIB
    assert used_at(platform, clock, 1.0) == 8 * GIB
    assert used_at(platform, clock, 1e6) == 8 * GIB
    assert platform.memory_holders(0) == (
        MemoryHolder(pid=4242, used_bytes=8 * GIB, state=HolderState.ZOMBIE, name="python"),
    )


def test_holders_with_end_release_and_unknown_holders_are_none() -> None:
    clock = SimulatedClock()
    spec = {
        "devices": [
            {
                "total": "80GiB",
                "holders": [{"used": "4GiB", "start": 0, "end": 2, "pid": 7, "name": "w"}],
            },
            {"total": "80GiB", "holders": [{"used": "1GiB"}]},  # anonymous: bytes count
        ]
    }
    platform = SimulatedPlatform.from_spec(spec, clock=clock)
    assert platform.memory_info(0).used == 4 * GIB
    assert [h.pid for h in platform.memory_holders(0) or ()] == [7]
    assert platform.memory_info(1).used == 1 * GIB
    assert platform.memory_holders(1) is None
    clock.advance(2.0)
    assert platform.memory_info(0).used == 0
    assert platform.memory_holders(0) == ()


def test_report_holders_false_hides_pids() -> None:
    platform = SimulatedPlatform.from_spec(
        one_device(report_holders=False, holders=[{"used": "1GiB", "pid": 9}])
    )
    assert platform.memory_holders(0) is None


def test_python_built_spec() -> None:
    clock = SimulatedClock()
    spec = SimulatedSpec(
        devices=(
            SimulatedDevice(
                total=16 * GIB,
                used=8 * GIB,
                timeline=(Step(at=1.0, used=GIB),),
                holders=(SimulatedHolder(used=GIB, pid=12, name="x"),),
                name="Tiny",
            ),
        ),
        name="fakegpu",
        release=ReleaseProfile(lazy=True, stable_duration_s=1.5, settle_timeout_s=30.0),
        graph=GraphSupport(True, "torch.cuda.CUDAGraph", "test"),
        default_memory_utilization=0.9,
        preferred_start_method="spawn",
    )
    platform = SimulatedPlatform(spec, clock=clock)
    assert isinstance(platform, Platform)
    assert platform.name == "fakegpu"
    assert platform.release.lazy
    assert platform.release.stable_duration_s == 1.5
    assert platform.graph.available
    assert platform.default_memory_utilization == 0.9
    assert platform.preferred_start_method == "spawn"
    assert platform.context_free
    assert platform.devices()[0].name == "Tiny"
    assert platform.devices()[0].uuid == "SIM-0"
    assert platform.memory_info(0).used == 9 * GIB
    clock.advance(1.0)
    assert platform.memory_info(0).used == 2 * GIB


def test_count_replicates_devices_and_bad_index_raises() -> None:
    platform = SimulatedPlatform.from_spec({"devices": [{"total": "1GiB", "count": 3}]})
    assert platform.device_count() == 3
    assert [d.index for d in platform.devices()] == [0, 1, 2]
    with pytest.raises(DeviceNotFoundError, match=r"0\.\.2"):
        platform.memory_info(3)
    with pytest.raises(DeviceNotFoundError):
        platform.memory_holders(-1)


def test_release_and_graph_defaults_are_eager_and_graphless() -> None:
    platform = SimulatedPlatform.from_spec(one_device())
    assert platform.release.lazy is False
    assert platform.graph.available is False
    assert platform.name == "simulated"
    assert platform.device_type == "cuda"


# ---------------------------------------------------------------------------------------------
# files, probe, registry


def test_json_and_toml_files_load(tmp_path: Path) -> None:
    j = tmp_path / "spec.json"
    j.write_text(json.dumps(one_device(used="3GiB")))
    t = tmp_path / "spec.toml"
    t.write_text(
        '[release]\nlazy = true\nstable_duration_s = 2.0\nidle_floor = "4GiB"\n'
        '[[devices]]\ntotal = "80GiB"\nused = "3GiB"\n'
        'timeline = [{ lazy = { start = 1, tau = 0.5, to = "1GiB" } }]\n'
    )
    assert load_spec(j).devices[0].used == 3 * GIB
    spec = load_spec(t)
    assert spec.release.idle_floor_bytes == 4 * GIB
    assert isinstance(spec.devices[0].timeline[0], LazyRelease)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.*")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    spec = load_spec(path)
    assert spec.devices


def test_probe_without_variable_is_unavailable_with_reason() -> None:
    result = SimulatedPlatform.probe()
    assert not result.available
    assert ENV_SPEC in result.reason


def test_probe_with_valid_and_invalid_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"devices": [{"total": "1GiB", "count": 2}]}))
    monkeypatch.setenv(ENV_SPEC, str(good))
    result = SimulatedPlatform.probe()
    assert result.available
    assert "2 simulated device" in result.reason
    monkeypatch.setenv(ENV_SPEC, str(tmp_path / "missing.json"))
    result = SimulatedPlatform.probe()
    assert not result.available
    assert "cannot read" in result.reason


def test_no_argument_constructor_reads_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match=ENV_SPEC):
        SimulatedPlatform()
    path = tmp_path / "s.json"
    path.write_text(json.dumps(one_device(used="1GiB")))
    monkeypatch.setenv(ENV_SPEC, str(path))
    assert SimulatedPlatform().memory_info(0).used == GIB


def test_forced_through_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.toml"
    path.write_text('clock = "virtual"\n[[devices]]\ntotal = "2GiB"\n')
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    monkeypatch.setenv(ENV_SPEC, str(path))
    platform = registry.current_platform()
    assert isinstance(platform, SimulatedPlatform)
    assert platform.device_count() == 1


def test_forced_without_spec_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    with pytest.raises(PlatformNotAvailableError, match=ENV_SPEC):
        registry.current_platform()


def test_not_chosen_by_detection_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(one_device()))
    monkeypatch.setenv(ENV_SPEC, str(path))
    report = registry.detect()
    assert report.chosen != "simulated"


# ---------------------------------------------------------------------------------------------
# hostile specs


def write(tmp_path: Path, text: str | bytes, name: str = "spec.json") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "name", "match"),
    [
        ("{not json", "s.json", "malformed"),
        ("devices = [", "s.toml", "malformed"),
        ("[" * 200_000 + "]" * 200_000, "s.json", "nested too deeply|malformed"),
        ("a = " + "[" * 100_000 + "]" * 100_000, "s.toml", "nested too deeply|malformed"),
        ('{"devices": [{"total": ' + "9" * 5000 + "}]}", "s.json", "malformed|1 PiB"),
        ('{"devices": [{"total": 1e400}]}', "s.json", "finite|1 PiB"),
        ('{"devices": [{"total": NaN}]}', "s.json", "NaN"),
        ('{"devices": [{"total": Infinity}]}', "s.json", "Infinity"),
        ("[[devices]]\ntotal = inf\n", "s.toml", "finite"),
        ("[]", "s.json", "table/object"),
        ("\xff\xfe", "s.json", "UTF-8|malformed"),
    ],
    ids=[
        "bad-json",
        "bad-toml",
        "deep-json",
        "deep-toml",
        "huge-int",
        "huge-float",
        "nan",
        "infinity",
        "toml-inf",
        "not-object",
        "binary",
    ],
)
def test_malformed_files(tmp_path: Path, text: str, name: str, match: str) -> None:
    path = write(tmp_path, text.encode("latin-1") if text.startswith("\xff") else text, name)
    with pytest.raises(ConfigurationError, match=match) as info:
        load_spec(path)
    assert str(path) in str(info.value)


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, " " * (MAX_SPEC_BYTES + 1) + "{}")
    with pytest.raises(ConfigurationError, match="larger than 1 MiB"):
        load_spec(path)


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_spec(tmp_path)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({}, "missing required key 'devices'"),
        ({"devices": []}, "at least one device"),
        ({"devices": [{}]}, "missing required key 'total'"),
        ({"devices": [{"total": "-1GiB"}]}, "total must be a non-negative size"),
        ({"devices": [{"total": -5}]}, "total must be >= 0"),
        ({"devices": [{"total": True}]}, "total must be a size"),
        ({"devices": [{"total": "2PiB"}]}, "1 PiB"),
        ({"devices": [{"total": "4 parsecs"}]}, "total must be a non-negative size"),
        ({"devices": [{"total": "1GiB", "used": "2GiB"}]}, "exceed total"),
        (
            {"devices": [{"total": "1GiB", "timeline": [{"at": 1, "used": "3GiB"}]}]},
            "exceed total",
        ),
        (
            {"devices": [{"total": "1GiB", "used": "1GiB", "holders": [{"used": 1}]}]},
            "exceed total",
        ),
        ({"devices": [{"total": 1, "totl": 2}]}, "unknown key 'totl'"),
        ({"devices": [{"total": 1}], "colour": "red"}, "unknown key 'colour'"),
        ({"devices": [{"total": 1, "count": MAX_DEVICES + 1}]}, "count"),
        ({"devices": [{"total": 1, "count": 200}, {"total": 1, "count": 100}]}, "at most"),
        ({"devices": [{"total": 1}] * (MAX_DEVICES + 1)}, "at most"),
        ({"devices": [{"total": 1, "timeline": [{"at": -1, "used": 0}]}]}, r"timeline\[0\].at"),
        ({"devices": [{"total": 1, "timeline": [{"at": 1e12, "used": 0}]}]}, "at must be finite"),
        (
            {"devices": [{"total": 9, "timeline": [{"at": 2, "used": 0}, {"at": 1, "used": 0}]}]},
            "time order",
        ),
        (
            {"devices": [{"total": 9, "timeline": [{"linear": {"start": 2, "end": 1, "to": 0}}]}]},
            "before start",
        ),
        (
            {"devices": [{"total": 9, "timeline": [{"lazy": {"start": 0, "tau": 0, "to": 0}}]}]},
            "tau must be > 0",
        ),
        (
            {"devices": [{"total": 9, "timeline": [{"lazy": {"start": 0, "to": 0}}]}]},
            "missing required key 'tau'",
        ),
        ({"devices": [{"total": 9, "timeline": [{"at": 1}]}]}, "missing required key 'used'"),
        ({"devices": [{"total": 9, "timeline": "soon"}]}, "must be a list"),
        ({"devices": [{"total": 9, "timeline": [7]}]}, "table/object"),
        (
            {"devices": [{"total": 9, "holders": [{"used": 1, "pid": -3}]}]},
            "pid must be an integer",
        ),
        (
            {"devices": [{"total": 9, "holders": [{"used": 1, "state": "undead"}]}]},
            "state must be one of",
        ),
        ({"devices": [{"total": 9, "name": "x" * 1000}]}, "at most 256"),
        ({"devices": [{"total": 9}], "name": "Bad Name"}, "name must be"),
        ({"devices": [{"total": 9}], "clock": "sundial"}, "clock must be"),
        ({"devices": [{"total": 9}], "default_memory_utilization": 0}, r"\(0, 1\]"),
        ({"devices": [{"total": 9}], "default_memory_utilization": True}, "number"),
        ({"devices": [{"total": 9}], "preferred_start_method": "clone"}, "preferred_start"),
        ({"devices": [{"total": 9}], "release": {"lazy": "yes"}}, "lazy must be true or false"),
        ({"devices": [{"total": 9}], "release": {"stable_duration_s": -1}}, "stable_duration_s"),
        ({"devices": [{"total": 9}], "release": {"idle_floor": "-1GiB"}}, "idle_floor"),
        ({"devices": [{"total": 9}], "version": 2}, "version must be 1"),
        ({"devices": [{"total": 9}], "graph": {"available": 1}}, "available"),
    ],
)
def test_invalid_specs(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SimulatedPlatform.from_spec(spec)


def test_invalid_python_objects() -> None:
    with pytest.raises(ConfigurationError, match="whole number of bytes"):
        SimulatedDevice(total=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not a Step"):
        SimulatedDevice(total=10, timeline=("step",))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="spec must be"):
        SimulatedPlatform(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="clock must have"):
        SimulatedPlatform.from_spec(one_device(), clock=object())  # type: ignore[arg-type]


def test_sizes_accept_units_and_numbers() -> None:
    platform = SimulatedPlatform.from_spec(
        {
            "devices": [
                {"total": "1.5GiB"},
                {"total": "8GB"},
                {"total": "512 mib"},
                {"total": 1e9},
                {"total": "4G"},
                {"total": 1024},
            ]
        }
    )
    totals = [platform.memory_info(i).total for i in range(6)]
    assert totals == [3 * GIB // 2, 8 * 10**9, 512 * MIB, 10**9, 4 * GIB, 1024]


def test_a_spec_file_is_read_and_validated_once_for_probe_and_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from accelplat._backends import simulated

    path = tmp_path / "spec.json"
    path.write_text('{"devices": [{"total": "8GiB"}]}')
    loads: list[str] = []
    real = simulated.load_spec

    def counting(p: str | os.PathLike[str]) -> simulated.SimulatedSpec:
        loads.append(os.fspath(p))
        return real(p)

    monkeypatch.setattr(simulated, "load_spec", counting)
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(path))
    assert simulated.SimulatedPlatform.probe().available
    platform = simulated.SimulatedPlatform()
    assert platform.device_count() == 1
    assert loads == [str(path)]
    path.write_text('{"devices": [{"total": "8GiB"}, {"total": "16GiB"}]}')  # a new version
    assert simulated.SimulatedPlatform().device_count() == 2
    assert loads == [str(path), str(path)]


# A field holding 100 KB of text, or a long list, is refused with its value shortened.
_HUGE_TEXT = "9" * 100_000
_LONG_LIST = list(range(20_000))
_FIELD_PATHS = [
    ("devices", 0, "total"),
    ("devices", 0, "used"),
    ("devices", 0, "reserved"),
    ("devices", 0, "name"),
    ("devices", 0, "uuid"),
    ("devices", 0, "count"),
    ("devices", 0, "report_holders"),
    ("devices", 0, "timeline", 0, "at"),
    ("devices", 0, "timeline", 0, "used"),
    ("devices", 0, "timeline", 1, "linear", "start"),
    ("devices", 0, "timeline", 1, "linear", "end"),
    ("devices", 0, "timeline", 1, "linear", "to"),
    ("devices", 0, "timeline", 2, "lazy", "tau"),
    ("devices", 0, "timeline", 2, "lazy", "delay"),
    ("devices", 0, "timeline", 2, "lazy", "granularity"),
    ("devices", 0, "timeline", 2, "lazy", "from"),
    ("devices", 0, "timeline", 3, "stuck", "at"),
    ("devices", 0, "timeline", 3, "stuck", "pid"),
    ("devices", 0, "holders", 0, "start"),
    ("devices", 0, "holders", 0, "end"),
    ("devices", 0, "holders", 0, "pid"),
    ("devices", 0, "holders", 0, "name"),
    ("devices", 0, "holders", 0, "state"),
    ("version",),
    ("name",),
    ("device_type",),
    ("clock",),
    ("preferred_start_method",),
    ("default_memory_utilization",),
    ("release", "lazy"),
    ("release", "stable_duration_s"),
    ("release", "idle_floor"),
    ("graph", "available"),
    ("graph", "reason"),
]


def _full_spec() -> dict[str, Any]:
    return {
        "release": {},
        "graph": {},
        "devices": [
            {
                "total": "80GiB",
                "timeline": [
                    {"at": 0.5, "used": "1GiB"},
                    {"linear": {"start": 1, "end": 2, "to": 0}},
                    {"lazy": {"start": 3, "tau": 1, "to": 0}},
                    {"stuck": {"at": 4, "used": 1, "pid": 7}},
                ],
                "holders": [{"used": 1, "start": 0, "end": 5, "pid": 8}],
            }
        ],
    }


@pytest.mark.parametrize("bad", [_HUGE_TEXT, _LONG_LIST], ids=["text", "list"])
@pytest.mark.parametrize("path", _FIELD_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_a_huge_field_value_is_refused_and_shown_shortened(path: tuple[Any, ...], bad: Any) -> None:
    spec = _full_spec()
    target: Any = spec
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = bad
    with pytest.raises(ConfigurationError) as info:
        SimulatedPlatform.from_spec(spec)
    message = str(info.value)
    assert str(path[-1]) in message
    assert len(message) < 500, f"{len(message)} characters"


@pytest.mark.parametrize("granularity", [-1, -MIB, "-1MiB", -0.5])
def test_a_negative_granularity_is_refused(granularity: Any) -> None:
    spec = one_device(
        timeline=[{"lazy": {"start": 0, "tau": 1, "to": 0, "granularity": granularity}}]
    )
    with pytest.raises(ConfigurationError, match="granularity"):
        SimulatedPlatform.from_spec(spec)
