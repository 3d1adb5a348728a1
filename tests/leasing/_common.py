"""What the lease tests share: simulated hosts, a child's environment, a second user."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends.simulated import ENV_SPEC, ENV_VISIBLE, SimulatedPlatform
from accelplat._leasing import ENV_LEASE_DIR

ROOT = Path(__file__).resolve().parents[2]

THREE = {
    "devices": [
        {"total": "80GiB", "used": "30GiB"},
        {"total": "80GiB", "used": "10GiB"},
        {"total": "40GiB", "used": "20GiB"},
    ]
}
TWO = {"devices": [{"total": "80GiB"}, {"total": "80GiB"}]}

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as other users")


def sim(spec: dict[str, Any] = THREE, clock: Any = None) -> SimulatedPlatform:
    return SimulatedPlatform(spec, clock=clock)


def child_env(tmp_path: Path, spec: dict[str, Any] = TWO) -> dict[str, str]:
    """The environment of a child leasing on ``spec`` (written once) in ``tmp_path/locks``."""
    path = tmp_path / "spec.json"
    if not path.exists():
        path.write_text(json.dumps(spec))
    env = {**os.environ, "ACCELPLAT_PLATFORM": "simulated", ENV_SPEC: str(path)}
    env.update({ENV_LEASE_DIR: str(tmp_path / "locks"), "PYTHONPATH": str(ROOT)})
    env.pop(ENV_VISIBLE, None)
    return env


@contextmanager
def shared_dir(spec: dict[str, Any]) -> Iterator[tuple[Path, Path]]:
    """A 1777 lock directory in /tmp (readable by every user) and a spec file in it."""
    shared = Path(tempfile.mkdtemp(prefix="accelplat-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        path = shared / "spec.json"
        path.write_text(json.dumps(spec))
        path.chmod(0o644)
        yield shared, path
    finally:
        shutil.rmtree(shared)


def fork_as(uid: int, umask: int, body: Callable[[], object]) -> int:
    """Start ``body`` in a forked child as ``uid`` (and gid) under ``umask``; return its pid.

    The child exits 0 when ``body`` returns, 1 when it raises (the error on stderr). What it
    imports must be imported before: after ``setuid`` it may not read the interpreter's files.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.umask(umask)
            body()
            code = 0
        except BaseException as exc:  # reported to the parent through the exit status
            os.write(2, f"as uid {uid}: {type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(code)
    return pid


def exit_code(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def as_user(uid: int, umask: int, body: Callable[[], object]) -> int:
    """Run ``body`` as :func:`fork_as` does and wait for it; its exit status."""
    return exit_code(fork_as(uid, umask, body))
