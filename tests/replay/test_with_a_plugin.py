"""A third-party backend installed through the ``accelplat.platforms`` entry point stales nothing.

A never-available plugin is built with hatchling and installed with pip (offline, into a
target folder); then, in fresh interpreters that see it, detection lists it as unavailable and
every committed host still replays as recorded (``tests/replay/test_hosts.py``'s comparison).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

PYPROJECT = """
[build-system]
requires = ["hatchling>=1.20"]
build-backend = "hatchling.build"

[project]
name = "never-npu"
version = "1.0"

[project.entry-points."accelplat.platforms"]
never-npu = "never_npu:NeverNpu"

[tool.hatch.build.targets.wheel]
packages = ["never_npu"]
"""

MODULE = """
from accelplat.types import ProbeResult


class NeverNpu:
    name = "never-npu"

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(False, "no never-npu here")
"""


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("never-npu")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "never_npu").mkdir()
    (source / "never_npu" / "__init__.py").write_text(MODULE)
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _run(plugin_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_path), str(REPO)])
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip


def test_the_plugin_is_detected_as_unavailable(plugin_path: Path) -> None:
    code = (
        "import json, accelplat\n"
        "r = accelplat.detect()\n"
        "print(json.dumps([r.chosen, [(c.name, c.reason) for c in r.candidates]]))"
    )
    done = _run(plugin_path, "-c", code)
    assert done.returncode == 0, done.stderr
    chosen, candidates = json.loads(done.stdout)
    assert ["never-npu", "no never-npu here"] in candidates
    assert chosen != "never-npu"


def test_every_committed_host_replays_as_recorded_with_the_plugin_installed(
    plugin_path: Path,
) -> None:
    done = _run(
        plugin_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
        "tests/replay/test_hosts.py", "-k", "reproduces",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
