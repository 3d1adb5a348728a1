"""Every ``--json`` output of the command line follows its schema in ``accelplat/schemas``."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from jsonschema import Draft202012Validator

from accelplat._cli import main
from accelplat._cli._errors import dumps, versioned
from accelplat._describe import SCHEMA_VERSION
from accelplat._types import GIB
from tests import _schema as _jsonschema
from tests.conftest import Install
from tests.fakes.nvml import FakeNvml, h200

REPO = Path(__file__).resolve().parents[2]

SCHEMAS = REPO / "accelplat" / "schemas"

SPEC = {
    "clock": "virtual",
    "devices": [
        {"name": "Sim A", "total": "80GiB", "used": "1GiB"},
        {
            "name": "Sim B",
            "total": "40GiB",
            "used": "9GiB",
            "timeline": [{"stuck": {"used": "8GiB", "pid": 31337, "name": "leaky-worker"}}],
        },
    ],
}


def _env(tmp_path: Path, platform: str) -> dict[str, str]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    out.update(
        ACCELPLAT_PLATFORM=platform,
        ACCELPLAT_LEASE_DIR=str(tmp_path / "leases"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    if platform == "simulated":
        out["ACCELPLAT_SIMULATED_SPEC"] = str(spec)
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return _env(tmp_path, "simulated")


def _schema(name: str) -> dict[str, Any]:
    return cast("dict[str, Any]", json.loads((SCHEMAS / f"{name}.json").read_text()))


KV = ["--dtype", "2", "--json"]
KV_ARGS = ["kv", "--layers", "2", "--kv-heads", "1", "--head-size", "8", "--max-model-len", "4"]
# (argv, the schema its output follows, the exit status)
COMMANDS = [
    pytest.param(["info", "--json"], "info", 0, id="info"),
    pytest.param(["stats", "--json"], "stats", 0, id="stats"),
    pytest.param(["stats", "--json", "--holders"], "stats", 0, id="stats-holders"),
    pytest.param(
        ["stats", "--json", "--watch", "0.1", "--count", "2"], "stats", 0, id="stats-watch"
    ),
    pytest.param(["wait", "--threshold-ratio", "1", "--json", "--quiet"], "wait", 0, id="wait"),
    pytest.param(
        ["wait", "--threshold-bytes", "0", "--timeout", "0.1", "--json"], "wait", 1, id="wait-fail"
    ),
    pytest.param(["shm", "--path", "/dev/shm", "--json"], "shm", 0, id="shm"),
    pytest.param(
        ["shm", "--path", "/dev/shm", "--require", "1B", "--json"], "shm", 0, id="shm-require"
    ),
    pytest.param([*KV_ARGS, *KV], "kv", 0, id="kv"),
    pytest.param([*KV_ARGS, *KV, "--available", "1MiB"], "kv", 0, id="kv-available"),
    pytest.param(["lease", "--status", "--json"], "lease-status", 0, id="lease-status"),
    pytest.param(["scan", "tests/cli", "--json"], "scan", 0, id="scan"),
    pytest.param(["stats", "--devices", "7", "--json"], "error", 2, id="error-device"),
    pytest.param(["scan", "no/such/dir", "--json"], "error", 2, id="error-path"),
]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelplat", *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _documents(argv: list[str], stdout: str) -> list[Any]:
    if argv[0] in ("info", "shm", "kv", "scan") and "error" not in stdout[:40]:
        return [json.loads(stdout)]  # indented: one document over several lines
    return [json.loads(line) for line in stdout.splitlines()]  # one document per line


@pytest.mark.parametrize(("argv", "schema", "status"), COMMANDS)
@pytest.mark.parametrize("platform", ["simulated", "cpu"])
def test_every_json_document_follows_its_published_schema(
    argv: list[str], schema: str, status: int, platform: str, tmp_path: Path
) -> None:
    if platform == "cpu" and argv[0] == "wait" and status == 1:
        pytest.skip("the host's own memory is never at or below 0 bytes: covered on simulated")
    done = _run(argv, _env(tmp_path, platform))
    expected = 0 if platform == "cpu" and argv[0] == "wait" else status
    assert done.returncode == expected, done.stderr
    docs = _documents(argv, done.stdout)
    assert docs, done.stdout
    for doc in docs:
        assert _schema_errors(doc, schema) == []
        assert doc["schema"] == SCHEMA_VERSION
        if argv[0] != "info":  # info's keys are sorted
            assert next(iter(doc)) == "schema"
    if "--count" in argv:
        assert len(docs) == 2


def _schema_errors(doc: Any, name: str) -> list[str]:
    return _jsonschema.errors(doc, _schema(name), closed=True)


def test_the_holders_and_timeout_documents_carry_what_the_schema_says(
    env: dict[str, str],
) -> None:
    stats = json.loads(_run(["stats", "--json", "--holders"], env).stdout)
    holder = stats["devices"][1]["holders"][0]
    assert holder == {
        "pid": 31337,
        "used_bytes": 8 * 1024**3,
        "state": "alive",
        "name": "leaky-worker",
        "user": "",  # a simulated holder: no such process to read
        "command": "",
        "argv": [],
    }
    done = _run(["wait", "--threshold-bytes", "1GiB", "--timeout", "0.1", "--json"], env)
    wait = json.loads(done.stdout)
    assert [d["cleared"] for d in wait["devices"]] == [True, False]
    assert wait["devices"][1]["holders"][0]["pid"] == 31337
    for doc, name in ((stats, "stats"), (wait, "wait")):
        assert _schema_errors(doc, name) == []
        assert doc["hostname"] == socket.gethostname()
        moment = datetime.datetime.fromisoformat(doc["time"])
        assert moment.timestamp() == pytest.approx(doc["wall_time"], abs=0.001)


@pytest.mark.parametrize(
    ("argv", "schema"),
    [
        (["info", "--json"], "info"),
        (["stats", "--json", "--holders"], "stats"),
        (["wait", "--threshold-bytes", "100GiB", "--json"], "wait"),
    ],
)
def test_on_cuda_the_documents_carry_the_driver_version(
    argv: list[str],
    schema: str,
    install: Install,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gpus = [h200(0, used=2 * GIB), h200(1)]
    gpus[0].processes = [(4242, GIB)]
    install(FakeNvml(gpus))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cuda")
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert _schema_errors(doc, schema) == []
    assert doc["driver_version"] == "580.159.03"  # nvmlSystemGetDriverVersion, as gpustat shows
    if schema != "info":
        assert [d["index"] for d in doc["devices"]] == [0, 1]
    if schema == "stats":
        assert doc["devices"][0]["holders"][0]["pid"] == 4242
    if schema == "wait":  # clear at once: holders were not asked for
        assert [(d["cleared"], d["holders"]) for d in doc["devices"]] == [(True, None)] * 2


def test_every_schema_is_a_valid_draft_2020_12_schema_of_the_version() -> None:
    names = sorted(p.stem for p in SCHEMAS.glob("*.json"))
    assert names == ["error", "info", "kv", "lease-status", "scan", "shm", "stats", "wait"]
    for name in names:
        schema = _schema(name)
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        if name != "error":
            assert schema["properties"]["schema"]["const"] == SCHEMA_VERSION


def test_docs_name_every_top_level_key_of_every_schema() -> None:
    text = (REPO / "docs" / "json.md").read_text()
    for path in SCHEMAS.glob("*.json"):
        section = text.split(f"Schema: `accelplat/schemas/{path.name}`", 1)
        assert len(section) == 2, f"docs/json.md does not link {path.name}"
        body = section[1].split("\n## ", 1)[0]
        missing = [k for k in _schema(path.stem)["properties"] if f"`{k}`" not in body]
        assert missing == [], f"{path.name}: {missing}"


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (
            {
                "schema": 2,
                "status": "error",
                "exit_status": 3,
                "error": {"type": "X", "message": ""},
            },
            "3 is not one of [1, 2]",
        ),
        (
            {
                "schema": 2,
                "status": "error",
                "exit_status": True,
                "error": {"type": "X", "message": ""},
            },
            "True is not of type 'integer'",
        ),
        (
            {"schema": 2, "status": "error", "exit_status": 2, "error": {"type": "X"}},
            "'message' is a required property",
        ),
        (
            {
                "schema": 2,
                "status": "error",
                "exit_status": 2,
                "error": {"type": "X", "message": "", "surprise": 1},
            },
            "('surprise' was unexpected)",
        ),
        (
            {
                "schema": 2,
                "status": "oops",
                "exit_status": 2,
                "error": {"type": "X", "message": ""},
            },
            "'error' was expected",
        ),
    ],
)
def test_the_check_refuses_a_broken_document(doc: dict[str, Any], problem: str) -> None:
    found = _schema_errors(doc, "error")
    assert any(problem in e for e in found), found


def test_the_check_follows_references_and_any_of() -> None:
    info = json.loads(json.dumps({"devices": [{"memory": {"free": -1}}]}))
    found = _jsonschema.errors(
        info["devices"][0], {"$ref": "#/$defs/device"} | {"$defs": _schema("info")["$defs"]}
    )
    assert any("is not valid under any" in e and "less than the minimum of 0" in e for e in found)


def test_versioned_puts_the_schema_first_and_leaves_the_input_alone() -> None:
    doc = {"b": 1, "schema": 99, "a": [1.5]}
    out = versioned(doc)
    assert list(out) == ["schema", "b", "a"]
    assert out["schema"] == SCHEMA_VERSION
    assert doc["schema"] == 99
    assert json.loads(dumps(doc)) == out
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps({"x": float("nan")})
