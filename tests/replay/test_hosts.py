"""Every bundle committed under ``tests/hosts/`` replays as the host it was captured on.

For each ``*.tar.gz`` there (adding one is the whole job: no code), the replayed
``accelplat info --json`` must equal the ``info.json`` recorded inside it (keys a newer accelplat
added are allowed; no recorded value may change), and the replayed platform must pass the
conformance kit — in this process and in the kit's fresh child processes, which replay the same
bundle through ``ACCELPLAT_REPLAY``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat._describe import collect_info
from accelplat._registry import current_platform
from accelplat.replay import compare_info, load_bundle, replaying
from accelplat.testing import run_conformance
from tests._hosts import BUNDLES, HOSTS, VirtualClock


@pytest.fixture(autouse=True)
def _no_replay_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELPLAT_REPLAY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)


def test_the_committed_hosts_cover_cpu_cuda_and_rocm() -> None:
    platforms = {str(load_bundle(p).summary.get("platform")) for p in BUNDLES}
    assert {"cpu", "cuda", "rocm"} <= platforms


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_replay_reproduces_the_recorded_info(path: Path) -> None:
    bundle = load_bundle(path)
    assert bundle.info is not None, f"{path.name} has no info.json"
    with replaying(bundle):
        info = collect_info()
    differences = compare_info(bundle.info, info)
    assert differences == [], (
        f"{path.name} no longer replays as recorded. If a backend now reads something new, the "
        "bundle lacks the answer: rebuild hand-built hosts (python -m tests.hosts.make_mi300x) "
        "or capture the host again (accelplat capture --out ...). Differences:\n"
        + "\n".join(differences)
    )
    assert info["platform"] == bundle.summary["platform"]


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_the_replayed_platform_passes_the_conformance_kit(path: Path) -> None:
    with replaying(path):
        platform = current_platform()
        report = run_conformance(
            platform.name,
            settle_clock=VirtualClock(),
            env={"ACCELPLAT_REPLAY": str(path)},
        )
    assert report.passed, report.summary()


@pytest.mark.parametrize("path", BUNDLES[:1], ids=lambda p: p.name)
def test_the_command_line_replays_a_bundle(path: Path) -> None:
    bundle = load_bundle(path)
    done = subprocess.run(
        [sys.executable, "-m", "accelplat", "info", "--json", "--replay", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert compare_info(bundle.info, json.loads(done.stdout)) == []


def test_the_hand_built_mi300x_replays_as_a_rocm_host_with_its_arch_and_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with replaying(HOSTS / "amd-mi300x-x2.tar.gz"):
        platform = current_platform()
        devices = list(platform.devices())
        memory = platform.memory_info(0)
        holders = platform.memory_holders(0)
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")  # applied by the backend over the replay
        hidden = [d.physical_index for d in platform.devices()]
    assert platform.name == "rocm"
    assert [(d.name, d.arch) for d in devices] == [("AMD Instinct MI300X", "gfx942")] * 2
    assert memory.total == 192 * 1024**3
    assert memory.used == 3 * 1024**3
    assert memory.source == "sysfs"
    assert holders is not None
    assert [h.pid for h in holders] == [4242]
    assert hidden == [1]


def test_the_h200_capture_replays_two_sm90_gpus_and_one_under_the_recorded_variable() -> None:
    with replaying(HOSTS / "nvidia-h200-x2.tar.gz"):
        both = [(d.name, d.arch, d.compute_capability) for d in current_platform().devices()]
    with replaying(HOSTS / "nvidia-h200-x2-cvd0.tar.gz"):
        one = [d.physical_index for d in current_platform().devices()]
    assert both == [("NVIDIA H200", "sm_90", (9, 0))] * 2
    assert one == [0]


def _in_a_fresh_process(code: str, env: dict[str, str]) -> str:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "CUDA_", "HIP_"))
    }
    base["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_variable_replays_a_backend_built_directly_before_any_detection() -> None:
    code = (
        "from accelplat._backends.rocm import RocmPlatform\n"
        "p = RocmPlatform()\n"
        "print([(d.name, d.arch, p.memory_info(d.index).total) for d in p.devices()])"
    )
    out = _in_a_fresh_process(code, {"ACCELPLAT_REPLAY": str(HOSTS / "amd-mi300x-x2.tar.gz")})
    assert out == str([("AMD Instinct MI300X", "gfx942", 192 * 1024**3)] * 2)


def test_under_the_variable_recorded_variables_are_defaults_and_the_process_own_win() -> None:
    code = (
        "import accelplat\n"
        "print([d.physical_index for d in accelplat.current_platform().devices()])"
    )
    bundle = str(HOSTS / "nvidia-h200-x2-cvd0.tar.gz")
    assert _in_a_fresh_process(code, {"ACCELPLAT_REPLAY": bundle}) == "[0]"
    both = {"ACCELPLAT_REPLAY": bundle, "CUDA_VISIBLE_DEVICES": "1,0"}
    assert _in_a_fresh_process(code, both) == "[1, 0]"


def test_candidates_are_compared_by_name_so_a_platform_added_later_stales_nothing() -> None:
    recorded = {"candidates": [{"name": "cuda", "available": False}, {"name": "cpu"}]}
    later = {"candidates": [{"name": "cuda", "available": False}, {"name": "tpu"}, {"name": "cpu"}]}
    assert compare_info(recorded, later) == []
    changed = {"candidates": [{"name": "cpu"}, {"name": "cuda", "available": True}]}
    assert compare_info(recorded, changed) == [
        "info.candidates.cuda.available: recorded False, replay gave True"
    ]
    assert compare_info(recorded, {"candidates": [{"name": "cpu"}]}) == [
        "info.candidates.cuda: missing from the replay"
    ]
