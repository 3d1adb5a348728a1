"""``accelplat scan``: platform predicates found with the ast module, grouped and mapped."""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from accelplat import _scan as scan
from accelplat._cli import main
from accelplat._describe import SCHEMA_VERSION
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


def by_line() -> dict[tuple[int, str], tuple[str, str | None, str | None]]:
    return {
        (f.line, f.predicate): (f.use, f.replacement, f.missing)
        for f in scan_source(SOURCE, "t.py")
    }


TORCH_BUILD = "torch build (torch.version.*), not the device"


def test_predicates_are_found_in_code_only_and_replaced_from_the_condition() -> None:
    # the reasons' words ("fp8", "graphs") choose nothing: the condition's syntax tree does
    assert by_line() == {
        (10, "is_cuda()"): (
            "skipif",
            "accelplat.testing.requires(\"cuda\", reason='fp8 kernels need CUDA')",
            None,
        ),
        (14, "has_device_capability(90)"): (
            "skipif",
            "accelplat.testing.requires(\"capability>=90\", reason='Hopper only')",
            None,
        ),
        (18, "torch.cuda.device_count()"): ("skipif", None, scan.COUNT),
        (23, "is_rocm()"): ("skip", 'accelplat.has("rocm")', None),
        (25, "torch.version.hip"): ("branch", None, TORCH_BUILD),
        (25, "on_gfx9()"): ("branch", None, scan.TOLERANCES),
        (29, "fp8_dtype()"): ("expression", None, "fp8 dtype value"),
        (30, 'hasattr(torch, "xpu")'): ("branch", None, TORCH_BUILD),
    }


MODULE = textwrap.dedent(
    """
    import pytest
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda() or current_platform.is_xpu()):
        pytest.skip("CUDA or XPU only", allow_module_level=True)

    @pytest.mark.skipif(current_platform.is_cpu(), reason="CPU only")
    def test_a(dtype):
        if current_platform.is_rocm() and dtype == "fp8":
            pytest.skip("no fp8 here")
        if current_platform.is_cuda() and torch.cuda.get_device_capability() < (9, 0):
            pytest.skip("Hopper")
    """
)


MODULE_SKIP = "accelplat.testing.skip_module_unless(\"cuda or xpu\", reason='CUDA or XPU only')"


def test_module_skips_and_partial_conditions() -> None:
    found = [(f.line, f.replacement) for f in scan_source(MODULE)]
    assert found == [
        (5, MODULE_SKIP),
        (5, MODULE_SKIP),
        # never "accelerator": not the inverse
        (8, "accelplat.testing.requires(\"not cpu\", reason='CPU only')"),
        (10, 'accelplat.has("rocm")'),  # the dtype part stays as it is
        (12, 'accelplat.has("cuda and capability<90")'),
        (12, 'accelplat.has("cuda and capability<90")'),
    ]


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
    assert summary["replaceable"] == 3
    assert summary["by_replacement"] == {"requires": 2, "has": 1}
    assert summary["without_replacement"][scan.TOLERANCES] == 1
    assert report.errors == [
        "link.py: a link, not followed",
        "test_broken.py: does not parse (SyntaxError)",
    ]


def test_missing_path_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        scan_path(tmp_path / "nope")


