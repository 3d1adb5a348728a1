"""One exit-status mapping for every sub-command, a JSON error object under ``--json``, no
traceback when standard output closes early.

The mapping (docs/cli.md): 0 pass; 1 a check or wait that failed, or a runtime/backend error
(no platform, a GPU lost, an impossible reading); 2 bad usage or configuration. Each class of
failure is tried on every sub-command it can reach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat import _registry as registry
from accelplat._cli import main
from accelplat._cli._errors import error_document, exit_status
from accelplat._describe import SCHEMA_VERSION
from accelplat._types import GIB
from accelplat.errors import (
    BackendError,
    ConfigurationError,
    DeviceNotFoundError,
    ImplausibleReadingError,
    InsufficientSharedMemoryError,
    PlatformNotAvailableError,
)
from tests.conftest import Install
from tests.fakes.nvml import FakeNvml, h200

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ACCELPLAT_"):
            monkeypatch.delenv(name)
    registry.set_current_platform(None)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_mapping_itself() -> None:
    assert exit_status(ConfigurationError("x")) == 2
    assert exit_status(DeviceNotFoundError(5, 2, "cuda")) == 2
    for exc in (
        BackendError("cuda", "lost", "NVMLError_GpuIsLost"),
        ImplausibleReadingError("cuda", "dev", "free exceeds total", {"free": 2}, "nvml-v2"),
        PlatformNotAvailableError("cuda", "no driver"),
        InsufficientSharedMemoryError("small", required=2, free=1, path="/dev/shm"),
    ):
        assert exit_status(exc) == 1, exc
    doc = error_document(BackendError("cuda", "lost", "NVMLError_GpuIsLost"))
    assert doc == {
        "status": "error",
        "exit_status": 1,
        "error": {
            "type": "BackendError",
            "message": "cuda: lost (NVMLError_GpuIsLost)",
            "vendor_error": "NVMLError_GpuIsLost",
            "platform": "cuda",
        },
    }


# -- a backend error: exit 1 everywhere, with a JSON error object under --json -----------------

BACKEND_COMMANDS = [
    pytest.param(["stats"], id="stats"),
    pytest.param(["wait", "--threshold-ratio", "0.1", "--timeout", "5"], id="wait"),
    pytest.param(["wait", "--settle", "--timeout", "5"], id="wait-settle"),
]


@pytest.mark.parametrize("argv", BACKEND_COMMANDS)
@pytest.mark.parametrize(
    "fault",
    [
        pytest.param("GpuIsLost", id="gpu-lost"),
        pytest.param("NotSupported", id="not-supported-after-reporting"),
        pytest.param("implausible", id="impossible-reading"),
    ],
)
def test_a_backend_error_exits_1_with_a_json_error_object(
    install: Install,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    fault: str,
) -> None:
    fake = install(FakeNvml([h200(0, used=60 * GIB)]))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cuda")
    registry.current_platform().memory_info(0)  # the GPU has reported its own memory once
    if fault == "implausible":
        fake.gpus[0].used = 2**64 - 4096  # a counter wrapped below zero
    else:
        fake.fail("nvmlDeviceGetMemoryInfo", fault)
    code, out, err = run_cli(capsys, *argv)
    assert code == 1, err
    assert "Traceback" not in err
    assert "error:" in err
    assert out == ""
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["schema"] == SCHEMA_VERSION
    assert doc["status"] == "error"
    assert doc["exit_status"] == 1
    assert doc["error"]["platform"] == "cuda"
    assert doc["error"]["vendor_error"] in (
        "NVMLError_GpuIsLost",
        "NVMLError_NotSupported",
        "implausible reading",
    )


# -- no platform: exit 1 -------------------------------------------------------------------------

NO_PLATFORM_COMMANDS = [
    pytest.param(["stats"], id="stats"),
    pytest.param(["wait", "--threshold-ratio", "0.1"], id="wait"),
    pytest.param(["wait", "--settle"], id="wait-settle"),
]


@pytest.mark.parametrize("argv", NO_PLATFORM_COMMANDS)
def test_no_platform_available_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")  # forced, but no spec: not available
    code, _, err = run_cli(capsys, *argv)
    assert code == 1, err
    assert "ACCELPLAT_SIMULATED_SPEC" in err
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert code == 1
    assert json.loads(out)["error"]["type"] == "PlatformNotAvailableError"


def test_info_without_a_platform_exits_1_with_its_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    code, out, _ = run_cli(capsys, "info", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["platform"] is None
    assert "ACCELPLAT_SIMULATED_SPEC" in doc["error"]


# -- bad usage or configuration: exit 2 ----------------------------------------------------------

USAGE = [
    pytest.param(["wait"], id="wait-no-threshold"),
    pytest.param(["wait", "--settle", "--threshold-bytes", "1GiB"], id="wait-conflict"),
    pytest.param(["wait", "--threshold-ratio", "0.1", "--devices", "7"], id="wait-no-device"),
    pytest.param(["stats", "--devices", "7"], id="stats-no-device"),
    pytest.param(["stats", "--count", "3"], id="stats-count-without-watch"),
    pytest.param(["shm", "--name", ""], id="shm-bad-name"),
]


@pytest.mark.parametrize("argv", USAGE)
def test_bad_usage_exits_2_with_a_json_error_object(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"clock": "virtual", "devices": [{"total": "8GiB"}]}))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(spec))
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, err
    assert "Traceback" not in err
    assert out == ""
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert code == 2
    doc = json.loads(out)
    assert (doc["status"], doc["exit_status"]) == ("error", 2)
    assert doc["error"]["type"] in ("ConfigurationError", "DeviceNotFoundError")


def test_a_malformed_platform_variable_is_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "no such platform!")
    for argv in (["stats"], ["wait", "--threshold-ratio", "0.1"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, (argv, err)


# -- standard output closed early ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["info"], id="info"),
        pytest.param(["info", "--json"], id="info-json"),
        pytest.param(["stats"], id="stats"),
        pytest.param(["stats", "--json", "--watch", "0.01", "--count", "400"], id="stats-watch"),
        pytest.param(["kv", "--help"], id="help"),
    ],
)
def test_a_closed_pipe_prints_no_traceback(tmp_path: Path, argv: list[str]) -> None:
    spec = tmp_path / "spec.json"
    devices = [{"name": f"Sim {i}", "total": "8GiB"} for i in range(64)]
    spec.write_text(json.dumps({"clock": "virtual", "devices": devices}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    done = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m accelplat "$@" | head -c 1 >/dev/null', "sh", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
