"""Every bundle committed under ``tests/hosts/`` replays as the host it was captured on.

For each ``*.tar.gz`` there (adding one is the whole job: no code), the replayed
``accelplat info --json`` must equal the ``info.json`` recorded inside it (keys a newer accelplat
added are allowed; no recorded value may change), and the replayed platform must pass the
conformance kit — in this process and in the kit's fresh child processes, which replay the same
bundle through ``ACCELPLAT_REPLAY``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat.cli.info import collect_info
from accelplat.registry import current_platform
from accelplat.replay import compare_info, load_bundle, replaying
from accelplat.testing import run_conformance

HOSTS = Path(__file__).parent / "hosts"
BUNDLES = sorted(HOSTS.glob("*.tar.gz"))


class VirtualClock:
    """Settle waits of lazy platforms run in virtual time."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


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
    assert compare_info(bundle.info, info) == []
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
