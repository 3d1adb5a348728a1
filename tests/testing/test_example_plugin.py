"""The example plugin, installed for real, end to end.

``examples/accelplat-example-npu`` is built and installed with pip (offline, no build isolation)
into a throw-away virtual environment layered on this one: the new environment has no packages
of its own, and a ``.pth`` file puts this checkout and this environment's site-packages after
its own. (``venv --system-site-packages`` would layer it on the base interpreter, not on this
environment.) Then fresh interpreters of that environment show that the plugin is discovered
through its entry points, loads lazily, wins detection when configured, is shown by
``accelplat info``, passes the conformance kit, and that its broken sibling is skipped with the
reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "accelplat-example-npu"
GIB = 1024**3

BROKEN_REASON = (
    "libexample_npu_runtime.so.1: cannot open shared object file "
    "(the example's deliberately broken plugin)"
)

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Venv:
    python: Path
    work: Path
    config: Path

    def run(
        self, *args: str, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        full = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ACCELPLAT_", "EXAMPLE_NPU_", "PYTHON"))
        }
        full.update(env or {})
        out = subprocess.run(
            [str(self.python), *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=self.work,
            timeout=120,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"exit {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out

    def py(self, code: str, **env: str) -> str:
        return self.run("-c", code, env=env).stdout.strip()

    @property
    def configured(self) -> dict[str, str]:
        return {"EXAMPLE_NPU_CONFIG": str(self.config)}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("example-plugin")
    env_dir = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120
    )
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "_accelplat_dev.pth").write_text("\n".join([str(REPO), *sorted(here)]) + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", str(EXAMPLE)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    config = root / "npu.json"
    config.write_text(
        json.dumps(
            {
                "devices": [
                    {"name": "Example NPU 16G", "total": 16 * GIB, "used": GIB,
                     "reserved": GIB // 4, "uuid": "NPU-0"},
                    {"name": "Example NPU 16G", "total": 16 * GIB, "used": 0, "uuid": "NPU-1"},
                    {"name": "Example NPU 32G", "total": 32 * GIB, "used": 3 * GIB},
                ]
            }
        )
    )  # fmt: skip
    work = root / "work"
    work.mkdir()
    return Venv(python, work, config)


def test_the_example_is_installed_from_its_wheel_not_the_source_tree(venv: Venv) -> None:
    out = venv.py(
        "import accelplat_example_npu as m, importlib.metadata as md\n"
        "print(m.__file__)\n"
        "print(sorted(ep.name for ep in md.entry_points(group='accelplat.platforms')))"
    )
    location, names = out.splitlines()
    assert "site-packages" in location
    assert str(EXAMPLE) not in location
    assert names == "['example-npu', 'example-npu-broken']"


def test_plugin_is_discovered_without_being_imported(venv: Venv) -> None:
    out = venv.py(
        "import sys, accelplat\n"
        "print('accelplat_example_npu' in sys.modules)\n"
        "names = accelplat.available_platforms()\n"
        "print('example-npu' in names, 'example-npu-broken' in names)\n"
        "print('accelplat_example_npu' in sys.modules)"
    )
    assert out.splitlines() == ["False", "True True", "False"]


def test_unconfigured_plugin_does_not_take_over_and_broken_one_is_skipped(venv: Venv) -> None:
    out = venv.py(
        "import json, dataclasses, accelplat\n"
        "r = accelplat.detect()\n"
        "print(json.dumps({'chosen': r.chosen, 'error': r.error,"
        " 'c': [dataclasses.asdict(c) for c in r.candidates]}))"
    )
    report = json.loads(out)
    assert report["chosen"] not in (None, "example-npu", "example-npu-broken")
    cands = {c["name"]: c for c in report["c"]}
    assert cands["example-npu"] == {
        "name": "example-npu",
        "available": False,
        "chosen": False,
        "reason": "EXAMPLE_NPU_CONFIG is not set",
        "builtin": False,
    }
    broken = cands["example-npu-broken"]
    assert broken["available"] is False
    assert broken["builtin"] is False
    assert broken["reason"] == f"skipped: import failed: ImportError: {BROKEN_REASON}"


def test_configured_plugin_wins_detection(venv: Venv) -> None:
    out = venv.py(
        "import accelplat\n"
        "p = accelplat.current_platform()\n"
        "r = accelplat.detect()\n"
        "print(p.name, p.device_count(), p.memory_info(2).used, r.chosen)\n"
        "print([c.name for c in r.candidates if not c.available and not c.builtin])",
        **venv.configured,
    )
    first, second = out.splitlines()
    assert first == f"example-npu 3 {3 * GIB} example-npu"
    assert second == "['example-npu-broken']"


def test_accelplat_info_shows_the_forced_plugin(venv: Venv) -> None:
    env = {"ACCELPLAT_PLATFORM": "example-npu", **venv.configured}
    text = venv.run("-m", "accelplat", "info", env=env).stdout
    assert text.splitlines()[0] == "platform: example-npu"
    assert "* example-npu (plugin): forced by ACCELPLAT_PLATFORM: 3 example NPU(s)" in text
    assert "[2] Example NPU 32G (physical 2)" in text
    data = json.loads(venv.run("-m", "accelplat", "info", "--json", env=env).stdout)
    assert data["platform"] == "example-npu"
    assert data["visible_devices_env"] == "EXAMPLE_NPU_VISIBLE_DEVICES"
    assert [d["memory"]["total"] for d in data["devices"]] == [16 * GIB, 16 * GIB, 32 * GIB]
    assert data["devices"][0]["memory"]["reserved"] == GIB // 4
    hidden = venv.run(
        "-m", "accelplat", "info", "--json", env={**env, "EXAMPLE_NPU_VISIBLE_DEVICES": "2"}
    ).stdout
    assert [d["name"] for d in json.loads(hidden)["devices"]] == ["Example NPU 32G"]


def test_accelplat_info_shows_why_the_broken_plugin_is_skipped(venv: Venv) -> None:
    text = venv.run("-m", "accelplat", "info").stdout
    assert "- example-npu-broken (plugin): skipped: import failed: ImportError: " in text
    forced = venv.run(
        "-m", "accelplat", "info", env={"ACCELPLAT_PLATFORM": "example-npu-broken"}, check=False
    )
    assert forced.returncode == 1
    assert "platform: none" in forced.stdout
    assert BROKEN_REASON in forced.stdout


def test_forcing_the_broken_plugin_raises_with_its_reason(venv: Venv) -> None:
    out = venv.py(
        "import accelplat.errors\n"
        "try:\n"
        "    accelplat.current_platform()\n"
        "except accelplat.errors.PlatformNotAvailableError as exc:\n"
        "    print(exc.platform, '|', exc.reason)",
        ACCELPLAT_PLATFORM="example-npu-broken",
    )
    assert out == f"example-npu-broken | import failed: ImportError: {BROKEN_REASON}"


def test_acceplat_plugins_keeps_the_broken_plugin_out(venv: Venv) -> None:
    out = venv.py(
        "import sys, accelplat\n"
        "r = accelplat.detect()\n"
        "print(r.chosen, sorted(c.name for c in r.candidates if not c.builtin))\n"
        "print('accelplat_example_npu.broken' in sys.modules)",
        ACCELPLAT_PLUGINS="example-npu",
        **venv.configured,
    )
    assert out.splitlines() == ["example-npu ['example-npu']", "False"]


def test_the_plugin_passes_the_conformance_kit(venv: Venv) -> None:
    out = venv.py(
        "from accelplat.testing import run_conformance\n"
        "r = run_conformance('example-npu')\n"
        "print(r.summary())",
        **venv.configured,
    )
    lines = out.splitlines()
    assert lines[0] == "conformance of 'example-npu': passed", out
    assert sum(line.startswith("  PASS") for line in lines[1:]) == 15, out
    assert "EXAMPLE_NPU_VISIBLE_DEVICES='' -> 0 (subprocess)" in out, (
        "the empty-hides-all case the class declares was checked"
    )
    assert "fresh process (name 'example-npu')" in out


def test_the_plugin_passes_the_kit_through_pytest(venv: Venv) -> None:
    out = venv.run(
        "-m", "pytest", "--pyargs", "accelplat.testing._conformance", "-q", "-p",
        "no:cacheprovider", "--confcutdir", str(venv.work), "--rootdir", str(venv.work),
        env={"ACCELPLAT_PLATFORM": "example-npu", **venv.configured}, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "15 passed" in out.stdout


def test_the_plugin_own_suite_passes_with_make_conformance_test(venv: Venv) -> None:
    out = venv.run(
        "-m", "pytest", str(EXAMPLE / "tests"), "-q", "-p", "no:cacheprovider",
        "-c", str(EXAMPLE / "pyproject.toml"), "--rootdir", str(EXAMPLE), check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "17 passed" in out.stdout
