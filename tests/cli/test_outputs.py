"""Where output goes: an ``--out`` that is not a regular file is refused and left alone; a
standard output that cannot be written (full, closed) ends every command with a short message
and status 1, never a traceback; values echoed in messages are escaped and shortened."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from accelplat._cli import main
from accelplat._cli._errors import shown
from accelplat._files import write_text_atomic
from accelplat._util import shorten
from accelplat.errors import NotARegularFileError

REPO = Path(__file__).resolve().parents[2]


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays


def _link_to(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def link(path: Path) -> None:
        target = path.with_name(path.name + ".target")
        make(target)
        path.symlink_to(target)

    return link


def _device(path: Path) -> None:  # a /dev/null of our own: replacing it would harm nothing
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


TARGETS = {
    "fifo": _fifo,
    "directory": _directory,
    "socket": _socket,
    "device": _device,
    "link-to-fifo": _link_to(_fifo),
    "link-to-directory": _link_to(_directory),
    "link-to-dev-null": lambda path: path.symlink_to(os.devnull),
    "link-to-link-to-fifo": _link_to(_link_to(_fifo)),
}

COMMANDS = {
    "capture": ["capture", "--samples", "0", "--out"],
    "record": ["record", "--out"],
    "record-html": ["record", "--out", "{ok}", "--html"],
    "report": ["report", "{trace}", "--out"],
}


def _kind(path: Path) -> tuple[bool, int]:
    st = path.lstat()
    return stat.S_ISLNK(st.st_mode), stat.S_IFMT(os.stat(path).st_mode)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("command", COMMANDS)
def test_an_out_that_is_not_a_regular_file_is_refused_and_left_alone(
    command: str, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    TARGETS[target](out)
    before = _kind(out)
    ran = tmp_path / "ran"
    argv = [a.format(ok=tmp_path / "ok.json", trace=tmp_path / "t.json") for a in COMMANDS[command]]
    argv.append(str(out))
    if command.startswith("record"):
        argv += ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert repr(str(out)) in err
    assert "not a regular file" in err
    assert _kind(out) == before  # still what it was
    assert not ran.exists()  # refused before the command ran
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="as root, a broken check would replace /dev/null")
@pytest.mark.parametrize("command", ["capture", "report"])
def test_dev_null_itself_is_refused(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*COMMANDS[command], os.devnull])
    assert exit_info.value.code == 2
    assert "'/dev/null' is a device" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["", "a\0b"])
def test_an_out_without_a_usable_name_is_usage(name: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["capture", "--out", name])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("target", TARGETS)
def test_the_one_writer_checks_again_when_it_writes(target: str, tmp_path: Path) -> None:
    """A target swapped for a FIFO (say) after the options were parsed is not replaced either."""
    out = tmp_path / "out"
    TARGETS[target](out)
    before = _kind(out)
    for data in ("text", b"bytes"):
        with pytest.raises(NotARegularFileError, match="not a regular file"):
            write_text_atomic(out, data)
    assert _kind(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_the_writer_still_replaces_a_regular_file_and_a_link_to_none(tmp_path: Path) -> None:
    regular, dangling = tmp_path / "regular", tmp_path / "dangling"
    regular.write_text("old")
    dangling.symlink_to(tmp_path / "nowhere")
    write_text_atomic(regular, b"new")
    write_text_atomic(dangling, "new")
    assert regular.read_text() == dangling.read_text() == "new"


# -- a standard output that cannot be written ---------------------------------------------------


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    spec = tmp_path_factory.mktemp("out") / "spec.json"
    spec.write_text(json.dumps({"clock": "virtual", "devices": [{"total": "8GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        ACCELPLAT_PLATFORM="simulated", ACCELPLAT_SIMULATED_SPEC=str(spec), PYTHONPATH=str(REPO)
    )
    return env


WRITERS = {
    "info": ["info"],
    "info-json": ["info", "--json"],
    "stats": ["stats"],
    "stats-watch-json": ["stats", "--json", "--watch", "0.01", "--count", "3"],
    "shm": ["shm"],
    "kv": [
        "kv",
        "--layers",
        "1",
        "--kv-heads",
        "1",
        "--head-size",
        "8",
        "--dtype",
        "2",
        "--max-model-len",
        "16",
    ],
    "wait-json": ["wait", "--threshold-ratio", "1", "--json"],
    "lease-status": ["lease", "--status", "--json"],
    "scan": ["scan", str(REPO / "accelplat" / "_cli" / "info.py")],
    "completion": ["completion", "bash"],
    "help": ["--help"],
    "sub-help": ["kv", "--help"],
    "version": ["--version"],
    "error-json": ["stats", "--json", "--devices", "7"],
}


@pytest.mark.parametrize("how", ["full", "closed"])
@pytest.mark.parametrize("argv", WRITERS.values(), ids=WRITERS.keys())
def test_an_unwritable_stdout_ends_with_a_message_and_status_1(
    argv: list[str], how: str, cli_env: dict[str, str]
) -> None:
    cmd = [sys.executable, "-m", "accelplat", *argv]
    if how == "closed":  # `>&-`: Python starts with sys.stdout None
        cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            cmd,
            stdout=full if how == "full" else None,
            stderr=subprocess.PIPE,
            env=cli_env,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert "cannot write standard output" in lines[-1]
    assert len(lines) <= 2, done.stderr  # the error itself, for error-json


@pytest.mark.parametrize("how", ["full", "closed"])
def test_a_command_that_writes_no_stdout_does_not_need_one(
    how: str, cli_env: dict[str, str]
) -> None:
    cmd = [sys.executable, "-m", "accelplat", "wait", "--threshold-ratio", "1"]
    if how == "closed":
        cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            cmd, stdout=full if how == "full" else None, stderr=subprocess.PIPE,
            env=cli_env, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "already clear" in done.stderr


# -- values echoed back ---------------------------------------------------------------------------

BIG = "x" * 100_000
BIG_VALUES = {
    "run": BIG,
    "with-blanks": "a " * 50_000,
    "escapes": "\x1b[2J" * 25_000,
    "many-lines": "x\n" * 50_000,
}


@pytest.mark.parametrize("value", BIG_VALUES.values(), ids=BIG_VALUES.keys())
@pytest.mark.parametrize(
    "case",
    [
        ("ACCELPLAT_PLATFORM", ["stats"]),
        ("ACCELPLAT_PLATFORM", ["info"]),
        ("ACCELPLAT_PLATFORM", ["wait", "--threshold-ratio", "1"]),
        ("ACCELPLAT_SIMULATED_SPEC", ["stats"]),
        ("ACCELPLAT_SIMULATED_SPEC", ["info"]),
        ("ACCELPLAT_SIMULATED_VISIBLE_DEVICES", ["info"]),
        ("ACCELPLAT_LEASE_DIR", ["lease", "--status"]),
    ],
)
def test_a_huge_variable_is_echoed_shortened(
    case: tuple[str, list[str]],
    value: str,
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from accelplat import _registry

    variable, argv = case
    for name, setting in cli_env.items():
        monkeypatch.setenv(name, setting)
    monkeypatch.setenv(variable, value)
    _registry.reset()
    try:
        main(argv)
    finally:
        _registry.reset()
    out, err = capsys.readouterr()
    assert len(out) + len(err) < 20_000, (out[:300], err[:300])
    for line in (out + err).splitlines():
        assert line.isprintable(), line[:300]


@pytest.mark.parametrize("value", [*BIG_VALUES.values(), "y" * 201, "z" * 1001], ids=repr)
def test_shown_caps_every_line_and_keeps_short_text(value: str) -> None:
    text = f"bad value {value!r} (set by X); valid names: a, b"
    result = shown(text, keep_newlines=True)
    assert len(result) <= 4100
    assert "valid names: a, b" in result  # the end of the message survives
    assert shown("short 'value' stays") == "short 'value' stays"
    assert shorten("abc", 3) == "abc"
    assert shorten("abcd", 3) == "abc… (4 characters)"
