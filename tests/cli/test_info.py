"""``accelplat info``: text and JSON on the machine's own platform and with forced platforms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from accelplat._cli import main
from accelplat._describe import SCHEMA_VERSION

JSON_KEYS = {
    "schema",
    "platform",
    "forced",
    "error",
    "candidates",
    "hostname",
    "driver_version",
    "device_type",
    "visible_devices_env",
    "visible_devices",
    "default_memory_utilization",
    "preferred_start_method",
    "context_free",
    "release",
    "graph",
    "devices",
    "lease_units",
    "requirements_judged_on",
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


HOSTILE_TEXT = {
    "csi-clear": "\x1b[2J\x1b[H",
    "osc-retitle": "\x1b]0;owned\x07",
    "c1-csi": "\x9b31m",
    "bidi-override": "2026\u202e-01-01",
    "bidi-isolate": "\u2066x\u2069",
    "forged-line": "1.0\nplatform: cuda",
    "nul-bell": "\x00\x07\x08",
    "long": "9" * 4000,  # the bundle's own limit is 4096
}


@pytest.mark.parametrize("field", ["created", "accelplat_version"])
@pytest.mark.parametrize("value", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT.keys())
def test_info_replay_escapes_what_the_bundle_says_of_itself(
    field: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelplat._replay._bundle import bundle_bytes
    from accelplat.replay import load_bundle
    from tests._hosts import BUNDLES

    source = next(p for p in BUNDLES if p.name.startswith("cpu"))
    bundle = load_bundle(source)
    with tarfile.open(source) as tar:
        member = tar.extractfile("host.json")
        assert member is not None
        host = json.loads(member.read())
    host[field] = value
    path = tmp_path / "hostile.tar.gz"
    path.write_bytes(bundle_bytes(host, bundle.info, bundle.contents))
    assert main(["info", "--replay", str(path)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("replaying ")
    assert "platform: cuda" not in out.splitlines()  # no forged line
    for line in out.splitlines():
        assert line.isprintable(), repr(line)
    assert len(first) < 1000


@pytest.mark.parametrize("value", ["bogus", "no such platform!", "a b", "x" * 100_000, "\x1b[2J"])
@pytest.mark.parametrize("as_json", [False, True])
def test_info_exits_2_for_a_bad_platform_variable_as_stats_does(
    value: str,
    as_json: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", value)
    assert main(["info", *(["--json"] if as_json else [])]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("accelplat info: error: unknown platform"), err[:200]
    if as_json:
        assert json.loads(out)["platform"] is None
    else:
        assert out.startswith("platform: none")
        assert "detection:" not in out  # no candidates: no heading over nothing
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")  # a known platform not available: 1
    monkeypatch.delenv("ACCELPLAT_SIMULATED_SPEC", raising=False)
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert "detection:\n  - simulated: " in out  # the candidate it tried, under its heading


@pytest.mark.parametrize("bundle", ["missing.tar.gz", "not-a-bundle.tar.gz"])
def test_an_unloadable_replay_bundle_is_one_line_and_exit_2_not_an_import_traceback(
    tmp_path: Path, bundle: str
) -> None:
    path = tmp_path / bundle
    if bundle.startswith("not-"):
        path.write_bytes(b"junk")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["ACCELPLAT_REPLAY"] = str(path)
    proc = subprocess.run(
        [sys.executable, "-m", "accelplat", "info"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"accelplat info: error: {path}: ")
    code = (
        "import accelplat\n"
        "from accelplat.errors import BundleError\n"
        "try:\n"
        "    accelplat.current_platform().devices()\n"
        "except BundleError as exc:\n"
        "    print(exc.source)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{path}\n", "")
