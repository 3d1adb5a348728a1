"""The live view of ``accelplat stats``: frames, colour, keys and a real terminal."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import types
from pathlib import Path
from typing import Any

import pytest

from accelplat._cli import stats as stats_cli
from accelplat._cli.stats import BAR_WIDTH, ViewState, bar, colour_for, listen, render
from accelplat._types import GIB, HolderState, MemoryHolder, MemoryInfo, UsageSnapshot

pytest.importorskip("rich")

REPO = Path(__file__).resolve().parents[2]


def _snap() -> UsageSnapshot:
    return UsageSnapshot(
        timestamp=0.0,
        wall_time=0.0,
        memory={
            0: MemoryInfo(free=16 * GIB, total=80 * GIB, used=64 * GIB, source="nvml-v2"),
            1: MemoryInfo(free=80 * GIB, total=80 * GIB, used=0, source="nvml-v2"),
        },
        holders={0: (MemoryHolder(4242, 63 * GIB, HolderState.ALIVE, "python"),), 1: ()},
    )


def _text(renderable: object, *, colour: bool) -> str:
    from rich.console import Console

    out = io.StringIO()
    console = Console(
        file=out,
        width=160,
        force_terminal=True,
        color_system="standard" if colour else None,
        no_color=not colour,
    )
    console.print(renderable)
    return out.getvalue()


def _details(pid: int) -> tuple[str, tuple[str, ...]]:
    argv = ("/usr/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "x")
    return ("alice", argv) if pid else ("", ())


def test_bar_is_proportional_and_never_hides_usage() -> None:
    assert bar(0.0) == "░" * BAR_WIDTH
    assert bar(1.0) == "█" * BAR_WIDTH
    assert bar(0.5).count("█") == BAR_WIDTH // 2
    assert bar(0.001).count("█") == 1  # a little is still visible
    assert bar(0.999).count("░") == 1  # almost full is not full
    assert len(bar(7.0)) == len(bar(-1.0)) == BAR_WIDTH
    assert [colour_for(r) for r in (0.1, 0.5, 0.79, 0.8, 1.0)] == [
        "green",
        "yellow",
        "yellow",
        "red",
        "red",
    ]


def test_frame_has_header_bars_and_holders_on_demand() -> None:
    snap = _snap()
    kwargs = {"interval": 2.0, "details": _details, "host": "gpu-box"}
    plain = _text(
        render("cuda", snap, {0: "H200", 1: "H200"}, state=ViewState(), **kwargs), colour=False
    )
    header = plain.splitlines()[0]
    assert "host gpu-box" in header
    assert "platform cuda · 2 device(s) · every 2 s" in header
    assert "[h] holders" in header
    rows = [line for line in plain.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert len(rows) == 2
    assert "█" * 24 + "░" * 6 in rows[0]  # 80 % of 30 cells
    assert "64.00 GiB / 80.00 GiB" in rows[0]
    assert "80.0%" in rows[0]
    assert "alice" not in plain  # holders hidden until asked for
    shown = _text(
        render("cuda", snap, {0: "H200"}, state=ViewState(holders=True), **kwargs), colour=False
    )
    holder = next(line for line in shown.splitlines() if "4242" in line)
    assert "alice" in holder
    assert "python -m vllm.entrypoints" in holder
    assert "63.00 GiB" in holder
    assert "alive" in holder
    assert "(no process holds memory)" in shown


def test_colour_only_when_the_console_has_it() -> None:
    frame = render("cuda", _snap(), {}, state=ViewState(), interval=None, details=_details)
    coloured = _text(frame, colour=True)
    assert "\x1b[31m" in coloured  # the 80 % device is red
    bare = _text(frame, colour=False)
    assert "\x1b[31m" not in bare
    assert "\x1b[32m" not in bare
    assert "[h] holders" not in bare  # a single frame has no keys


def test_keys_toggle_holders_and_quit_on_a_real_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[tuple[float | None, bool]] = []  # each select(): its timeout, and whether ready
    real_select = select.select

    def counting_select(r: Any, w: Any, x: Any, timeout: float | None = None) -> Any:
        # never block for the view's whole interval: a wait that misses its key fails, not hangs
        ready = real_select(r, w, x, 30.0 if timeout is None else min(timeout, 30.0))
        waits.append((timeout, bool(ready[0])))
        return ready

    monkeypatch.setattr(stats_cli, "select", types.SimpleNamespace(select=counting_select))
    master, slave = pty.openpty()
    try:
        before = termios.tcgetattr(slave)
        state = ViewState()
        with os.fdopen(os.dup(slave), "r") as stream, contextlib.ExitStack() as stack:
            wait = listen(stack, stream)
            assert not termios.tcgetattr(slave)[3] & termios.ICANON  # cbreak while viewing
            os.write(master, b"h")
            wait(600.0, state)
            assert state.holders
            # a key redraws at once: one select() that found the key, no wait for the timeout
            assert len(waits) == 1
            assert waits[0][1]
            os.write(master, b"xq")
            wait(600.0, state)
            assert state.quit
            assert all(ready for _, ready in waits)  # every select() returned on a key
        assert termios.tcgetattr(slave) == before  # the terminal is given back as it was
    finally:
        os.close(master)
        os.close(slave)


def test_keys_without_a_terminal_only_sleep() -> None:
    slept: list[float] = []
    state = ViewState()
    with contextlib.ExitStack() as stack:
        listen(stack, io.StringIO("hq"), sleep=slept.append)(0.25, state)
    assert slept == [0.25]
    assert state == ViewState()


@pytest.mark.usefixtures("signals_not_ignored")
def test_ctrl_c_ends_the_live_view_cleanly(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"name": "Sim", "total": "80GiB", "used": "1GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "NO_COLOR"))}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        TERM="xterm-256color",
        COLUMNS="140",
        PYTHONPATH=str(REPO),
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "stats", "--watch", "0.2"],
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
        while seen.count(b"platform simulated") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                seen += os.read(master, 65536)
        assert seen.count(b"platform simulated") >= 2, seen[-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
        while True:  # drain what it wrote on the way out
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                break
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
    assert code == 0
    assert b"Traceback" not in seen
    assert b"KeyboardInterrupt" not in seen
    assert b"\x1b[?25h" in seen  # the cursor is shown again


@pytest.mark.usefixtures("signals_not_ignored")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminating_signal_gives_the_terminal_back(tmp_path: Path, signum: int) -> None:
    """``timeout 10 accelplat stats --watch 1`` sends SIGTERM: echo and the cursor come back."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"name": "Sim", "total": "80GiB", "used": "1GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "NO_COLOR"))}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        TERM="xterm-256color",
        COLUMNS="140",
        PYTHONPATH=str(REPO),
    )
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "stats", "--watch", "0.2"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    seen = b""
    try:
        while seen.count(b"platform simulated") < 2:  # two frames: the view is up, in cbreak
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, seen[-2000:]
            seen += os.read(master, 65536)
        assert not termios.tcgetattr(slave)[3] & termios.ECHO
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
        while select.select([master], [], [], 0)[0]:  # what it wrote on the way out
            seen += os.read(master, 65536)
        after = termios.tcgetattr(slave)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(slave)
        os.close(master)
    assert code == 128 + signum
    assert after == before  # echo and line mode are back
    assert b"\x1b[?25h" in seen  # the cursor is shown again
    assert b"Traceback" not in seen


