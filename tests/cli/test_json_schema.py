"""Every ``--json`` output of the command line carries the schema version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat._cli._errors import SCHEMA_VERSION, dumps, versioned

REPO = Path(__file__).resolve().parents[2]

SPEC = {
    "clock": "virtual",
    "devices": [{"name": "Sim A", "total": "80GiB", "used": "1GiB"}],
}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    out.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        ACCELPLAT_LEASE_DIR=str(tmp_path / "leases"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return out


KV = ["--dtype", "2", "--json"]
COMMANDS = [
    pytest.param(["info", "--json"], id="info"),
    pytest.param(["stats", "--json"], id="stats"),
    pytest.param(["stats", "--json", "--watch", "0.1", "--count", "2"], id="stats-watch"),
    pytest.param(["wait", "--threshold-ratio", "0.5", "--json", "--quiet"], id="wait"),
    pytest.param(["wait", "--threshold-bytes", "0", "--timeout", "0.1", "--json"], id="wait-fail"),
    pytest.param(["shm", "--path", "/dev/shm", "--json"], id="shm"),
    pytest.param(
        ["kv", "--layers", "2", "--kv-heads", "1", "--head-size", "8", "--max-model-len", "4", *KV],
        id="kv",
    ),
    pytest.param(["lease", "--status", "--json"], id="lease-status"),
    pytest.param(["scan", "tests/fakes", "--json"], id="scan"),
]


@pytest.mark.parametrize("argv", COMMANDS)
def test_every_json_document_starts_with_the_schema(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "accelplat", *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    if argv[0] in ("info", "shm", "kv", "scan"):  # indented: one document over several lines
        docs = [json.loads(done.stdout)]
    else:  # one document per line
        docs = [json.loads(line) for line in done.stdout.splitlines()]
    assert docs, done.stdout
    for doc in docs:
        assert doc["schema"] == SCHEMA_VERSION
        if argv[0] != "info":  # info's keys are sorted
            assert next(iter(doc)) == "schema"
    if "--count" in argv:
        assert len(docs) == 2


def test_versioned_puts_the_schema_first_and_leaves_the_input_alone() -> None:
    doc = {"b": 1, "schema": 99, "a": [1.5]}
    out = versioned(doc)
    assert list(out) == ["schema", "b", "a"]
    assert out["schema"] == SCHEMA_VERSION
    assert doc["schema"] == 99
    assert json.loads(dumps(doc)) == out
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps({"x": float("nan")})
