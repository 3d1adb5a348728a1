"""Every replayed answer is untrusted: a vendor answer the backends turn into a number (NVML
memory, counts, MIG mode, amdsmi memory) or text is checked when the bundle is decoded, so a
NaN, an infinity, text, a bool, a negative, an integer past 64 bits or a container there is a
``BundleError`` naming the field, never a ``ValueError``/``TypeError`` from ``stats`` or ``wait``.
Unchecked leaves reach the backends and end in an answer or an accelplat error."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from accelplat._cli import main
from accelplat._replay._bundle import FORMAT_NAME, bundle_bytes, parse_bundle
from accelplat.errors import AccelplatError, BundleError
from accelplat.replay import load_bundle, replaying
from tests._hosts import HOSTS

H200 = HOSTS / "nvidia-h200-x1.tar.gz"

HOSTILE: dict[str, Any] = {
    "nan": {"$float": "nan"},
    "inf": {"$float": "inf"},
    "-inf": {"$float": "-inf"},
    "float": 1.5,
    "text": "abc",
    "numeric text": "12",
    "empty text": "",
    "true": True,
    "false": False,
    "negative": -1,
    "huge negative": -(2**70),
    "2**64": 2**64,
    "2**70": 2**70,
    "null": None,
    "list": [1],
    "nested list": [[1, [2]]],
    "map": {"$map": {"a": 1}},
    "tuple": {"$tuple": [1, 2]},
    "record": {"$record": {"type": "T", "fields": {"x": 1}}},
    "bytes": {"$utf8": "12"},
    "handle": {"$handle": "nvml-9"},
}
"""Values no numeric field may hold; ``false`` too (a bool is never a count)."""

_NOT_TEXT = {k: v for k, v in HOSTILE.items() if "text" not in k and k != "bytes"}

MEMORY_FIELDS = ("free", "total", "used", "reserved", "version")

SCALARS = [
    ("nvml", ["attr", "nvmlMemory_v2"], 2**32 - 1),
    ("nvml", ["attr", "NVML_DEVICE_MIG_ENABLE"], 2**32 - 1),
    ("nvml", ["call", "nvmlDeviceGetCount", [], {}], 2**32 - 1),
    ("nvml", ["call", "nvmlDeviceGetMaxMigDeviceCount", [{"$handle": "nvml-0"}], {}], 2**32 - 1),
    ("nvml", ["call", "nvmlDeviceGetGpuInstanceId", [{"$handle": "nvml-0"}], {}], 2**32 - 1),
    ("nvml", ["call", "nvmlDeviceGetComputeInstanceId", [{"$handle": "nvml-0"}], {}], 2**32 - 1),
    ("amdsmi", ["call", "amdsmi_get_gpu_memory_total", [{"$handle": "a-0"}, 0], {}], 2**64 - 1),
    ("amdsmi", ["call", "amdsmi_get_gpu_memory_usage", [{"$handle": "a-0"}, 0], {}], 2**64 - 1),
]
SEQUENCES = [
    ("nvml", ["call", "nvmlDeviceGetMigMode", [{"$handle": "nvml-0"}], {}]),
    ("nvml", ["call", "nvmlDeviceGetCudaComputeCapability", [{"$handle": "nvml-0"}], {}]),
]
TEXTS = [
    ("nvml", ["call", "nvmlDeviceGetName", [{"$handle": "nvml-0"}], {}]),
    ("nvml", ["call", "nvmlDeviceGetUUID", [{"$handle": "nvml-0"}], {}]),
    ("nvml", ["call", "nvmlSystemGetDriverVersion", [], {}]),
]


def _h200() -> dict[str, Any]:
    with tarfile.open(H200) as tar:
        member = tar.extractfile("host.json")
        assert member is not None
        doc: dict[str, Any] = json.loads(member.read())
    return doc


def _with_memory_field(field: str, value: Any) -> tuple[dict[str, Any], int]:
    host = _h200()
    for i, record in enumerate(host["records"]):
        if record["key"][:2] == ["call", "nvmlDeviceGetMemoryInfo"]:
            record["answers"][0]["v"]["$record"]["fields"][field] = value
            return host, i
    raise AssertionError("the H200 bundle has no memory answer")


_RAISED = {"raise": {"type": "NVMLError_Unknown"}}  # a raised answer has no shape to check


def _one_record(channel: str, key: list[Any], value: Any) -> bytes:
    host = {
        "format": FORMAT_NAME,
        "format_version": 1,
        "created": "2026-01-01T00:00:00+00:00",
        "accelplat_version": "0.1.0",
        "options": {"processes": True},
        "summary": {},
        "env": {},
        "records": [{"channel": channel, "key": key, "answers": [_RAISED, {"v": value}]}],
    }
    return bundle_bytes(host, None, "")


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("field", MEMORY_FIELDS)
def test_a_hostile_memory_field_is_a_bundle_error_naming_it(field: str, kind: str) -> None:
    host, i = _with_memory_field(field, HOSTILE[kind])
    with pytest.raises(BundleError) as caught:
        parse_bundle(bundle_bytes(host, None, ""))
    assert f"records[{i}].answers[0].v" in str(caught.value)


@pytest.mark.parametrize("field", ["free", "total", "used"])
def test_a_missing_memory_field_is_refused_but_v1_has_no_reserved(field: str) -> None:
    host, i = _with_memory_field("reserved", 0)
    fields = host["records"][i]["answers"][0]["v"]["$record"]["fields"]
    del fields["reserved"], fields["version"]
    parse_bundle(bundle_bytes(host, None, ""))
    del fields[field]
    with pytest.raises(BundleError, match=rf"answers\[0\]\.v\.{field}"):
        parse_bundle(bundle_bytes(host, None, ""))


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize(("channel", "key", "top"), SCALARS, ids=lambda v: str(v)[:40])
def test_a_hostile_count_or_size_is_a_bundle_error(
    channel: str, key: list[Any], top: int, kind: str
) -> None:
    with pytest.raises(BundleError, match=r"records\[0\]\.answers\[1\]\.v"):
        parse_bundle(_one_record(channel, key, HOSTILE[kind]))
    parse_bundle(_one_record(channel, key, top))  # the edges load
    parse_bundle(_one_record(channel, key, 0))
    with pytest.raises(BundleError):
        parse_bundle(_one_record(channel, key, top + 1))


@pytest.mark.parametrize("kind", _NOT_TEXT)
@pytest.mark.parametrize(("channel", "key"), SEQUENCES, ids=lambda v: str(v)[:40])
def test_a_hostile_item_of_a_mig_mode_or_capability_is_a_bundle_error(
    channel: str, key: list[Any], kind: str
) -> None:
    for value in ([0, HOSTILE[kind]], {"$tuple": [HOSTILE[kind], 0]}):
        with pytest.raises(BundleError, match=r"answers\[1\]\.v\[\d\]"):
            parse_bundle(_one_record(channel, key, value))
    parse_bundle(_one_record(channel, key, {"$tuple": [9, 0]}))


@pytest.mark.parametrize("kind", _NOT_TEXT)
@pytest.mark.parametrize(("channel", "key"), TEXTS, ids=lambda v: str(v)[:40])
def test_a_name_that_is_not_text_is_a_bundle_error(channel: str, key: list[Any], kind: str) -> None:
    with pytest.raises(BundleError, match=r"answers\[1\]\.v"):
        parse_bundle(_one_record(channel, key, HOSTILE[kind]))
    parse_bundle(_one_record(channel, key, {"$utf8": "NVIDIA H200"}))


@pytest.mark.parametrize("kind", ["2**70", "huge negative"])
def test_no_decoded_integer_is_wider_than_64_bits_anywhere(kind: str) -> None:
    value = {"$record": {"type": "nvmlPciInfo_t", "fields": {"bus": HOSTILE[kind]}}}
    key = ["call", "nvmlDeviceGetPciInfo", [{"$handle": "nvml-0"}], {}]
    with pytest.raises(BundleError, match="wider than 64 bits"):
        parse_bundle(_one_record("nvml", key, value))


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        doc = doc[step]
    doc[path[-1]] = value


COMMANDS = (["info", "--json"], ["stats", "--json"], ["wait", "--threshold-ratio", "1", "--json"])


@pytest.fixture
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELPLAT_REPLAY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.usefixtures("_quiet")
@pytest.mark.parametrize("value", [HOSTILE["nan"], "abc", True, -1, 2**64 - 1, [[1]]], ids=repr)
def test_every_vendor_leaf_made_hostile_loads_refused_or_replays_without_a_traceback(
    value: Any,
) -> None:
    host = _h200()
    targets = [
        (i, path)
        for i, record in enumerate(host["records"])
        if record["channel"] == "nvml"
        for path in _leaves(record["answers"])
    ]
    replayed = 0
    for i, path in targets:
        mutated = copy.deepcopy(host)
        _set(mutated["records"][i]["answers"], path, value)
        try:
            bundle = parse_bundle(bundle_bytes(mutated, None, ""))
        except BundleError:
            continue
        replayed += 1
        for command in COMMANDS:
            with replaying(bundle), contextlib.redirect_stdout(io.StringIO()):
                try:
                    status = main(command)
                except AccelplatError:
                    continue
                assert status in (0, 1, 2), (command, i, path)
    assert replayed > 0


@pytest.mark.parametrize(
    "command", [["stats"], ["wait", "--threshold-ratio", "1", "--timeout", "0"]]
)
def test_stats_and_wait_on_a_nan_memory_bundle_name_the_field_not_a_value_error(
    tmp_path: Path, command: list[str]
) -> None:
    host, _ = _with_memory_field("total", {"$float": "nan"})
    path = tmp_path / "nan.tar.gz"
    path.write_bytes(bundle_bytes(host, load_bundle(H200).info, ""))
    done = subprocess.run(
        [sys.executable, "-m", "accelplat", *command],
        env={**os.environ, "ACCELPLAT_REPLAY": str(path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2  # the first query raises the BundleError; printed, not a traceback
    assert "Traceback" not in done.stderr
    assert f"{path}: host.json: records[" in done.stderr
    assert ".v.total: must be an integer" in done.stderr
    for crash in ("ValueError", "TypeError", "OverflowError"):
        assert crash not in done.stderr
