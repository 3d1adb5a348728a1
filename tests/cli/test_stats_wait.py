"""``accelplat stats`` and ``accelplat wait`` on the simulated platform (virtual-clock specs)."""

from __future__ import annotations

import getpass
import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from accelplat._cli import build_parser, main
from accelplat._cli import stats as stats_cli
from accelplat._cli._args import color, parse_devices
from accelplat._cli.stats import use_rich
from accelplat._cli.wait import Progress
from accelplat._memory import PollPolicy
from accelplat._types import GIB, MemoryInfo, UsageSnapshot

ROOT = Path(__file__).resolve().parents[2]

RELEASING = {
    "clock": "virtual",
    "devices": [
        {
            "name": "Sim A",
            "total": "80GiB",
            "used": "60GiB",
            "timeline": [{"at": 1.0, "used": "1GiB"}],
            "holders": [{"used": "1GiB", "pid": 4242, "name": "engine", "end": 0.5}],
        },
        {"name": "Sim B", "total": "80GiB"},
    ],
}

STUCK = {
    "clock": "virtual",
    "release": {"lazy": False, "settle_timeout_s": 30.0},
    "devices": [
        {
            "total": "80GiB",
            "used": "60GiB",
            "timeline": [
                {"at": 0.5, "used": 0},
                {"stuck": {"used": "8GiB", "pid": 31337, "name": "leaky-worker"}},
            ],
        }
    ],
}

LAZY = {
    "clock": "virtual",
    "release": {"lazy": True, "stable_duration_s": 2.0, "settle_timeout_s": 60.0},
    "devices": [{"total": "80GiB", "used": "40GiB", "timeline": [{"at": 0.25, "used": 0}]}],
}


@pytest.fixture
def use_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def apply(spec: dict[str, Any]) -> Path:
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(spec))
        monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
        monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(path))
        return path

    return apply


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------
# helpers


def test_parse_devices() -> None:
    assert parse_devices("0,1") == [0, 1]
    assert parse_devices(" 2 ") == [2]
    assert parse_devices("all") is None
    for bad in ("a", "0,,1", "-1", "1.5", "0,0"):
        with pytest.raises(Exception, match=r"--devices|twice"):
            parse_devices(bad)


