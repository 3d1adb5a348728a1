"""``accelplat lease``: runs CMD on leased devices, forwards signals, returns CMD's status."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelplat._backends.simulated import ENV_SPEC, ENV_VISIBLE
from accelplat._leasing import ENV_LEASE_DIR, lease_status

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"total": "80GiB"}, {"total": "80GiB"}]}))
    result = dict(os.environ)
    result.update(
        {
            "ACCELPLAT_PLATFORM": "simulated",
            ENV_SPEC: str(spec),
            ENV_LEASE_DIR: str(tmp_path / "locks"),
            "PYTHONPATH": str(ROOT),
        }
    )
    result.pop(ENV_VISIBLE, None)
    return result


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelplat", "lease", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runs_the_command_with_the_leased_devices_and_returns_its_status(
    env: dict[str, str],
) -> None:
    script = f"import os, sys; print(os.environ['{ENV_VISIBLE}']); sys.exit(7)"
    done = cli("-n", "2", "--", sys.executable, "-c", script, env=env)
    assert done.returncode == 7
    assert done.stdout.strip() == "SIM-0,SIM-1"
    assert "accelplat lease: leased 0 (SIM-0), 1 (SIM-1)" in done.stderr


def test_status_shows_the_holder_while_the_command_runs(env: dict[str, str]) -> None:
    inner = [sys.executable, "-m", "accelplat", "lease", "--status", "--json"]
    script = (
        f"import subprocess; print(subprocess.run({inner!r}, capture_output=True, "
        "text=True).stdout)"
    )
    done = cli("--", sys.executable, "-c", script, env=env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (held,) = [d for d in doc["devices"] if d["held"]]
    assert held["state"] == "held"
    assert held["device_id"] == "simulated.SIM-0"
    assert "lease" in held["command"]
    assert held["since"] <= time.time()
    after = cli("--status", env=env)
    assert after.returncode == 0
    assert "simulated.SIM-0  free" in after.stdout


def test_signals_are_forwarded_and_reported_as_128_plus_n(
    env: dict[str, str], tmp_path: Path
) -> None:
    mark = tmp_path / "got-term"
    script = (
        "import signal, sys, time, pathlib\n"
        f"def on(*_): pathlib.Path({str(mark)!r}).write_text('term'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "lease", "--", sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)  # to the lease process only
    assert proc.wait(timeout=30) == 0  # CMD handled it and exited 0
    assert mark.read_text() == "term"
    killed = cli("--", sys.executable, "-c", "import os; os.kill(os.getpid(), 9)", env=env)
    assert killed.returncode == 128 + 9


def test_the_command_keeps_its_devices_if_the_lease_process_dies(
    env: dict[str, str], tmp_path: Path
) -> None:
    script = "import time; print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelplat", "lease", "-q", "--", sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)  # the lease process; CMD lives on holding the lock
    proc.wait(timeout=30)
    try:
        records = {r.device_id: r for r in lease_status(tmp_path / "locks")}
        assert records["simulated.SIM-0"].held
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60  # only reached if the lock is never freed
    while records["simulated.SIM-0"].held and time.monotonic() < deadline:
        time.sleep(0.02)
        records = {r.device_id: r for r in lease_status(tmp_path / "locks")}
    assert not records["simulated.SIM-0"].held  # freed once CMD is gone too


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "3", "--", "true"], "cannot lease 3 device"),
        (["--min-free", "81GiB", "--", "true"], "only 0 of 2"),
        ([], "give the command to run"),
        (["--status", "--", "true"], "--status takes no command"),
    ],
)
def test_bad_input_exits_2_at_once(env: dict[str, str], args: list[str], message: str) -> None:
    done = cli(*args, env=env)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize("args", [["-n", "0", "--", "true"], ["--min-free", "lots", "--", "x"]])
def test_malformed_arguments_are_usage_errors(env: dict[str, str], args: list[str]) -> None:
    done = cli(*args, env=env)
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_a_command_that_cannot_start_exits_127(env: dict[str, str]) -> None:
    done = cli("--", "/nonexistent/program", env=env)
    assert done.returncode == 127
    assert "cannot run" in done.stderr


def test_timeout_exits_1_naming_the_holder(env: dict[str, str]) -> None:
    script = "import time; print('ready', flush=True); time.sleep(60)"
    argv = ["-m", "accelplat", "lease", "-n", "2", "-q", "--", sys.executable, "-c", script]
    holder = subprocess.Popen(
        [sys.executable, *argv],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        done = cli("--timeout", "0.3", "--", "true", env=env)
        assert done.returncode == 1
        assert f"held by pid {holder.pid}" in done.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)


def test_memory_shares_run_side_by_side_on_one_device(env: dict[str, str]) -> None:
    script = (
        "import os, subprocess, sys\n"
        f"print(os.environ['{ENV_VISIBLE}'], os.environ['ACCELPLAT_LEASE_MEMORY_BYTES'])\n"
        "inner = [sys.executable, '-m', 'accelplat', 'lease', '--memory', '40GiB', '-n', '2', '--',"
        f" sys.executable, '-c', 'import os; print(os.environ[\"{ENV_VISIBLE}\"])']\n"
        "nested = subprocess.run(inner, capture_output=True, text=True)\n"
        "print(nested.returncode, 'shows this process only 1' in nested.stderr)\n"
        f"os.environ.pop('{ENV_VISIBLE}')  # another process, outside this grant\n"
        "sys.exit(subprocess.run(inner).returncode)\n"
    )
    done = cli("--memory", "40GiB", "--", sys.executable, "-c", script, env=env)
    assert done.returncode == 0, done.stderr
    outer, nested, inner = done.stdout.split("\n")[:3]
    assert nested == "2 True"  # a lease inside the grant stays inside it
    assert outer == f"SIM-0 {40 * 2**30}"  # the share's budget reaches the command
    assert inner == "SIM-1,SIM-0"  # most room first; 40 GiB left beside the outer share
    assert "(40.00 GiB of each)" in done.stderr
    status = cli("--status", env=env)
    assert "share of 40.00 GiB" in status.stdout
    assert "held" not in status.stdout  # both released
    inner = [sys.executable, "-m", "accelplat", "lease", "--status", "--json"]
    script = (
        f"import subprocess; print(subprocess.run({inner!r}, capture_output=True, "
        "text=True).stdout)"
    )
    held = cli("--memory", "8GiB", "--", sys.executable, "-c", script, env=env)
    rows = json.loads(held.stdout)["devices"]
    assert {
        (r["device_id"], r["state"], r["held"], r["budget_bytes"]) for r in rows if r["held"]
    } == {
        ("simulated.SIM-0", "shared", True, None),  # the device: held, by its shares
        ("simulated.SIM-0", "held", True, 8 * 2**30),
    }
    assert {r["promised_bytes"] for r in rows if r["device_id"] == "simulated.SIM-0"} == {8 * 2**30}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "12", "--", "true"], "--memory"),
        (["--memory", "100KiB", "--", "true"], "memory must be from 1MiB to 8EiB"),
        (["--memory", "9" * 330 + "GiB", "--", "true"], "to 8EiB"),
        (["--memory", "81GiB", "--", "true"], "enough memory in total for memory=81.00 GiB"),
        (["--memory", "8GiB", "--min-free", "1GiB", "--", "true"], "one or the other"),
    ],
)
def test_bad_memory_shares_exit_2_naming_the_option(
    env: dict[str, str], args: list[str], message: str
) -> None:
    done = cli(*args, env=env)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_the_usage_names_every_option_and_the_message_ends_cleanly(env: dict[str, str]) -> None:
    usage = cli("-n", "0", "--", "true", env=env).stderr
    for option in ("--memory", "--min-free-ratio", "--lock-dir", "-q", "--timeout"):
        assert option in usage
    done = cli("--", "true", env={**env, "ACCELPLAT_PLATFORM": "cpu"})
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "leased" in ln]
    assert not line.rstrip().endswith(";")


@pytest.mark.parametrize("args", [["--", "true"], ["--status"], ["--status", "--json"]])
def test_an_empty_lock_dir_is_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from accelplat._cli import main

    assert main(["lease", "--lock-dir", "", *args]) == 2
    assert "must not be empty" in capsys.readouterr().err


def test_the_help_has_argparses_own_usage(env: dict[str, str]) -> None:
    usage = cli("--help", env=env).stdout.split("\n\n")[0]
    assert usage.startswith("usage: accelplat lease [-h] [-n N] [--memory SIZE]")
    assert all(len(line) <= 100 for line in usage.splitlines())
    # the help names the library's default timeout without loading the library for --help
    from accelplat._leasing import DEFAULT_TIMEOUT_S

    assert f"(default {DEFAULT_TIMEOUT_S:g})" in " ".join(cli("--help", env=env).stdout.split())


def _hold_both(env: dict[str, str]) -> subprocess.Popen[str]:
    """Both devices held by another lease until a line is written to its standard input."""
    script = "print('ready', flush=True); input()"
    argv = ["-m", "accelplat", "lease", "-n", "2", "-q", "--", sys.executable, "-c", script]
    holder = subprocess.Popen(
        [sys.executable, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready"
    return holder


def test_a_waiting_lease_says_so_once_in_a_log(env: dict[str, str]) -> None:
    holder = _hold_both(env)
    argv = [sys.executable, "-m", "accelplat", "lease", "--timeout", "60", "--", "true"]
    waiter = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    assert waiter.stderr is not None
    start = waiter.stderr.readline()  # one line when the wait starts
    holder.communicate("\n", timeout=60)
    end = waiter.stderr.read()  # and one when it ends
    assert waiter.wait(timeout=60) == 0
    assert start.startswith("accelplat lease: waiting for 1 device(s): fewer than 1 of 2")
    assert f"held by pid {holder.pid} (" in start  # who, as whom, since when, running what
    assert "since 2" in start
    assert end.startswith("accelplat lease: leased 0 (SIM-0) after ")
    assert end.count("\n") == 1


def test_a_waiting_lease_redraws_one_line_on_a_terminal(env: dict[str, str]) -> None:
    import fcntl
    import pty
    import struct
    import termios

    holder = _hold_both(env)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))  # 60 columns
    shown = b""
    try:
        argv = [sys.executable, "-m", "accelplat", "lease", "--timeout", "60", "--", "true"]
        waiter = subprocess.Popen(argv, env=env, stderr=slave, stdout=subprocess.DEVNULL)
        os.close(slave)
        while shown.count(b"accelplat lease: waiting") < 3:  # drawn again and again
            shown += os.read(master, 65536)
        holder.communicate("\n", timeout=60)
        assert waiter.wait(timeout=60) == 0
        with contextlib.suppress(OSError):  # EIO once the terminal's last writer is gone
            while chunk := os.read(master, 65536):
                shown += chunk
    finally:
        os.close(master)
    text = shown.decode()
    parts = text.replace("\x1b[K", "").split("\r")  # each redraw: \r, erase the line, the text
    drawn = [part for part in parts if part.startswith("accelplat lease: waiting")]
    assert drawn
    assert all(len(part) < 60 for part in drawn)  # fit to the width
    assert "\r\x1b[Kaccelplat lease: leased" in text  # the waiting line cleared
