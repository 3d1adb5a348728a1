"""The variables a replay applies: the ones the capture considered, of those the backends declare.

A bundle chooses the visible devices, their order and the roots of the host's files (every read
under them is answered by the bundle); never where accelplat writes, which user file it reads or
which library it loads, and never a variable of anything else (a bundle is untrusted).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tarfile
from pathlib import Path

import pytest

from accelplat import _registry
from accelplat._capture import capture
from accelplat._replay._bundle import bundle_bytes, load_bundle
from accelplat._replay._install import activate, applied, considered
from accelplat.replay import replaying
from tests._hosts import HOSTS

CHOOSING_PATHS = {
    "ACCELPLAT_LEASE_DIR": "/tmp/the-bundle-chooses",
    "ACCELPLAT_SIMULATED_SPEC": "/etc/shadow",
    "ACCELPLAT_LEVEL_ZERO_LIB": "/tmp/evil.so",
    "ACCELPLAT_REPLAY": "/tmp/another.tar.gz",
    "ACCELPLAT_PROBE_TIMEOUT_S": "1e9",
    "LD_PRELOAD": "/tmp/evil.so",
    "PYTHONPATH": "/tmp",
}


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """The CPU host's bundle, saying it considered path-choosing variables and set them."""
    with tarfile.open(HOSTS / "cpu-x86_64.tar.gz") as tar:
        member = tar.extractfile("host.json")
        assert member is not None
        host = json.loads(member.read())
    host["env"] = {**CHOOSING_PATHS, "CUDA_VISIBLE_DEVICES": "1"}
    host["variables"] = list(host["env"])
    path = tmp_path / "hostile.tar.gz"
    path.write_bytes(bundle_bytes(host, None, ""))
    return path


@pytest.fixture
def own(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    mine = {name: f"mine-{name.lower()}" for name in CHOOSING_PATHS}
    for name, value in mine.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    return mine


def test_a_replay_never_applies_a_variable_that_chooses_a_path(
    own: dict[str, str], hostile: Path
) -> None:
    bundle = load_bundle(hostile)
    assert set(applied(bundle)) == {"CUDA_VISIBLE_DEVICES", "ACCELPLAT_PLUGINS"}
    with replaying(bundle):
        assert {k: os.environ[k] for k in own} == own
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
        assert os.environ["ACCELPLAT_PLUGINS"] == ""
    assert {k: os.environ[k] for k in own} == own
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_process_wide_replay_applies_no_path_either(
    own: dict[str, str], hostile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat import _boundary, _files

    for name in (*own, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name)
    try:
        activate(hostile)
        assert not set(CHOOSING_PATHS) & set(os.environ)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        _files.set_host_files(None)
        _boundary.install(None)
        monkeypatch.delenv("ACCELPLAT_PLUGINS", raising=False)


def test_a_capture_records_the_names_it_considered_and_no_path_choosing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    monkeypatch.setenv("ACCELPLAT_LEASE_DIR", "/tmp/leases")
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", "/tmp/spec.json")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    host = capture(samples=0).host
    assert host["variables"] == list(considered())
    assert host["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    assert host["env"]["ACCELPLAT_PLATFORM"] == "cpu"
    assert "ACCELPLAT_LEASE_DIR" not in host["env"]
    assert "ACCELPLAT_SIMULATED_SPEC" not in host["env"]
    assert set(considered()) == {*_registry.host_variables(), "SLURM_JOB_GPUS"} | {
        "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL", "NVIDIA_VISIBLE_DEVICES"
    }  # fmt: skip


def test_a_bundle_that_does_not_list_its_variables_clears_every_declared_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundle = load_bundle(HOSTS / "nvidia-h200-x2-cvd0.tar.gz")  # captured before the list
    assert bundle.variables is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("ACCELPLAT_LEASE_DIR", "/tmp/mine")
    with replaying(bundle):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        assert "HIP_VISIBLE_DEVICES" not in os.environ
        assert os.environ["ACCELPLAT_LEASE_DIR"] == "/tmp/mine"
    assert os.environ["HIP_VISIBLE_DEVICES"] == "1"


def test_a_bundle_clears_only_what_it_considered(monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = dataclasses.replace(
        load_bundle(HOSTS / "cpu-x86_64.tar.gz"), variables=("CUDA_VISIBLE_DEVICES",), env={}
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")  # not considered by this capture: kept
    with replaying(bundle):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
        assert os.environ["HIP_VISIBLE_DEVICES"] == "1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