def test_cli_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test_a.py").write_text(SOURCE)
    assert main(["scan", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == SCHEMA_VERSION
    assert doc["predicates"] == len(doc["findings"]) == 8
    assert doc["findings"][0] == {
        "path": "test_a.py",
        "line": 10,
        "predicate": "is_cuda()",
        "kind": "platform",
        "use": "skipif",
        "replacement": "accelplat.testing.requires(\"cuda\", reason='fp8 kernels need CUDA')",
        "missing": None,
        "source": "@pytest.mark.skipif(not current_platform.is_cuda(), "
        'reason="fp8 kernels need CUDA")',
    }
    assert main(["scan", str(tmp_path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| `requires` | 2 | 25.0 % |" in out
    assert main(["scan", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"accelplat scan: error: path '{tmp_path / 'missing'}' does not exist")
    assert err.count("scan:") == 1


def _git(repo: Path, *args: str) -> None:
    import subprocess

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def test_diff_fails_only_on_added_predicates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text("x = is_rocm()\ny = is_cuda()\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    # moved within the file and into another file: nothing added
    (tests / "test_a.py").write_text("\n\ny = is_cuda()\n")
    (tests / "test_b.py").write_text("z = 1\nx = is_rocm()\n")
    assert main(["scan", str(tests), "--diff", "HEAD"]) == 0
    assert capsys.readouterr().out.startswith("0 platform predicate(s) added since HEAD")
    (tests / "test_b.py").write_text(
        "x = is_rocm()\nif current_platform.is_xpu():\n    pytest.skip('no')\n"
    )
    assert main(["scan", str(tests), "--diff", "HEAD"]) == 1
    out = capsys.readouterr().out
    assert "1 platform predicate(s) added since HEAD" in out
    assert 'test_b.py:2: is_xpu() [skip] -> accelplat.has("xpu")' in out
    assert main(["scan", str(tests), "--diff", "HEAD", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["base"], [(f["path"], f["line"]) for f in doc["added"]]) == (
        "HEAD",
        [("test_b.py", 2)],
    )
    assert main(["scan", str(tests), "--diff", "no-such-revision"]) == 2
    assert main(["scan", str(tests), "--diff=-x"]) == 2  # never an option of git's


def test_links_are_listed_not_followed_and_the_scan_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text("x = is_rocm()\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    (tests / "loop").symlink_to("loop")  # refers to itself: every stat of it fails
    (tests / "up").symlink_to("..")
    (tests / "data.json").symlink_to(tests / "test_a.py")  # a link no test lives in: silent
    assert main(["scan", str(tests), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == ["loop: a link, not followed", "up: a link, not followed"]
    assert (doc["files_scanned"], doc["predicates"]) == (1, 1)
    assert main(["scan", str(tests), "--diff", "HEAD"]) == 0  # a stray link adds nothing


def test_oversized_and_special_files_are_listed_not_read(tmp_path: Path) -> None:
    from accelplat import _scan as scan

    (tmp_path / "test_big.py").write_text("x = 1\n" * (scan.MAX_FILE_BYTES // 6 + 10))
    os.mkfifo(tmp_path / "test_fifo.py")
    report = scan_path(tmp_path)
    assert report.files_scanned == 0
    assert report.errors[0] == f"test_big.py: larger than {scan.MAX_FILE_BYTES} bytes"
    assert report.errors[1].startswith("test_fifo.py: ")


# -- hostile input (issue 23): linear work, deep nesting, deep trees, names -----------------------


def _steps(source: str) -> int:
    """Python line events while scanning ``source``: a work count, not a clock."""
    import sys
    from types import FrameType

    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal count
        count += 1
        return tracer

    sys.settrace(tracer)  # type: ignore[arg-type]
    try:
        scan_source(source)
    finally:
        sys.settrace(None)
    return count


LINEAR_SHAPES: dict[str, Callable[[int], str]] = {
    "if blocks": lambda n: "if current_platform.is_rocm():\n    x = 1\n" * n,
    "assignments": lambda n: "x = current_platform.is_rocm()\n" * n,
    "skipifs": lambda n: "@pytest.mark.skipif(is_rocm(), reason='fp8')\ndef t(): pass\n" * n,
    "skips in ifs": lambda n: "if is_cuda():\n    pytest.skip('needs 2 GPUs')\n" * n,
    "elif chain": lambda n: "if is_rocm(): pass\n" + "elif is_cuda(): x = 'fp8'\n" * n,
    "wide if test": lambda n: f"if {' or '.join(['is_rocm()'] * n)}:\n    pass\n",
    "one big list": lambda n: "x = [" + ",\n".join(["is_rocm()"] * n) + "]\n",
    "nested ifs, big body": lambda n: (
        "".join(f"{' ' * i}if is_rocm():\n" for i in range(40))
        + "".join(f"{' ' * 40}y = 'atol {i}'\n" for i in range(n))
    ),
    "attribute chain": lambda n: "x = torch" + ".hip" * n + "\n",
    "many decorators": lambda n: "@is_rocm()\n" * n + "def f():\n" + "    x = 1\n" * n,
    "one long line": lambda n: "; ".join(["x = is_rocm()"] * n) + "\n",
}


@pytest.mark.parametrize("shape", sorted(LINEAR_SHAPES))
def test_scan_work_grows_linearly_with_the_file(shape: str) -> None:
    make = LINEAR_SHAPES[shape]
    small, large = _steps(make(100)), _steps(make(400))
    assert large <= 5 * small, f"{shape}: 4x the input took {large / small:.1f}x the work"


DEEP = {
    "binop chain": "x = " + "is_rocm() + " * 50_000 + "1\n",
    "unary chain": "x = " + "-" * 100_000 + "1\n",
    "parentheses": "x = " + "(" * 5_000 + "1" + ")" * 5_000 + "\n",
    "lists": "x = " + "[" * 5_000 + "]" * 5_000 + "\n",
    "calls": "x = f" + "()" * 100_000 + "\n",
    "attributes": "x = a" + ".b" * 100_000 + "\n",
    "lambdas": "x = " + "lambda: " * 20_000 + "1\n",
    "elif chain": "if a: pass\n" + "elif is_rocm(): pass\n" * 10_000,
    "boolean chain": "x = " + " or ".join(["not is_rocm()"] * 50_000) + "\n",
}


def test_deep_nesting_is_reported_per_file_never_raised(tmp_path: Path) -> None:
    for i, source in enumerate(DEEP.values()):
        (tmp_path / f"test_{i}.py").write_text(source)
    report = scan_path(tmp_path)  # no RecursionError, no MemoryError
    failed = {e.split(":", 1)[0] for e in report.errors}
    assert report.files_scanned + len(failed) == len(DEEP)
    assert all("does not parse (" in e for e in report.errors), report.errors
    assert any("nested too deeply" in e for e in report.errors)


def _deep_tree(root: Path, depth: int, name: str = "d") -> None:
    fd = os.open(root, os.O_RDONLY)
    try:
        for level in range(depth):  # by descriptor: the whole path may pass PATH_MAX
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            if level in (0, depth - 1):
                os.close(os.open("test_x.py", os.O_WRONLY | os.O_CREAT, dir_fd=inner))
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


def _remove_deep_tree(root: Path, depth: int, name: str) -> None:
    fds = [os.open(root, os.O_RDONLY)]
    try:
        for _ in range(depth):  # down by descriptor, then up: no path, no recursion
            fds.append(os.open(name, os.O_RDONLY, dir_fd=fds[-1]))
        for level in range(depth, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.unlink("test_x.py", dir_fd=fds[level])
            os.close(fds.pop())
            os.rmdir(name, dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize(
    ("depth", "name", "skipped"),
    [
        (1_000, "d", "more than 64 directories deep"),
        (64, "d", None),
        (65, "d", "more than 64 directories deep"),
        (40, "n" * 200, "unreadable"),  # 8,000 characters: past PATH_MAX
    ],
)
def test_deep_trees_are_bounded_and_reported(
    tmp_path: Path, depth: int, name: str, skipped: str | None, request: pytest.FixtureRequest
) -> None:
    _deep_tree(tmp_path, depth, name)
    # shutil.rmtree recurses (and pytest's clean-up of old temporary folders with it): a tree
    # this deep, or this long, left behind breaks every later session's clean-up.
    request.addfinalizer(lambda: _remove_deep_tree(tmp_path, depth, name))
    (tmp_path / "loop").symlink_to(tmp_path)  # a link to a directory is not entered
    report = scan_path(tmp_path)
    assert report.files_scanned >= 1
    assert report.errors[0] == "loop: a link, not followed"
    if skipped is None:
        assert (report.files_scanned, report.errors[1:]) == (2, [])
    else:
        assert len(report.errors) == 2
        assert skipped in report.errors[1]


NAMES = ["\x1b]0;owned\x07", "a\nb", "a\rb", "\u202eyp.", "bell\x07", "tab\tx", "\x9b31m"]


@pytest.mark.parametrize("name", NAMES)
def test_file_names_are_escaped_in_every_text_form(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / f"root{name}"
    root.mkdir()
    (root / f"test_{name}.py").write_text("x = is_rocm()\n")
    (root / f"bad_{name}.py").write_text("def f(:\n")
    for flags in ([], ["--files"], ["--markdown"]):
        assert main(["scan", str(root), *flags]) == 0
        out = capsys.readouterr().out
        assert all(line.isprintable() for line in out.split("\n")), out
    assert main(["scan", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["path"] == f"test_{name}.py"


def test_undecodable_file_name_is_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / os.fsdecode(b"test_\xff.py")).write_text("x = is_rocm()\n")
    assert main(["scan", str(tmp_path), "--files"]) == 0
    assert "test_\\udcff.py:1: is_rocm()" in capsys.readouterr().out


def test_a_predicate_without_a_replacement_names_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_a.py").write_text(
        "@multi_gpu_test(num_gpus=2)\ndef test_x():\n    pass\n"
        "@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='two')\n"
        "def test_y():\n    pass\n"
    )
    assert main(["scan", str(tmp_path), "--files"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "-> " in line]
    assert len(lines) == 2
    for line in lines:
        said = line.partition("-> ")[2]
        assert said == f"no exact replacement: {scan.COUNT}"
        assert "requires(" not in said
