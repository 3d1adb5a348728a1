"""The vLLM tools on hostile input: trees for the proof and the migration, paths for --out."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.nvml_mock import main as nvml_mock

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "vllm_capabilities"
GOOD = """
import pytest
from vllm.platforms import current_platform

@pytest.mark.skipif(not current_platform.is_cuda(), reason="CUDA")
def test_a():
    pass
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A vLLM-like root whose tests/ hold one good file among hostile ones."""
    root = tmp_path_factory.mktemp("vllm")
    tests = root / "tests"
    tests.mkdir()
    (tests / "test_good.py").write_text(GOOD)
    (tests / "test_binary.py").write_bytes(b"\x7fELF\x00\xff\xfe" * 64)
    (tests / "test_deep_expression.py").write_text("x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    (tests / "test_not_chain.py").write_text("x = " + "not " * 200_000 + "y\n")
    (tests / "test_unary_chain.py").write_text("x = " + "-" * 900 + "y\n")  # parses, deep
    (tests / "test_\x1b]0;owned\x07.py").write_text(GOOD)  # retitles a terminal, printed raw
    (root / "outside.py").write_text(GOOD)
    # 1,100 directories deep, made and removed without recursion (pathlib and rmtree recurse)
    chain = [os.path.join(str(tests), *["d"] * n) for n in range(1, 1101)]
    for directory in chain:
        os.mkdir(directory)
    bottom = os.path.join(chain[-1], "test_bottom.py")
    with open(bottom, "w") as f:
        f.write(GOOD)
    yield root
    os.unlink(bottom)
    for directory in reversed(chain):
        os.rmdir(directory)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, check=False
    )


def test_the_proof_leaves_hostile_files_out_and_names_them(hostile: Path) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import prove  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TOOLS))
    findings, checks, _, mismatches, skipped = prove.collect(hostile / "tests")
    assert {f.path for f in findings} == {"test_good.py", "test_\x1b]0;owned\x07.py"}
    assert len(checks) == 2
    assert not mismatches
    text = "\n".join(skipped)
    assert "test_binary.py" in text
    assert "test_deep_expression.py" in text
    assert "test_not_chain.py" in text
    assert "directories deep" in text  # the 1,100-deep tree stops at scan's depth, named


def test_the_migration_survives_the_tree_and_escapes_names(hostile: Path, tmp_path: Path) -> None:
    listing = tmp_path / "files.txt"
    listing.write_text("../outside.py\n/etc/passwd\ntest_binary.py\ntest_good.py\n")
    done = _run(str(TOOLS / "migrate.py"), str(hostile), "--files", str(listing), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "'../outside.py': outside" in done.stderr
    assert "'/etc/passwd': outside" in done.stderr
    assert "test_binary.py'" in done.stderr
    assert "test_good.py': 1 condition(s) rewritten" in done.stdout
    done = _run(str(TOOLS / "migrate.py"), str(hostile), "--all", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr
    assert "\\x1b]0;owned\\x07.py'" in done.stdout
    assert (hostile / "outside.py").read_text() == GOOD


def test_nvml_mock_never_writes_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    link = tmp_path / "profile.yaml"
    link.symlink_to(target)
    bundle = str(REPO / "tests" / "hosts" / "nvidia-t4-x4.tar.gz")
    assert nvml_mock(["export", bundle, "--out", str(link)]) == 0
    assert target.read_text() == "keep"
    assert not link.is_symlink()
    assert link.read_text().startswith("# nvml-mock profile")


def test_nvml_mock_names_a_bad_out_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = str(REPO / "tests" / "hosts" / "nvidia-t4-x4.tar.gz")
    assert nvml_mock(["export", bundle, "--out", str(tmp_path / "no" / "such.yaml")]) == 2
    assert "No such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        nvml_mock(["export", bundle, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert "is a directory, not a regular file; not replaced" in capsys.readouterr().err
