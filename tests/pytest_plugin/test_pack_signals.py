"""Cancelling a packed session ends the test body holding its share, whatever the signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelplat._backends.simulated import ENV_SPEC, ENV_VISIBLE
from accelplat._leasing import ENV_LEASE_DIR, lease_status

ROOT = Path(__file__).resolve().parents[2]

BODY = textwrap.dedent(
    """
    import os, time
    import pytest

    @pytest.mark.accelplat_requires(device_memory="12GiB")
    def test_holds_its_share():
        with open(os.environ["BODY_PID"], "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(120)
    """
)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return True  # ended; its new parent has not reaped it yet
        time.sleep(0.05)
    return False


@pytest.mark.usefixtures("signals_not_ignored")
@pytest.mark.parametrize(
    ("how", "workers"),
    [
        ("SIGTERM", "0"),
        ("SIGHUP", "0"),
        ("SIGKILL", "0"),
        ("SIGTERM to its group", "0"),
        ("SIGTERM", "1"),
    ],
    ids=["SIGTERM", "SIGHUP", "SIGKILL", "group", "SIGTERM -n 1"],
)
def test_a_cancelled_session_ends_the_body_and_frees_its_share(
    tmp_path: Path, how: str, workers: str
) -> None:
    (tmp_path / "test_body.py").write_text(BODY)
    (tmp_path / "spec.json").write_text(json.dumps({"devices": [{"total": "16GiB"}]}))
    pid_file, locks = tmp_path / "body.pid", tmp_path / "locks"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.pop(ENV_VISIBLE, None)
    env.update(
        {
            "ACCELPLAT_PLATFORM": "simulated",
            ENV_SPEC: str(tmp_path / "spec.json"),
            ENV_LEASE_DIR: str(locks),
            "BODY_PID": str(pid_file),
            "PYTHONPATH": str(ROOT),
        }
    )
    command = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--accelplat-pack", "-n", workers]
    session = subprocess.Popen(
        [sys.executable, *command, "test_body.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a CI job's
    )
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert session.poll() is None, session.communicate()[0]
            assert time.monotonic() < deadline, "the body never started"
            time.sleep(0.05)
        body = int(pid_file.read_text())
        shares = [r.budget_bytes for r in lease_status(locks) if r.held and r.budget_bytes]
        assert shares == [12 * 2**30]
        signum = getattr(signal, how.split(maxsplit=1)[0])
        if how.endswith("group"):
            os.killpg(session.pid, signum)
        else:
            session.send_signal(signum)
        output, _ = session.communicate(timeout=60)
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
            session.wait()
    assert _gone(body, 10), f"the body {body} outlived its session:\n{output}"
    if signum != signal.SIGKILL:
        assert session.returncode == 2, output  # interrupted, as Ctrl-C ends a session
        assert "KeyboardInterrupt" in output
    assert not [r for r in lease_status(locks) if r.held]  # the share is no longer promised
