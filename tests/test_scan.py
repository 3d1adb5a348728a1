"""``accelplat scan``: platform predicates found with the ast module, grouped and mapped."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from accelplat._cli import main
from accelplat._scan import scan_path, scan_source
from accelplat.errors import ConfigurationError

SOURCE = textwrap.dedent(
    """
    import pytest
    import torch
    from vllm.platforms import current_platform
    from vllm.platforms.rocm import on_gfx9

    # is_rocm() in a comment and "current_platform.is_cuda()" in a string are not predicates
    NOTE = "current_platform.is_cuda()"

    @pytest.mark.skipif(not current_platform.is_cuda(), reason="fp8 kernels need CUDA")
    def test_fp8():
        pass

    @pytest.mark.skipif(not current_platform.has_device_capability(90), reason="Hopper only")
    def test_hopper():
        pass

    @pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
    def test_tp2():
        pass

    def test_body():
        if current_platform.is_rocm():
            pytest.skip("CUDA graphs are not supported on ROCm")
        if torch.version.hip is not None or on_gfx9():
            atol = 1e-2
        else:
            atol = 1e-3
        dtype = current_platform.fp8_dtype()
        if hasattr(torch, "xpu"):
            backend = "XPU_ATTN"
    """
)


def by_line() -> dict[tuple[int, str], tuple[str, str, str | None]]:
    return {
        (f.line, f.predicate): (f.use, f.group, f.replacement) for f in scan_source(SOURCE, "t.py")
    }


FEATURE = "feature/kernel/dtype support"


def test_predicates_are_found_in_code_only_and_classified() -> None:
    found = by_line()
    assert found == {
        (10, "is_cuda()"): ("skipif", FEATURE, 'builtin: accelplat_requires("fp8")'),
        (14, "has_device_capability(90)"): (
            "skipif",
            FEATURE,
            "project: capability with arch sm_90+",
        ),
        (18, "torch.cuda.device_count()"): (
            "skipif",
            "device count",
            "requirement: accelplat_requires(devices=N)",
        ),
        (23, "is_rocm()"): ("skip", "graphs", 'builtin: accelplat_requires("graphs")'),
        (25, "torch.version.hip"): ("branch", "tolerances", None),
        (25, "on_gfx9()"): ("branch", FEATURE, "project: capability with arch gfx…"),
        (29, "fp8_dtype()"): ("expression", FEATURE, 'builtin: capabilities()["fp8"].value'),
        (30, 'hasattr(torch, "xpu")'): ("branch", "other", None),
    }


def test_tree_scan_counts_and_skips_what_it_cannot_parse(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_a.py").write_text(SOURCE)
    (tmp_path / "test_broken.py").write_text("def f(:\n")
    (tmp_path / "test_none.py").write_text("def test_x():\n    assert 1\n")
    (tmp_path / "notes.txt").write_text("current_platform.is_rocm()")
    (tmp_path / "link.py").symlink_to(tmp_path / "sub" / "test_a.py")
    report = scan_path(tmp_path)
    summary = report.summary()
    assert (summary["files_scanned"], summary["files_with_predicates"]) == (2, 1)
    assert summary["predicates"] == 8
    assert summary["replaceable"] == 6
    assert summary["by_group"]["feature/kernel/dtype support"] == 4
    assert report.errors == [
        "link.py: not a regular file",
        "test_broken.py: does not parse (SyntaxError)",
    ]


def test_missing_path_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        scan_path(tmp_path / "nope")


def test_cli_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test_a.py").write_text(SOURCE)
    assert main(["scan", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1
    assert doc["predicates"] == len(doc["findings"]) == 8
    assert doc["findings"][0] == {
        "path": "test_a.py",
        "line": 10,
        "predicate": "is_cuda()",
        "kind": "platform",
        "use": "skipif",
        "group": "feature/kernel/dtype support",
        "replacement": 'builtin: accelplat_requires("fp8")',
    }
    assert main(["scan", str(tmp_path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| feature/kernel/dtype support | 4 | 4 |" in out
    assert main(["scan", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_oversized_and_special_files_are_listed_not_read(tmp_path: Path) -> None:
    import os

    from accelplat import _scan as scan

    (tmp_path / "test_big.py").write_text("x = 1\n" * (scan.MAX_FILE_BYTES // 6 + 10))
    os.mkfifo(tmp_path / "test_fifo.py")
    report = scan_path(tmp_path)
    assert report.files_scanned == 0
    assert report.errors[0] == f"test_big.py: larger than {scan.MAX_FILE_BYTES} bytes"
    assert report.errors[1].startswith("test_fifo.py: ")
