"""``accelplat completion``: scripts generated from the parser by shtab, run in real shells."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from accelplat._cli import SHELLS, build_parser, main

COMMANDS = sorted(
    next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
)


def _script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def _bash_complete(text: str, words: list[str], cwd: Path) -> list[str]:
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"{text}\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()\n"
        "_shtab_accelplat\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


@pytest.fixture
def bash_script(capsys: pytest.CaptureFixture[str]) -> str:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    return _script("bash", capsys)


def test_every_command_is_known() -> None:
    assert {"info", "stats", "wait", "completion", "record", "lease"} <= set(COMMANDS)


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["accelplat", ""], COMMANDS),  # every sub-command of the parser: no list kept by hand
        (["accelplat", "st"], ["stats"]),
        (["accelplat", "-"], ["-h", "--help", "-V", "--version"]),
        (["accelplat", "completion", ""], ["bash", "zsh", "fish"]),
        (["accelplat", "completion", "z"], ["zsh"]),
        (["accelplat", "stats", "--w"], ["--watch"]),
        (["accelplat", "stats", "--watch", "1", "--ho"], ["--holders"]),
        (["accelplat", "stats", "--watch", ""], []),  # a number: nothing to offer
        (["accelplat", "info", "--"], ["--help", "--json", "--replay"]),
    ],
)
def test_bash_completes_commands_options_and_choices(
    bash_script: str, tmp_path: Path, words: list[str], expected: list[str]
) -> None:
    assert sorted(_bash_complete(bash_script, words, tmp_path)) == sorted(expected)


def test_bash_completes_file_names_where_a_path_goes(bash_script: str, tmp_path: Path) -> None:
    (tmp_path / "trace-1.json").write_text("{}")
    (tmp_path / "other.txt").write_text("")
    (tmp_path / "locks").mkdir()
    assert _bash_complete(bash_script, ["accelplat", "report", "tr"], tmp_path) == ["trace-1.json"]
    assert _bash_complete(bash_script, ["accelplat", "report", "--out", "o"], tmp_path) == [
        "other.txt"
    ]
    assert _bash_complete(bash_script, ["accelplat", "lease", "--lock-dir", ""], tmp_path) == [
        "locks"
    ]


def test_bash_completes_dtype_names_not_file_names(bash_script: str, tmp_path: Path) -> None:
    (tmp_path / "bf16-notes.txt").write_text("")
    words = ["accelplat", "kv", "--dtype"]
    assert _bash_complete(bash_script, [*words, "bf"], tmp_path) == ["bf16", "bfloat16"]
    offered = _bash_complete(bash_script, [*words, ""], tmp_path)
    assert {"bf16", "fp8", "float32"} <= set(offered)
    assert "bf16-notes.txt" not in offered


def test_zsh_script_is_valid_zsh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    path = tmp_path / "_accelplat"
    path.write_text(_script("zsh", capsys))
    assert subprocess.run(["zsh", "-n", str(path)], check=False, timeout=60).returncode == 0
    assert path.read_text().startswith("#compdef accelplat")


def test_fish_script_completes_in_fish(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    path = tmp_path / "accelplat.fish"
    path.write_text(_script("fish", capsys))
    assert subprocess.run(["fish", "-n", str(path)], check=False, timeout=60).returncode == 0

    def complete(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert sorted(complete("accelplat ")) == COMMANDS
    assert complete("accelplat st") == ["stats"]
    assert sorted(complete("accelplat completion ")) == ["bash", "fish", "zsh"]
    assert "--holders" in complete("accelplat stats --")
    assert complete("accelplat kv --dtype bf") == ["bf16", "bfloat16"]


@pytest.mark.parametrize("shell", SHELLS)
def test_the_cli_prints_a_script_for_each_shell(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _script(shell, capsys)
    assert "accelplat" in text
    assert "holders" in text  # an option of a sub-command


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["completion", "tcsh"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
