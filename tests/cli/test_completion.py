"""``accelplat completion``: scripts generated from the parser, exercised in the real shells."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from accelplat._cli import build_parser, main
from accelplat._cli.completion import SHELLS, script, spec_of

COMMANDS = sorted(spec_of(build_parser(), "accelplat").commands)


def _bash_complete(text: str, words: list[str], cwd: Path) -> list[str]:
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"{text}\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()\n"
        "_accelplat_complete\n"
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


@pytest.fixture(scope="module")
def bash_script() -> str:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    return script("bash")


def test_every_command_is_known() -> None:
    # the commands come from the parser: nothing is listed by hand
    assert {"info", "stats", "wait", "completion"} <= set(COMMANDS)


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["accelplat", ""], COMMANDS),
        (["accelplat", "st"], ["stats"]),
        (["accelplat", "-"], ["-h", "--help", "--version"]),
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
    assert _bash_complete(bash_script, ["accelplat", "report", "tr"], tmp_path) == ["trace-1.json"]
    assert _bash_complete(bash_script, ["accelplat", "report", "--out", "o"], tmp_path) == [
        "other.txt"
    ]


def test_a_command_added_later_is_completed_without_editing_the_script(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    extra = sub.add_parser("frobnicate", help="a new command")
    extra.add_argument("--level", choices=["low", "high"])
    text = script("bash", parser)
    assert _bash_complete(text, ["accelplat", "frob"], tmp_path) == ["frobnicate"]
    assert _bash_complete(text, ["accelplat", "frobnicate", "--level", ""], tmp_path) == [
        "low",
        "high",
    ]


def test_zsh_script_completes_in_zsh(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    path = tmp_path / "_accelplat"
    path.write_text(script("zsh"))
    assert subprocess.run(["zsh", "-n", str(path)], check=False, timeout=60).returncode == 0
    # The completion system's builtins, replaced by stand-ins that print what they are given.
    program = (
        "compdef() { :; }\n"
        'compadd() { [[ "$1" == -- ]] && shift; printf "%s\\n" "$@"; }\n'
        '_describe() { local -a c; c=("${(@P)${@[-1]}}"); printf "%s\\n" "${c[@]%%:*}"; }\n'
        "_files() { print -- '<files>'; }\n"
        f"source {path}\n"
        "complete() { words=($@); CURRENT=$#; PREFIX=${words[-1]}; _accelplat; }\n"
        "print -- '== top'; complete accelplat ''\n"
        "print -- '== shell'; complete accelplat completion ''\n"
        "print -- '== stats'; complete accelplat stats --\n"
        "print -- '== report'; complete accelplat report ''\n"
    )
    done = subprocess.run(
        ["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    sections: dict[str, list[str]] = {}
    current = ""
    for line in done.stdout.splitlines():
        if line.startswith("== "):
            current = line[3:]
            sections[current] = []
        elif line:
            sections[current].append(line)
    assert sorted(sections["top"]) == COMMANDS
    assert sections["shell"] == ["bash", "zsh", "fish"]
    assert "--holders" in sections["stats"]
    assert "--watch" in sections["stats"]
    assert sections["report"] == ["<files>"]


def test_fish_script_completes_in_fish(tmp_path: Path) -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    path = tmp_path / "accelplat.fish"
    path.write_text(script("fish"))
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


@pytest.mark.parametrize("shell", SHELLS)
def test_the_cli_prints_the_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    assert capsys.readouterr().out == script(shell)


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["completion", "tcsh"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tcsh"):
        script("tcsh")
