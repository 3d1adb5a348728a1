"""The acceptance run's tools (.ci/vllm_suite): the migration and the outcome comparison."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parents[2] / ".ci" / "vllm_suite"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"vllm_suite_{name}", TOOLS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


UTILS = """import os
from contextlib import contextmanager

import pytest


def keep_me():
    return 1


@contextmanager
def _nvml():
    yield


@_nvml()
def record_gpu_memory_usage_stats(*, devices):
    return {}
"""


def _vllm_tree(tmp_path: Path, names: tuple[str, ...]) -> Path:
    tests = tmp_path / "tests"
    tests.mkdir()
    body = UTILS + "".join(
        f"\n\ndef {n}(*args, **kwargs):\n    raise RuntimeError\n" for n in names
    )
    (tests / "utils.py").write_text(body)
    (tests / "conftest.py").write_text(
        "def f():\n"
        "    from tests.utils import wait_for_memory_to_settle\n"
        "    from tests.utils import keep_me\n"
        "    from tests.utils import record_gpu_memory_usage_stats, wait_for_gpu_memory_to_clear\n"
    )
    return tmp_path


def test_migration_replaces_definitions_with_one_import(tmp_path: Path) -> None:
    migrate = _load("migrate")
    others = tuple(n for n in migrate.REPLACED if n != "record_gpu_memory_usage_stats")
    root = _vllm_tree(tmp_path, others)
    migrate.migrate_utils(root / "tests" / "utils.py")
    text = (root / "tests" / "utils.py").read_text()
    assert "def keep_me" in text
    assert "def _nvml" in text
    for name in migrate.REPLACED:
        assert f"def {name}" not in text
        assert f"    {name},\n" in text
    assert "@_nvml()" not in text  # the decorator went with its function
    compile(text, "utils.py", "exec")
    assert migrate.migrate_conftest(root / "tests" / "conftest.py") == 2
    conftest = (root / "tests" / "conftest.py").read_text()
    assert "    from accelplat.integrations.vllm import wait_for_memory_to_settle\n" in conftest
    assert "    from tests.utils import keep_me\n" in conftest
    assert (
        "from accelplat.integrations.vllm import record_gpu_memory_usage_stats, "
        "wait_for_gpu_memory_to_clear" in conftest
    )


def test_migration_refuses_a_file_that_lacks_a_helper(tmp_path: Path) -> None:
    migrate = _load("migrate")
    root = _vllm_tree(tmp_path, ())
    before = (root / "tests" / "utils.py").read_text()
    with pytest.raises(SystemExit, match="does not define"):
        migrate.migrate_utils(root / "tests" / "utils.py")
    assert (root / "tests" / "utils.py").read_text() == before


def _junit(path: Path, cases: dict[str, str]) -> Path:
    body = []
    for test_id, outcome in cases.items():
        module, name = test_id.split("::")
        inner = {
            "passed": "",
            "failed": "<failure message='x'/>",
            "skipped": "<skipped type='pytest.skip' message='s'/>",
            "xfailed": "<skipped type='pytest.xfail' message='x'/>",
        }[outcome]
        body.append(f"<testcase classname='{module}' name='{name}'>{inner}</testcase>")
    path.write_text(f"<testsuites><testsuite>{''.join(body)}</testsuite></testsuites>")
    return path


def test_compare_counts_and_fails_on_an_unexplained_difference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    compare = _load("compare")
    original = _junit(tmp_path / "o.xml", {"m::a": "passed", "m::b": "xfailed", "m::c": "passed"})
    migrated = _junit(tmp_path / "m.xml", {"m::a": "passed", "m::b": "xfailed", "m::c": "skipped"})
    allow = tmp_path / "allow.txt"
    allow.write_text("# nothing allowed\n")
    monkeypatch.setattr(sys, "argv", ["compare", str(original), str(migrated), str(allow)])
    assert compare.main() == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        "UNEXPLAINED DIFFERENCE: m::c: passed with vLLM's helpers, skipped with accelplat's" in out
    )
    assert out[-1] == (
        "vllm-suite: tests run original 3 / migrated 3, identical 2, different 1 "
        "(0 allowed, 1 unexplained)"
    )
    allow.write_text("m::c passed skipped  # justified in the docs\n")
    assert compare.main() == 0
    assert (
        capsys.readouterr().out.splitlines()[-1].endswith("different 1 (1 allowed, 0 unexplained)")
    )


def test_the_allow_list_is_the_documented_table() -> None:
    compare = _load("compare")
    entries = compare.allowed(TOOLS / "allowlist.txt")
    docs = (TOOLS.parents[1] / "docs" / "migrating-vllm-tests.md").read_text()
    table = docs.split("### Differences from vLLM", 1)[1].split("\n\n", 2)[2].split("\n\n")[0]
    rows = [r for r in table.splitlines()[2:] if r.startswith("| `")]
    documented = {tuple(c.strip().strip("`") for c in r.split("|")[1:4]) for r in rows}
    assert documented == entries