@pytest.mark.parametrize(
    ("flag", "text", "expected"),
    [
        ("--threshold-bytes", "4GiB", 4 * GIB),
        ("--threshold-bytes", "512MiB", 512 * 1024**2),
        ("--threshold-bytes", "8GB", 8 * 10**9),
        ("--threshold-bytes", "1024B", 1024),
        ("--threshold-bytes", "0", 0),  # nothing: the one bare number that reads one way
        ("--tolerance", " 64 MiB ", 64 * 1024**2),
    ],
)
def test_size_options_take_a_unit(flag: str, text: str, expected: int) -> None:
    parser = build_parser()
    args = parser.parse_args(["wait", f"{flag}={text}"])
    assert getattr(args, flag[2:].replace("-", "_")) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["shm", "--require", "4"], '--require: "4" has no unit; write 4GiB, 4GB or 4B'),
        (["wait", "--threshold-bytes", "1024"], '--threshold-bytes: "1024" has no unit'),
        (["lease", "--min-free", "40", "--", "true"], '--min-free: "40" has no unit'),
        (["kv", "--layers", "1", "--kv-heads", "1", "--head-size", "8", "--dtype", "2",
          "--max-model-len", "4", "--available", "1.5"], '--available: "1.5" has no unit'),
        (["wait", "--threshold-bytes", "4XB"], "--threshold-bytes must be a non-negative size"),
        (["wait", "--threshold-bytes=-4GiB"], "--threshold-bytes must be a non-negative size"),
        (["wait", "--threshold-bytes", ""], "--threshold-bytes must be a non-negative size"),
    ],
)  # fmt: skip
def test_a_size_without_a_unit_is_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert f"accelplat {argv[0]}: error: {message}" in err
    assert out == ""


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_use_rich_only_on_capable_terminals(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rich")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    assert use_rich(FakeTTY())
    assert not use_rich(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_rich(FakeTTY())  # the live view, drawn without colour
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not use_rich(FakeTTY())


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {}, None),
        (None, {"FORCE_COLOR": "1"}, True),
        (None, {"NO_COLOR": "1"}, False),
        (None, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
        (None, {"NO_COLOR": "", "FORCE_COLOR": ""}, None),  # set but empty: not set
        (True, {"NO_COLOR": "1"}, True),
        (False, {"FORCE_COLOR": "1"}, False),
    ],
)
def test_colour_is_the_flag_then_no_color_then_force_color(
    flag: bool | None, env: dict[str, str], expected: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert color(flag) is expected


@pytest.mark.parametrize(
    "case",
    [
        pytest.param((["--color"], {}, True), id="color"),
        pytest.param(([], {"FORCE_COLOR": "1"}, True), id="FORCE_COLOR"),
        pytest.param((["--no-color"], {"FORCE_COLOR": "1"}, False), id="no-color-wins"),
        pytest.param(([], {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False), id="NO_COLOR-wins"),
        pytest.param(([], {}, False), id="piped"),
    ],
)
def test_a_pipe_gets_colour_only_when_asked(
    case: tuple[list[str], dict[str, str], bool],
    use_spec: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("rich")
    argv, env, coloured = case
    use_spec(RELEASING)
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = run_cli(capsys, "stats", "--watch", "0.5", "--count", "2", *argv)
    assert code == 0, err
    assert ("\x1b[" in out) is coloured
    if coloured:  # frame after frame, as a pipe reads them: no cursor moved back up
        assert out.count("accelplat stats") == 2
        assert "\x1b[1A" not in out
        assert "60.00 GiB / 80.00 GiB" in out
    else:
        assert out.startswith("platform: simulated")


def test_color_and_no_color_exclude_each_other(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(RELEASING)
    code, _, err = run_cli(capsys, "stats", "--color", "--no-color")
    assert code == 2
    assert "not allowed with argument" in err


def snap_at(t: float, used: int) -> UsageSnapshot:
    info = MemoryInfo(free=80 * GIB - used, total=80 * GIB, used=used)
    return UsageSnapshot(timestamp=t, wall_time=0.0, memory={0: info})


def test_progress_draws_one_line_on_a_terminal() -> None:
    stream = FakeTTY()
    progress = Progress(stream, enabled=True, min_interval_s=0.0)
    progress(snap_at(10.0, 60 * GIB), {0: GIB})
    progress(snap_at(11.5, 0), {0: GIB})
    progress.finish()
    text = stream.getvalue()
    assert text.count("\r\x1b[K") == 3
    assert "waiting    0.0 s: 0=60.00 GiB (<= 1.00 GiB wait)" in text
    assert "waiting    1.5 s: 0=0 B (<= 1.00 GiB ok)" in text
    assert "\n" not in text


def test_progress_on_an_8_gpu_host_stays_one_row_at_80_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    stream = FakeTTY()
    progress = Progress(stream, enabled=True, min_interval_s=0.0)
    info = MemoryInfo(free=80 * GIB, total=140 * GIB, used=60 * GIB)
    memory = dict.fromkeys(range(8), info) | {3: MemoryInfo(free=0, total=140 * GIB, used=0)}
    progress(
        UsageSnapshot(timestamp=0.0, wall_time=0.0, memory=memory), dict.fromkeys(range(8), GIB)
    )
    progress.finish()
    (line,) = [part for part in stream.getvalue().split("\r\x1b[K") if part]
    assert line == "waiting    0.0 s: 1 of 8 clear; waiting for 0,1,2,4,5,6,7: up to 60.00 GiB"


def test_progress_disabled_writes_nothing() -> None:
    stream = FakeTTY()
    progress = Progress(stream, enabled=False)
    progress(snap_at(0.0, GIB), {0: 0})
    progress.finish()
    assert stream.getvalue() == ""


# ---------------------------------------------------------------------------------------------
# stats


def test_stats_plain_table(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, out, err = run_cli(capsys, "stats")
    assert code == 0, err
    lines = out.splitlines()
    # the virtual clock's wall time, local (the JSON's wall_time)
    assert re.fullmatch(
        r"platform: simulated \(2 device\(s\)\) at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", lines[0]
    )
    assert lines[1].split() == [
        "DEV",
        "NAME",
        "USED",
        "FREE",
        "TOTAL",
        "RESERVED",
        "USE%",
        "SOURCE",
    ]
    assert lines[2].split()[:2] == ["0", "Sim"]
    assert "61.00 GiB" in lines[2]  # 60 GiB timeline + the 1 GiB holder
    assert "19.00 GiB" in lines[2]
    assert "76.2%" in lines[2]
    assert lines[3].split()[0] == "1"
    assert "\x1b[" not in out  # not a terminal: no escape codes


EIGHT_H200 = {
    "clock": "virtual",
    "devices": [
        {
            "name": "NVIDIA H200",
            "count": 8,
            "total": "143156MiB",
            "used": "123.8GiB",
            "reserved": "615MiB",
        }
    ],
}


def test_stats_plain_table_fits_80_columns_with_eight_gpus(
    use_spec: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_spec(EIGHT_H200)
    monkeypatch.delenv("COLUMNS", raising=False)  # a log: 80 columns
    code, out, _ = run_cli(capsys, "stats")
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].endswith("; source simulated")  # one source for all: said once, above
    assert lines[1].split() == ["DEV", "NAME", "USED", "FREE", "TOTAL", "RESERVED", "USE%"]
    assert [line.split()[:3] for line in lines[2:]] == [
        [str(i), "NVIDIA", "H200"] for i in range(8)
    ]
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(capsys, "stats")
    assert out.splitlines()[1].split()[-1] == "SOURCE"  # room enough: the source in each row


def test_stats_watch_without_a_value_refreshes_every_second(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_parser().parse_args(["stats", "--watch"]).watch == 1.0  # gpustat's -i
    use_spec(RELEASING)
    code, out, _ = run_cli(capsys, "stats", "--json", "--watch", "--count", "3")
    assert code == 0
    assert [json.loads(line)["timestamp"] for line in out.splitlines()] == [0.0, 1.0, 2.0]


def test_stats_json_and_devices(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, out, _ = run_cli(capsys, "stats", "--json", "--devices", "0", "--holders")
    assert code == 0
    doc = json.loads(out)
    assert doc["platform"] == "simulated"
    (dev,) = doc["devices"]
    assert dev["index"] == 0
    assert dev["name"] == "Sim A"
    assert dev["used"] == 61 * GIB
    assert dev["free"] == 19 * GIB
    assert dev["total"] == 80 * GIB
    assert dev["source"] == "simulated"
    assert "uuid" in dev
    (holder,) = dev["holders"]
    assert {k: holder.pop(k) for k in ("user", "command", "argv")}.keys() == {
        "user",
        "command",
        "argv",
    }
    assert holder == {"pid": 4242, "used_bytes": GIB, "state": "alive", "name": "engine"}


def test_stats_holders_name_user_and_command_line(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real process holds the simulated memory: its user and command line are shown."""
    marker = "accelplat-holder-marker"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", marker], stdin=subprocess.PIPE
    )
    try:
        holder = {"used": "1GiB", "pid": child.pid, "name": "engine"}
        use_spec({"clock": "virtual", "devices": [{"total": "80GiB", "holders": [holder]}]})
        code, out, _ = run_cli(capsys, "stats", "--json", "--holders")
        assert code == 0
        (shown,) = json.loads(out)["devices"][0]["holders"]
        code, plain, _ = run_cli(capsys, "stats", "--holders")
        assert code == 0
    finally:
        child.communicate(b"")
    assert shown["user"] == getpass.getuser()
    assert shown["argv"][1:] == ["-c", "import sys; sys.stdin.read()", marker]
    assert shown["command"] == " ".join(shown["argv"])  # whole, the interpreter's path too
    line = next(line for line in plain.splitlines() if f"pid {child.pid}" in line)
    program = os.path.basename(shown["argv"][0])  # the program's base name, then its arguments
    assert line.endswith(
        f", user {getpass.getuser()}: {program} -c import sys; sys.stdin.read() {marker}"
    )


def test_a_holders_argv_from_proc_is_bounded_and_printable() -> None:
    from accelplat._vendor.procs import MAX_ARG_CHARS, MAX_ARGS, process_details

    args = ["x\x1b[2J" + "a" * 5000, *(f"arg{i}" for i in range(MAX_ARGS + 10))]
    code = "import sys; print(flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()  # running: its command line is set (it is empty mid-exec)
        user, argv = process_details(child.pid)
    finally:
        child.communicate(b"")
    assert user == getpass.getuser()
    assert len(argv) == MAX_ARGS + 1
    assert argv[-1] == "…"
    assert argv[3] == ("x?[2J" + "a" * 5000)[: MAX_ARG_CHARS - 1] + "…"
    assert all(a.isprintable() for a in argv)


def test_stats_watch_json_follows_timeline(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(RELEASING)
    code, out, _ = run_cli(capsys, "stats", "--json", "--watch", "0.5", "--count", "3")
    assert code == 0
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["timestamp"] for d in docs] == [0.0, 0.5, 1.0]
    assert [d["devices"][0]["used"] for d in docs] == [61 * GIB, 60 * GIB, 1 * GIB]


def test_stats_watch_plain_prints_each_refresh(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(RELEASING)
    code, out, _ = run_cli(capsys, "stats", "--watch", "1", "--count", "2")
    assert code == 0
    assert out.count("platform: simulated") == 2
    assert "61.00 GiB" in out
    assert "1.00 GiB" in out


def test_stats_holders_plain(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, out, _ = run_cli(capsys, "stats", "--holders")
    assert code == 0
    assert "device 0: pid 4242 engine (alive) 1.00 GiB" in out
    assert "device 1: holders unknown" in out


def test_stats_rich_table(
    use_spec: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rich")
    use_spec(RELEASING)
    monkeypatch.setattr(stats_cli, "use_rich", lambda stream, **_: True)
    monkeypatch.setenv("COLUMNS", "160")
    code, out, _ = run_cli(capsys, "stats", "--watch", "0.5", "--count", "2")
    assert code == 0
    assert "platform simulated · 2 device(s) · every 0.5 s" in out
    assert "60.00 GiB / 80.00 GiB" in out  # the second refresh
    assert "DEV  NAME" in out


def test_without_rich_the_live_view_exits_2_and_the_rest_works(
    use_spec: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_spec(RELEASING)
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich` raises ImportError
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr(sys, "stdout", FakeTTY())
    code = main(["stats", "--watch", "0.5", "--count", "2"])
    assert code == 2
    assert "the live view needs rich: pip install 'accelplat[cli]'" in capsys.readouterr().err
    assert main(["stats"]) == 0  # a single table on a terminal: plain text
    assert sys.stdout.getvalue().startswith("platform: simulated")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert main(["stats", "--watch", "0.5", "--count", "2"]) == 0  # not a terminal: plain
    assert main(["info"]) == 0


def test_stats_bad_input(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, _, err = run_cli(capsys, "stats", "--devices", "7")
    assert code == 2
    assert "device 7" in err
    code, _, err = run_cli(capsys, "stats", "--count", "3")
    assert code == 2
    assert "--count needs --watch" in err
    code, _, err = run_cli(capsys, "stats", "--watch", "0")
    assert code == 2
    code, _, err = run_cli(capsys, "stats", "--devices", "x")
    assert code == 2


# ---------------------------------------------------------------------------------------------
# wait


def test_wait_clear_exit_0(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, out, err = run_cli(capsys, "wait", "--threshold-bytes", "2GiB", "--timeout", "10")
    assert code == 0, err
    assert out == ""
    assert "clear after 1." in err
    assert "0=1.00/80.00 GiB" in err


def test_wait_already_clear(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, _, err = run_cli(capsys, "wait", "--threshold-ratio", "0.1", "--devices", "1")
    assert code == 0
    assert "already clear" in err


def test_wait_json(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(RELEASING)
    code, out, _ = run_cli(
        capsys, "wait", "--threshold-ratio", "0.05", "--stable", "0.5", "--json", "--quiet"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["status"] == "clear"
    assert 1.5 <= doc["waited_s"] <= 1.6
    assert [(d["index"], d["target"], d["cleared"]) for d in doc["devices"]] == [
        (0, 4 * GIB, True),
        (1, 4 * GIB, True),
    ]
    assert doc["devices"][0]["used"] == GIB
    assert doc["already_settled"] is False


def test_wait_timeout_exit_1_names_holders(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(STUCK)
    code, out, err = run_cli(capsys, "wait", "--threshold-bytes", "1GiB", "--timeout", "3")
    assert code == 1
    assert out == ""
    assert "did not clear within 3.00 s" in err
    assert "pid 31337 'leaky-worker' (alive) 8.00 GiB" in err
    assert "first 68.00, min 8.00, max 68.00, last 8.00 GiB" in err


def test_wait_timeout_json(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(STUCK)
    code, out, _ = run_cli(capsys, "wait", "--threshold-bytes", "1GiB", "--timeout", "1", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["status"] == "timeout"
    assert doc["waited_s"] == pytest.approx(1.0)
    assert doc["devices"][0]["holders"][0]["pid"] == 31337
    assert doc["devices"][0]["cleared"] is False
    assert "leaky-worker" in doc["error"]


def test_wait_timeout_defaults_to_platform_profile(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(STUCK)
    code, _, err = run_cli(capsys, "wait", "--threshold-bytes", "1GiB", "-q")
    assert code == 1
    assert "timeout_s=30" in err


def test_wait_settle_on_lazy_platform(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(LAZY)
    code, out, err = run_cli(capsys, "wait", "--settle", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(d["index"], d["target"]) for d in doc["devices"]] == [(0, 8 * GIB)]
    assert 2.25 <= doc["waited_s"] <= 2.25 + PollPolicy().max_s


def test_wait_stable_and_tolerance(use_spec: Any, capsys: pytest.CaptureFixture[str]) -> None:
    use_spec(LAZY)
    code, out, _ = run_cli(
        capsys,
        "wait",
        "--threshold-bytes",
        "1GiB",
        "--stable",
        "1",
        "--tolerance",
        "64MiB",
        "--json",
    )
    assert code == 0
    assert 1.25 <= json.loads(out)["waited_s"] <= 1.25 + PollPolicy().max_s


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["wait"], "give --threshold-ratio"),
        (["wait", "--threshold-ratio", "1.5"], "fraction"),
        (["wait", "--threshold-ratio", "nan"], "fraction"),
        (["wait", "--threshold-bytes", "4XB"], "size"),
        (["wait", "--threshold-bytes=-4GiB"], "size"),
        (["wait", "--threshold-ratio", "0.1", "--timeout", "-1"], "seconds"),
        (["wait", "--threshold-ratio", "0.1", "--timeout", "inf"], "seconds"),
        (["wait", "--threshold-ratio", "0.1", "--devices", "0,9"], "device 9"),
        (["wait", "--threshold-ratio", "0.1", "--devices", "zero"], "--devices"),
        (["wait", "--settle", "--threshold-bytes", "1GiB"], "--settle takes"),
        (["wait", "--settle", "--stable", "1"], "--settle uses"),
        (["wait", "--threshold-ratio", "0.1", "--force"], "--force only"),
        (["wait", "--pid", "12", "--settle"], "--pid waits for those processes"),
        (["wait", "--pid", "12", "--threshold-ratio", "0.1"], "--pid waits for those processes"),
        (["wait", "--pid", "0"], "a process id"),
    ],
)
def test_wait_bad_input_exit_2(
    use_spec: Any, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    use_spec(RELEASING)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert out == ""


def test_wait_without_usable_platform_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")  # but no spec: not available
    code, _, err = run_cli(capsys, "wait", "--threshold-ratio", "0.1")
    assert code == 1  # a runtime failure, as for stats (2 is for bad usage)
    assert "ACCELPLAT_SIMULATED_SPEC" in err


def test_python_m_accelplat_wait_in_a_shell_script(tmp_path: Path) -> None:
    """The shell-script use: a real ``python -m accelplat wait`` process and its exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["ACCELPLAT_PLATFORM"] = "simulated"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    results = {}
    for name, spec in (("releasing", RELEASING), ("stuck", STUCK)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(spec))
        env["ACCELPLAT_SIMULATED_SPEC"] = str(path)
        results[name] = subprocess.run(
            [
                sys.executable,
                "-m",
                "accelplat",
                "wait",
                "--threshold-bytes",
                "2GiB",
                "--timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    ok, stuck = results["releasing"], results["stuck"]
    assert ok.returncode == 0, ok.stderr
    assert "clear after" in ok.stderr
    assert stuck.returncode == 1
    assert "pid 31337 'leaky-worker'" in stuck.stderr
    assert "Traceback" not in stuck.stderr


@pytest.mark.usefixtures("signals_not_ignored")
def test_ctrl_c_during_a_wait_leaves_a_clean_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"  # real time: the wait runs until interrupted
    spec.write_text(json.dumps({"devices": [{"name": "Sim", "total": "80GiB", "used": "8GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "wait", "--threshold-bytes", "1GiB", "--timeout", "60"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while seen.count(b"waiting") < 2 and time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                seen += os.read(master, 65536)
        assert seen.count(b"waiting") >= 2, seen[-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
        while select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert code == 130
    assert b"Traceback" not in seen
    assert seen.endswith(b"\r\x1b[K"), seen[-200:]  # the progress line erased: the prompt is clean


SHARED = {
    "clock": "virtual",
    "release": {"lazy": False, "settle_timeout_s": 30.0},
    "devices": [
        {
            "total": "80GiB",
            "holders": [
                {"used": "8GiB", "pid": 4242, "name": "engine", "end": 0.5},
                {"used": "2GiB", "pid": 31337, "name": "leaky-worker"},
            ],
        }
    ],
}


def test_wait_for_a_pid_to_release_its_memory(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(SHARED)  # pid 4242 holds 8 GiB until 0.5 s
    code, out, err = run_cli(capsys, "wait", "--pid", "4242", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert 0.5 <= doc["waited_s"] <= 0.55
    assert [h["pid"] for h in doc["devices"][0]["holders"]] == [31337]
    # cleared is the wait's verdict on the processes, not the device's usage (2 GiB still used)
    assert doc["devices"][0]["cleared"] is True
    assert doc["devices"][0]["target"] is None


def test_wait_for_a_pid_json_on_timeout_names_the_device_not_cleared(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(SHARED)
    code, out, _ = run_cli(capsys, "wait", "--pid", "31337", "--timeout", "1", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["status"] == "timeout"
    assert [(d["cleared"], d["target"]) for d in doc["devices"]] == [(False, None)]


def test_wait_for_a_pid_that_keeps_its_memory_times_out_naming_it(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(SHARED)
    code, _, err = run_cli(capsys, "wait", "--pid", "31337", "--timeout", "2")
    assert code == 1
    assert "processes 31337 did not release device memory within 2.00 s" in err
    assert "pid 31337 'leaky-worker'" in err


def test_wait_settle_judges_whole_devices_from_a_script(
    use_spec: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    use_spec(STUCK)  # a stuck 8 GiB holder that is not this command's child
    code, _, err = run_cli(
        capsys, "wait", "--settle", "--threshold-ratio", "0.05", "--timeout", "2"
    )
    assert code == 1
    assert "leaky-worker" in err
