"""A recording is never lost to a signal, and the recorded command is never orphaned.

Real processes and real signals: ``python -m accelplat record`` (and a pytest session recording
its timeline) is started on a simulated platform, signalled, and must save a trace marked
partial, forward the signal, reap its command and exit with ``128 + N``. Classes: a signal while
the command runs (SIGTERM, SIGHUP, SIGINT, SIGQUIT), a command that ignores it (escalation), a
second Ctrl-C, a signal after the command finished, and a pytest session ended by SIGTERM/SIGHUP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from accelplat._cli.timeline import _Signals

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals"),
    # the children signalled here must not inherit an ignored SIGINT (background job) or
    # SIGHUP (nohup) from whatever started the suite
    pytest.mark.usefixtures("signals_not_ignored"),
]

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys, time
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT would dump one
    pidfile, ignore, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    for name in filter(None, ignore.split(",")):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    with open(pidfile + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(seconds)
    """
)


def _env(tmp_path: Path, timeline: list[dict[str, Any]] | None = None) -> dict[str, str]:
    spec = tmp_path / "spec.json"
    device: dict[str, Any] = {"name": "Sim", "total": "8GiB"}
    if timeline:
        device["timeline"] = timeline
    spec.write_text(json.dumps({"devices": [device]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(spec),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _wait_for(path: Path, timeout: float = 60.0) -> int:
    """Wait for ``path`` (written whole by a rename, so it is never read half-written)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return int(path.read_text())


def _wait_until(what: str, done: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _record(
    tmp_path: Path,
    *,
    ignore: str = "",
    seconds: float = 60.0,
    extra: tuple[str, ...] = (),
    timeline: list[dict[str, Any]] | None = None,
) -> tuple[subprocess.Popen[str], int, Path]:
    (tmp_path / "child.py").write_text(CHILD)
    pidfile = tmp_path / "child.pid"
    trace = tmp_path / "trace.json"
    cmd = [sys.executable, "-m", "accelplat", "record", "--out", str(trace), "--hz", "50"]
    cmd += [*extra, "--", sys.executable, str(tmp_path / "child.py"), str(pidfile), ignore]
    cmd += [str(seconds)]
    proc = subprocess.Popen(
        cmd,
        env=_env(tmp_path, timeline),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # no terminal: as under CI
        cwd=tmp_path,
    )
    return proc, _wait_for(pidfile), trace


def _finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"accelplat record did not exit: {err}")
    return proc.returncode, err


def _partial(trace: Path, word: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(trace.read_text())
    assert doc["partial"] is True
    assert any(word in note for note in doc["notes"]), doc["notes"]
    return doc


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT"])
def test_a_signal_while_the_command_runs_is_forwarded_and_the_trace_kept(
    tmp_path: Path, sig: str
) -> None:
    signum = getattr(signal, sig)
    proc, child, trace = _record(tmp_path)
    time.sleep(0.3)
    proc.send_signal(signum)
    code, err = _finish(proc)
    assert code == 128 + signum, err
    assert f"{os.sep}accelplat{os.sep}" not in err  # no traceback of ours (the child may print one)
    doc = _partial(trace, sig)
    assert doc["exit_code"] == 128 + signum  # the command died of the forwarded signal
    assert _gone(child)


def test_a_command_that_ignores_the_signal_is_terminated_then_killed(tmp_path: Path) -> None:
    proc, child, trace = _record(tmp_path, ignore="SIGTERM", extra=("--kill-after", "0.5"))
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    assert code == 128 + signal.SIGTERM, err
    doc = _partial(trace, "SIGTERM")
    assert doc["exit_code"] == 128 + signal.SIGKILL
    assert _gone(child)


def test_a_second_ctrl_c_kills_the_command_at_once(tmp_path: Path) -> None:
    proc, child, trace = _record(tmp_path, ignore="SIGINT", extra=("--kill-after", "600"))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting for the command
    proc.send_signal(signal.SIGINT)
    code, err = _finish(proc)  # within a minute, where the grace period is ten minutes
    assert code == 130, err
    # SIGKILL at once: the escalation after the grace period would have sent SIGTERM first,
    # which this command does not ignore
    assert _partial(trace, "SIGINT")["exit_code"] == 128 + signal.SIGKILL
    assert _gone(child)


def test_a_signal_after_the_command_finished_cuts_the_grace_period_short(
    tmp_path: Path,
) -> None:
    # Memory rises while the command runs and stays held, so recording lingers for the grace.
    # The simulated clock starts with the platform, before the recorder's first reading: the
    # rise comes late enough for a loaded machine to have read "before" (over a second on a
    # busy two-core host).
    proc, child, trace = _record(
        tmp_path,
        seconds=2.5,
        extra=("--leak-grace", "600"),
        timeline=[{"at": 2.0, "used": "4GiB"}],
    )
    _wait_until("the command to end and be reaped", lambda: _gone(child))
    assert proc.poll() is None  # the recorder lingers
    proc.send_signal(signal.SIGINT)
    code, err = _finish(proc, timeout=30)
    assert code == 130, err
    doc = _partial(trace, "after the command finished")
    assert doc["exit_code"] == 0
    assert _gone(child)


PYTEST_FILE = """
import os, time
def test_slow():
    with open(os.environ["MARKER"] + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(os.environ["MARKER"] + ".tmp", os.environ["MARKER"])  # never seen half-written
    time.sleep(120)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_pytest_session_ended_by_a_signal_keeps_its_timeline(tmp_path: Path, sig: str) -> None:
    signum = getattr(signal, sig)
    (tmp_path / "test_slow.py").write_text(PYTEST_FILE)
    marker = tmp_path / "marker"
    env = _env(tmp_path)
    env["MARKER"] = str(marker)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-p",
            "no:xdist",  # neither is needed here: starting without them takes a second less
            "-p",
            "no:hypothesispytest",
            f"--accelplat-timeline={tmp_path / 'report.html'}",
            f"--accelplat-timeline-json={tmp_path / 'trace.json'}",
            str(tmp_path / "test_slow.py"),
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _wait_for(marker)
    proc.send_signal(signum)
    code, out = _finish(proc)
    assert code != 0, out
    doc = _partial(tmp_path / "trace.json", sig)
    assert [t["nodeid"] for t in doc["tests"]] == ["test_slow.py::test_slow"]
    assert (tmp_path / "report.html").stat().st_size > 1000


# -- the handler's bookkeeping, with a real child and the handler called as the signal would ----


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT"])
def test_a_signal_while_the_command_is_starting_is_forwarded_once_it_has_started(
    sig: str,
) -> None:
    """Caught after the command was spawned but before the recorder knew it: not lost."""
    signum = getattr(signal, sig)
    signals = _Signals(kill_after=600)
    signals._handle(signum, None)  # no command known yet: nothing to forward to
    child = _sleeper()
    try:
        signals.attach(child)
        assert child.wait(timeout=60) == -signum  # forwarded exactly as it came
    finally:
        child.kill()
        child.wait()
    assert signals.during
    assert signals.received == [signum]


def test_a_signal_after_the_command_was_reaped_counts_as_after() -> None:
    signals = _Signals(kill_after=600)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    signals.attach(child)
    assert child.wait(timeout=60) == 0
    signals.child_done = True
    signals._handle(signal.SIGTERM, None)
    assert not signals.during
    assert signals.received == [signal.SIGTERM]


def test_a_second_ctrl_c_while_the_command_is_starting_kills_it() -> None:
    signals = _Signals(kill_after=600)
    signals._handle(signal.SIGINT, None)
    signals._handle(signal.SIGINT, None)
    child = _sleeper()
    try:
        signals.attach(child)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
