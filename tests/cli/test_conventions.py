"""The command line's conventions: ``-V``, a sub-command's own usage and a suggestion for an
unknown option, named values in every usage line, and each error's prefix said once."""

from __future__ import annotations

import re

import pytest

from accelplat import __version__
from accelplat._cli import build_parser, main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors and --version
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_the_version_has_a_short_flag(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    assert _run(capsys, flag) == (0, f"accelplat {__version__}\n", "")


@pytest.mark.parametrize(
    ("argv", "unknown", "guess"),
    [
        (["stats", "--wach", "1"], "--wach 1", "--watch"),
        (["info", "--jsn"], "--jsn", "--json"),
        (["wait", "--threshold-ration", "0.1"], "--threshold-ration 0.1", "--threshold-ratio"),
        (["shm", "--reqire=4GiB"], "--reqire=4GiB", "--require"),
        (["report", "t.json", "--chrome-trce", "c.json"], "--chrome-trce c.json", "--chrome-trace"),
        (["kv", "--zzz"], "--zzz", None),
    ],
    ids=["stats", "info", "wait", "shm-with-value", "report", "no-guess"],
)
def test_an_unknown_option_gets_its_commands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str], argv: list[str], unknown: str, guess: str | None
) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith(f"usage: accelplat {argv[0]} "), err  # its usage, not the top level's
    last = err.strip().splitlines()[-1]
    hint = f" (did you mean {guess}?)" if guess else ""
    if argv[0] != "kv":
        assert last == f"accelplat {argv[0]}: error: unrecognized arguments: {unknown}{hint}"
    else:  # kv's required options are missing too: argparse names those first
        assert "did you mean" not in last


def test_an_unknown_top_level_option_gets_the_top_level_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = _run(capsys, "--verison")
    assert code == 2
    assert err.startswith("usage: accelplat [-h] [-V] COMMAND")
    assert err.rstrip().endswith("(did you mean --version?)")


def _usages() -> dict[str, str]:
    parser = build_parser()
    return {name: sub.format_usage() for name, sub in parser.commands.items()}


@pytest.mark.parametrize("command", sorted(_usages()))
def test_every_value_is_named_not_the_option_shouted(command: str) -> None:
    """``--layers N``, ``--out BUNDLE``: never argparse's default ``--layers LAYERS``."""
    usage = " ".join(_usages()[command].split())
    for option, value in re.findall(r"(--[\w-]+)[ =]([A-Z][A-Z0-9_]*)\b", usage):
        if (option, value) == ("--pid", "PID"):  # the name every tool gives a process id
            continue
        assert value != option[2:].replace("-", "_").upper(), f"{command}: {option} {value}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "trace.json"], "needs --out REPORT.html or --chrome-trace OUT.json"),
        (["record", "--out", "t.json"], "needs a command after `--`"),
    ],
)
def test_an_error_names_its_command_once(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.strip() == f"accelplat {argv[0]}: error: {message}" + (
        " (or both)" if argv[0] == "report" else ""
    )


def test_help_and_version_load_no_platform_code() -> None:
    """A command loads what it runs when it runs: ``--version`` and ``--help`` stay quick."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from accelplat._cli import main\n"
        "for argv in (['--version'], ['--help'], ['lease', '--help'], ['stats', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(out.split())
    for heavy in ("_platform", "_registry", "_memory", "_leasing", "_enforce", "_scan"):
        assert f"accelplat.{heavy}" not in loaded
    assert not {"rich", "psutil", "shtab"} & loaded