def _h200s(n: int = 8) -> UsageSnapshot:
    total, used = 150_754_820_096, 132_932_337_664  # an H200 as NVML reports it; 88 % used
    info = MemoryInfo(free=total - used, total=total, used=used, source="nvml-v2")
    held = {0: (MemoryHolder(4242, 63 * GIB, HolderState.ALIVE, "python"),)}
    memory = dict.fromkeys(range(n), info)
    return UsageSnapshot(timestamp=0.0, wall_time=0.0, memory=memory, holders=held)


def _at(width: int, frame: object) -> list[str]:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(frame)
    return out.getvalue().splitlines()


def _frame(snap: UsageSnapshot, *, holders: bool = False) -> object:
    names = dict.fromkeys(snap.memory, "NVIDIA H200")
    state = ViewState(holders=holders)
    return render("cuda", snap, names, state=state, interval=2.0, details=_details)


def test_at_80_columns_index_and_figures_stay_whole() -> None:
    """The standard 80×24 terminal: eight H200s, each row whole; the bar gave way, not figures."""
    lines = _at(80, _frame(_h200s(), holders=True))
    assert max(len(line) for line in lines) <= 80
    assert len(lines) <= 24
    rows = [line for line in lines if "NVIDIA H200" in line]
    assert len(rows) == 8
    for index, row in enumerate(rows):
        cells = row.split()
        assert cells[0] == str(index)
        assert "123.80 GiB / 140.40 GiB" in row
        assert row.endswith("88.2%  16.60 GiB")  # USE% and FREE last: SOURCE gave way
        assert "…" not in row
        assert row.count("█") + row.count("░") == 19
    heading = next(line for line in lines if line.startswith("DEV  NAME"))
    assert heading.split() == ["DEV", "NAME", "MEMORY", "USED", "/", "TOTAL", "USE%", "FREE"]
    assert "source nvml-v2" in "\n".join(lines[:3])  # one source for all: the header says it
    holder = next(line for line in lines if "4242" in line)
    assert holder.split()[:3] == ["0", "4242", "alice"]
    assert holder.endswith("63.00 GiB  alive")  # the command line is what is cut


@pytest.mark.parametrize(
    ("width", "bar_cells", "source"),
    [
        (200, BAR_WIDTH, True),
        (100, BAR_WIDTH, True),
        (90, 20, True),
        (85, 24, False),
        (80, 19, False),
    ],
)
def test_the_bar_shrinks_before_the_source_goes(width: int, bar_cells: int, source: bool) -> None:
    lines = _at(width, _frame(_h200s(2)))
    row = next(line for line in lines if line.startswith("  0"))
    assert row.count("█") + row.count("░") == bar_cells
    assert row.endswith("nvml-v2") is source
    assert "NVIDIA H200" in row


