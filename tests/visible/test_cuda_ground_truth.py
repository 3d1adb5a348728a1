"""The CUDA_VISIBLE_DEVICES parser against what the CUDA driver itself reported on real GPUs.

``tests/data/cuda_visible_ground_truth.json`` is written by ``tools/record_cuda_visible.py`` on
NVIDIA hosts (a two-GPU host, and the same host with one GPU left in ``/dev``): for each form,
a fresh process reported ``cuInit``'s result and the UUIDs of the devices the driver enumerated
(and torch's view, kept for reference). Every record is replayed here through
:func:`resolve_cuda_visible_devices` with the recorded GPUs as the table, matched by UUID, so
the file is valid on any host and no GPU is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from accelplat._visible.cuda import GpuRecord, resolve_cuda_visible_devices

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda_visible_ground_truth.json"
TRUTH: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
CASES = [
    pytest.param(config, record, id=f"{config['config']}-{i}")
    for config in TRUTH["configs"]
    for i, record in enumerate(config["records"])
]


def _table(config: dict[str, Any]) -> list[GpuRecord]:
    """The recorded GPUs in CUDA's order, each with its NVML index found by UUID."""
    nvml = {g["uuid"]: g["nvml_index"] for g in config["versions"]["nvml_gpus"]}
    return [GpuRecord(nvml[uuid], uuid) for uuid in config["gpus_in_cuda_order"]]


def test_the_file_covers_one_and_two_gpu_hosts_with_many_forms() -> None:
    counts = {c["config"]: len(c["gpus_in_cuda_order"]) for c in TRUTH["configs"]}
    assert sorted(counts.values()) == [1, 2]
    assert sum(len(c["records"]) for c in TRUTH["configs"]) >= 150
    for config in TRUTH["configs"]:
        versions = config["versions"]
        assert versions["driver"]
        assert versions["cuda_driver_api"]
        assert versions["torch"]
        forms = [r["form"] for r in config["records"]]
        assert len(forms) == len(set(forms))
        assert all("cu_init" in r for r in config["records"]), "a probe failed to report"


@pytest.mark.parametrize(("config", "record"), CASES)
def test_the_parser_sees_what_the_cuda_driver_saw(
    config: dict[str, Any], record: dict[str, Any]
) -> None:
    resolution = resolve_cuda_visible_devices(record["form"], _table(config))
    assert [t.uuid for t in resolution.targets] == record["cu_uuids"], (
        record["form"],
        record.get("cu_error"),
        resolution.notes,
    )


@pytest.mark.parametrize("config", TRUTH["configs"], ids=lambda c: c["config"])
def test_an_empty_answer_comes_with_a_reason(config: dict[str, Any]) -> None:
    """Whenever the driver saw no device for a set variable, the resolver says why."""
    table = _table(config)
    for record in config["records"]:
        if record["form"] is not None and not record["cu_uuids"]:
            notes = resolve_cuda_visible_devices(record["form"], table).notes
            assert notes or record["form"] == "", record["form"]
