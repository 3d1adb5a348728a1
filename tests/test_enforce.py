"""The enforcement ladder: each rung decided from what the host shows, faked at the vendor boundary.

MPS through a fake ``nvidia-cuda-mps-control`` on ``PATH`` (the documented commands and pid file),
torch through installed-package metadata, the driver through a fake NVML.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.simulated import ENV_SPEC, SimulatedPlatform
from accelplat._enforce import ENV_ENFORCE, MPS_LIMIT, MPS_LOG, MPS_PIPE, choose
from accelplat._leasing import ENV_LEASE_DIR
from accelplat._leasing._shares import ENV_MEMORY_BYTES, ENV_MEMORY_FRACTION
from accelplat._types import GIB
from accelplat.errors import ConfigurationError
from tests.conftest import Install
from tests.fakes.mps import SCRIPT, install_mps_control
from tests.fakes.nvml import FakeNvml, h200

ROOT = Path(__file__).resolve().parent.parent
SHARE = {ENV_MEMORY_BYTES: str(12 * GIB), ENV_MEMORY_FRACTION: "0.085714"}
TWO = {"devices": [{"total": "140GiB", "count": 2}]}


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host with none of the rungs: no MPS binaries, no torch; ``tmp_path/bin`` first on PATH."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("MPS_FAKE_LOG", str(tmp_path / "mps.log"))
    for name in (ENV_ENFORCE, MPS_PIPE, MPS_LOG, "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _mps_binary(host: Path, script: str = SCRIPT) -> None:
    install_mps_control(host / "bin", script)


def _torch(host: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    info = host / "site" / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(host / "site"))


def test_without_any_rung_budgets_are_promises_and_say_why(host: Path) -> None:
    chosen = choose(SimulatedPlatform(TWO))
    assert chosen.kind == "none"
    assert chosen.limits(SHARE) == {}
    assert chosen.environ == {ENV_ENFORCE: "none"}  # a nested run takes the same rung
    said = chosen.describe()
    assert said.startswith("budgets promised, not enforced (MPS: no nvidia-cuda-mps-control")
    assert "torch's fraction: needs torch >=2.9 (found none)" in said


def test_a_mode_the_host_cannot_give_is_an_error(host: Path) -> None:
    with pytest.raises(ConfigurationError, match="ACCELPLAT_ENFORCE='gpu': expected one of"):
        choose(SimulatedPlatform(TWO), "gpu")
    with pytest.raises(ConfigurationError, match="mps: not available here: MPS: no nvidia"):
        choose(SimulatedPlatform(TWO), "mps")
    with pytest.raises(ConfigurationError, match="torch: not available here"):
        choose(SimulatedPlatform(TWO), "torch")


def test_torch_29_takes_its_fraction_from_the_allocator_settings(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _torch(host, monkeypatch, "2.9.1")
    chosen = choose(SimulatedPlatform(TWO))
    assert chosen.kind == "torch"
    assert "PYTORCH_CUDA_ALLOC_CONF, torch 2.9.1" in chosen.describe()
    fraction = "per_process_memory_fraction:0.085714"
    assert chosen.limits(SHARE) == {"PYTORCH_CUDA_ALLOC_CONF": fraction}
    assert chosen.limits({}) == {}  # a whole device needs no bound
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert chosen.limits(SHARE) == {
        "PYTORCH_CUDA_ALLOC_CONF": f"expandable_segments:True,{fraction}"
    }
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0.5")
    assert chosen.limits(SHARE) == {}  # the user's own fraction stands


def test_an_older_torch_would_refuse_the_key(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _torch(host, monkeypatch, "2.8.0")
    chosen = choose(SimulatedPlatform(TWO))
    assert chosen.kind == "none"
    assert "needs torch >=2.9 (found 2.8.0)" in chosen.describe()


def test_a_running_mps_daemon_is_found_in_its_pipe_directory(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mps_binary(host)
    assert choose(SimulatedPlatform(TWO)).kind == "none"  # binaries, but no daemon: not started
    pipe = host / "pipe"
    pipe.mkdir()
    (pipe / "nvidia-cuda-mps-control.pid").write_text("1")
    monkeypatch.setenv(MPS_PIPE, str(pipe))
    chosen = choose(SimulatedPlatform(TWO))
    assert chosen.kind == "mps"
    # the same budget for every ordinal a client may name
    assert chosen.limits(SHARE) == {MPS_LIMIT: "0=12288M,1=12288M"}
    assert chosen.environ == {ENV_ENFORCE: "mps"}  # clients find the daemon by themselves
    chosen.close()
    assert (pipe / "nvidia-cuda-mps-control.pid").exists()  # not ours to stop


def test_mps_asked_for_starts_a_private_daemon_and_quits_it(host: Path) -> None:
    _mps_binary(host)
    chosen = choose(SimulatedPlatform(TWO), "mps")
    pipe, log = Path(chosen.environ[MPS_PIPE]), Path(chosen.environ[MPS_LOG])
    assert (pipe / "nvidia-cuda-mps-control.pid").exists()
    assert pipe.parent == log.parent
    assert (pipe.parent.stat().st_mode & 0o077, pipe.stat().st_mode & 0o777) == (0, 0o700)
    assert "a control daemon started for this run" in chosen.describe()
    chosen.close()
    assert not pipe.parent.exists()
    said = (host / "mps.log").read_text().split()
    assert said[::2] == ["-d", "get_server_list", "quit"]


def test_a_daemon_that_will_not_start_is_an_error_naming_its_log(host: Path) -> None:
    _mps_binary(host, "#!/bin/sh\nexit 1\n")
    with pytest.raises(ConfigurationError, match=r"started no control daemon \(log: .*/log\)"):
        choose(SimulatedPlatform(TWO), "mps")


@pytest.mark.parametrize(
    ("driver", "said"),
    [
        ("580.159.03", "driver limits: need driver >=615 (580.159.03 here)"),
        ("615.20", "driver limits: offered by driver 615.20, not applied (they bind a cgroup)"),
    ],
)
def test_driver_limits_are_detected_from_the_driver_version(
    host: Path, install: Install, driver: str, said: str
) -> None:
    install(FakeNvml([h200(0)], driver_version=driver))
    assert said in choose(CudaPlatform()).describe()


def test_a_leased_share_says_its_enforcement_and_its_command_gets_the_limits(
    host: Path,
) -> None:
    _mps_binary(host)
    spec = host / "spec.json"
    spec.write_text('{"devices": [{"total": "80GiB"}]}')
    env = {**os.environ, "ACCELPLAT_PLATFORM": "simulated", ENV_SPEC: str(spec)}
    env.update({ENV_LEASE_DIR: str(host / "locks"), ENV_ENFORCE: "mps", "PYTHONPATH": str(ROOT)})
    show = f"import os; print(os.environ['{MPS_LIMIT}'], os.environ['{MPS_PIPE}'])"
    command = ["-m", "accelplat", "lease", "--memory", "12GiB", "--", sys.executable, "-c", show]
    done = subprocess.run(
        [sys.executable, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "accelplat lease: budgets enforced by MPS per-client memory limits" in done.stderr
    limit, pipe = done.stdout.split()
    assert limit == "0=12288M"
    assert not Path(pipe).exists()  # quit when the command ended
    assert (host / "mps.log").read_text().split()[-2] == "quit"