def test_below_the_figures_width_the_bar_and_name_go_first() -> None:
    lines = _at(60, _frame(_h200s(2)))
    row = next(line for line in lines if line.startswith("  0"))
    assert "█" not in row
    assert row.split()[:2] == ["0", "NVIDIA"]
    assert "123.80 GiB / 140.40 GiB" in row
    assert row.endswith("88.2%  16.60 GiB")
    assert max(len(line) for line in lines) <= 60  # the header broke between its parts


def test_a_resize_ends_the_wait_so_the_view_redraws(monkeypatch: pytest.MonkeyPatch) -> None:
    master, slave = pty.openpty()
    try:
        state = ViewState()
        with os.fdopen(os.dup(slave), "r") as stream, contextlib.ExitStack() as stack:
            wait = listen(stack, stream)
            waited: list[float] = []
            real_select = select.select

            def select_once(r: Any, w: Any, x: Any, timeout: float) -> Any:
                waited.append(timeout)
                return real_select(r, w, x, 0)  # never block: the signal has been delivered

            monkeypatch.setattr(stats_cli, "select", types.SimpleNamespace(select=select_once))
            os.kill(os.getpid(), signal.SIGWINCH)  # the handler runs before the next line
            wait(600.0, state)
            assert len(waited) == 1  # woken at once, not after 600 s
        assert state == ViewState()  # a resize is no key
        assert signal.getsignal(signal.SIGWINCH) in (signal.SIG_DFL, None)  # handler given back
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.usefixtures("signals_not_ignored")
def test_the_live_view_redraws_whole_at_a_new_size(tmp_path: Path) -> None:
    """80×24, then 160×40: the frame is drawn again at once, at the new width, from the top."""
    spec = tmp_path / "spec.json"
    devices = [{"name": "NVIDIA H200", "total": "140.4GiB", "used": "123.8GiB"}] * 2
    spec.write_text(json.dumps({"devices": devices}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "NO_COLOR"))}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        TERM="xterm-256color",
        PYTHONPATH=str(REPO),
    )
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "stats", "--watch", "600"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    seen = b""

    def read_until(needle: bytes) -> None:
        nonlocal seen
        while needle not in seen:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, seen[-2000:]
            seen += os.read(master, 65536)

    try:
        read_until(b"USED / TOTAL")
        read_until(b"16.60 GiB")
        narrow = seen
        assert b"\x1b[?1049h" in narrow  # the alternate screen: every frame starts at the top
        assert b"SOURCE" not in narrow
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        proc.send_signal(signal.SIGWINCH)
        read_until(b"SOURCE")  # the wide layout, long before the 600 s refresh
        wide = seen[len(narrow) :]
        assert b"\x1b[H" in wide  # drawn from the top-left corner
        os.write(master, b"q")
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(slave)
        os.close(master)
    assert code == 0


def test_the_key_help_is_shown_on_question_mark() -> None:
    master, slave = pty.openpty()
    try:
        state = ViewState()
        with os.fdopen(os.dup(slave), "r") as stream, contextlib.ExitStack() as stack:
            os.write(master, b"?")
            listen(stack, stream)(30.0, state)
        assert state == ViewState(keys=True)
    finally:
        os.close(master)
        os.close(slave)
    shown = _at(80, render("cuda", _snap(), {}, state=state, interval=1.0, details=_details))
    assert "[?] keys" in shown[0] + shown[1]
    assert any(line.strip().startswith("h  show or hide the processes") for line in shown)
    assert any(line.strip().startswith("q  quit") for line in shown)


def _view(tmp_path: Path, rows: int, columns: int, typed: bytes = b"") -> tuple[int, bytes]:
    """Run ``stats --watch 600`` on a pty of ``rows``×``columns``; ``q`` ends it (60 s at most).

    ``typed`` is written to the terminal before the command starts, as a user typing ahead.
    """
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"name": "Sim", "total": "80GiB", "used": "1GiB"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "NO_COLOR"))}
    for name in ("COLUMNS", "LINES"):
        env.pop(name, None)
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        TERM="xterm-256color",
        PYTHONPATH=str(REPO),
    )
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    os.write(master, typed)
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "stats", "--watch", "600"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                with contextlib.suppress(OSError):
                    seen += os.read(master, 1 << 16)
            if not typed and b"platform simulated" in seen:
                os.write(master, b"q")
                typed = b"q"
        code = proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(slave)
        os.close(master)
    return code, seen


@pytest.mark.usefixtures("signals_not_ignored")
def test_a_huge_terminal_draws_a_capped_area_and_q_works(tmp_path: Path) -> None:
    code, seen = _view(tmp_path, 65535, 65535)
    assert code == 0
    assert b"platform simulated" in seen
    assert len(seen) < 1 << 20  # the padding of at most 500×200 cells a frame, not 65535²


@pytest.mark.usefixtures("signals_not_ignored")
def test_a_q_typed_before_the_view_starts_ends_it(tmp_path: Path) -> None:
    code, _ = _view(tmp_path, 24, 80, typed=b"q")
    assert code == 0  # within 60 s, not after the 600 s refresh
