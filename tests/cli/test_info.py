"""``accelplat info``: text and JSON on the machine's own platform and with forced platforms."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelplat._cli import main
from accelplat._cli._errors import SCHEMA_VERSION

JSON_KEYS = {
    "schema",
    "platform",
    "forced",
    "error",
    "candidates",
    "device_type",
    "visible_devices_env",
    "visible_devices",
    "default_memory_utilization",
    "preferred_start_method",
    "context_free",
    "release",
    "graph",
    "devices",
    "capabilities",
}


def test_info_json_has_stable_keys_on_cpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    assert main(["info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == JSON_KEYS
    assert doc["schema"] == SCHEMA_VERSION
    assert doc["platform"] == "cpu"
    assert doc["forced"] == "cpu"
    assert doc["candidates"][0]["chosen"] is True
    assert len(doc["devices"]) >= 1
    mem = doc["devices"][0]["memory"]
    assert mem["total"] > 0
    assert 0 <= mem["used"] <= mem["total"]
    assert set(doc["release"]) == {
        "lazy",
        "stable_duration_s",
        "settle_timeout_s",
        "idle_floor_bytes",
    }
    assert set(doc["graph"]) == {"available", "api", "reason"}
    assert 0 < doc["default_memory_utilization"] <= 1
    assert doc["devices"][0]["compute_capability"] is None
    assert doc["capabilities"]["bf16"]["available"] is True
    assert doc["capabilities"]["fp8"] == {
        "available": False,
        "reason": "the cpu platform has no fp8 support",
        "value": None,
    }


def test_info_text_explains_every_candidate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("platform: ")
    for name in ("cuda", "rocm", "xpu", "cpu"):
        assert f" {name}" in out, f"candidate {name} missing from:\n{out}"
    assert "release: " in out
    assert "graphs: " in out
    assert "devices: " in out


def test_unknown_forced_platform_lists_valid_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "nosuch")
    assert main(["info"]) != 0
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert "unknown platform 'nosuch'" in err
    assert "cpu" in err
    assert "cuda" in err


def test_forced_absent_platform_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The simulated platform is absent unless a spec is given.
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    assert main(["info", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["platform"] is None
    assert "simulated" in doc["error"]
    assert doc["candidates"][0]["reason"]


def test_python_m_accelplat_runs_and_never_imports_torch() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    code = (
        "import runpy, sys\n"
        "sys.argv = ['accelplat', 'info']\n"
        "try:\n"
        "    runpy.run_module('accelplat', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("platform: ")
