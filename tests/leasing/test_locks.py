"""The lock directory's rules, the lock files, and the holder documents (untrusted input)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from accelplat._leasing import ENV_LEASE_DIR, lease, lease_status
from accelplat._leasing._locks import (
    FILE_MODE,
    default_lease_dir,
    lock_holder,
    open_lock,
    read_holder,
    try_lock,
    unlock,
)
from accelplat.errors import ConfigurationError, LeaseTimeoutError
from tests.leasing._common import as_root, sim

OTHER_UID = 4242  # no account needed: os.chown to it stands for another user


# --------------------------------------------------------------------------------------------
# the directory


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_lock_dir_that_is_not_writable_is_named(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigurationError, match=f"{locked} is not writable"):
            lease(platform=sim(), lock_dir=locked)
    finally:
        locked.chmod(0o700)


def test_a_lock_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(ConfigurationError, match=str(plain)):
        lease(platform=sim(), lock_dir=plain)


def test_default_lock_dir_follows_the_variable_then_the_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LEASE_DIR, str(tmp_path / "mine"))
    assert default_lease_dir() == tmp_path / "mine"
    monkeypatch.delenv(ENV_LEASE_DIR)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_lease_dir() == tmp_path / "accelplat" / "leases"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_lease_dir().name == "leases"
    assert f"accelplat-{os.getuid()}" in str(default_lease_dir())


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory for ``<tmp>/accelplat-<uid>/leases``, and no variable set."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path / f"accelplat-{os.getuid()}"


def test_the_private_default_is_created_0700(private_tmp: Path) -> None:
    with lease(1, platform=sim()):
        pass
    for level in (private_tmp, private_tmp / "leases"):
        assert stat.S_IMODE(level.lstat().st_mode) == 0o700
    assert [r.device_id for r in lease_status()] == ["simulated.SIM-1"]


def _plant(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "link to a directory of ours":
        (tmp_path / "real").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "real")
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "file":
        path.write_text("x")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "other owner":
        path.mkdir(mode=0o700)
        os.chown(path, OTHER_UID, -1)
    else:  # a mode
        path.mkdir()
        path.chmod(int(kind, 8))


PLANTED = [
    "link to a directory of ours",
    "dangling link",
    "file",
    "fifo",
    pytest.param("other owner", marks=as_root),
    "770",
    "720",
    "707",
    "777",
    "1777",
]


@pytest.mark.parametrize("level", ["base", "leases"])
@pytest.mark.parametrize("kind", PLANTED)
def test_a_planted_private_default_is_refused_naming_it(
    private_tmp: Path, tmp_path: Path, level: str, kind: str
) -> None:
    target = private_tmp if level == "base" else private_tmp / "leases"
    if level == "leases":
        private_tmp.mkdir(mode=0o700)
    _plant(kind, target, tmp_path)
    for call in (lambda: lease(1, platform=sim()), lease_status):
        with pytest.raises(ConfigurationError, match=f"{target} (is|cannot)") as info:
            call()
        assert "ACCELPLAT_LEASE_DIR" in str(info.value)
    assert not (tmp_path / "real" / "leases").exists()  # nothing made through the link


@as_root
def test_a_shared_directory_named_by_the_variable_may_belong_to_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    os.chown(shared, OTHER_UID, -1)
    monkeypatch.setenv(ENV_LEASE_DIR, str(shared))
    with lease(1, platform=sim()) as held:
        assert held.lock_dir == shared


def test_a_given_lock_dir_may_be_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # /var/lock -> /run/lock
    with lease(1, platform=sim(), lock_dir=tmp_path / "link"):
        assert (tmp_path / "real" / "simulated.SIM-1.lock").exists()


class _EmptyPath(os.PathLike[str]):
    def __fspath__(self) -> str:
        return ""


@pytest.mark.parametrize("empty", ["", _EmptyPath()], ids=["''", "PathLike ''"])
def test_an_empty_lock_dir_is_refused(empty: Any) -> None:
    with pytest.raises(ConfigurationError, match="must not be empty"):
        lease(platform=sim(), lock_dir=empty)
    with pytest.raises(ConfigurationError, match="must not be empty"):
        lease_status(empty)


# --------------------------------------------------------------------------------------------
# files: an explicit mode whatever the umask, never through a link, never blocking


def test_every_file_gets_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    plat = sim({"devices": [{"total": "16GiB"}]})
    previous = os.umask(0o077)
    try:
        with lease(memory="12GiB", platform=plat, lock_dir=shared, timeout_s=0):
            waiter = lease(memory="8GiB", platform=plat, lock_dir=shared, timeout_s=0)
            assert waiter.try_acquire() is not None  # refused: it waits in the queue
            (ticket,) = (shared / "queue").glob("*.ticket")
            made = [ticket, *shared.glob("*.lock"), *(shared / "shares").iterdir()]
            made += [*(shared / "queue").glob("*.admit")]
            assert {stat.S_IMODE(p.stat().st_mode) for p in made} == {FILE_MODE}
            waiter.release()
        with lease(platform=plat, lock_dir=shared, timeout_s=0):
            assert stat.S_IMODE((shared / "simulated.SIM-0.json").stat().st_mode) == FILE_MODE
    finally:
        os.umask(previous)
    for sub in ("queue", "shares"):  # as their parent, sticky bit included
        assert stat.S_IMODE((shared / sub).stat().st_mode) == 0o1777


def test_a_lock_made_0600_by_an_older_version_is_opened_up_by_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "simulated.SIM-0.lock"
    path.touch(mode=0o600)
    path.chmod(0o600)
    unlock(open_lock(path))
    assert stat.S_IMODE(path.stat().st_mode) == FILE_MODE


def _unlockable(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "directory":
        path.mkdir()
    elif kind == "link to a file":
        (tmp_path / "target").write_text("")
        path.symlink_to(tmp_path / "target")
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "link to a directory":
        path.symlink_to(tmp_path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()


UNLOCKABLE = ["directory", "link to a file", "dangling link", "link to a directory", "fifo"]
UNLOCKABLE += ["socket", "permission denied"]


@pytest.mark.parametrize("kind", UNLOCKABLE)
def test_a_device_that_cannot_be_locked_is_skipped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    bad = locks / "simulated.SIM-1.lock"  # the device with the most free memory
    if kind == "permission denied":  # another user's 0600 file, as a non-root user sees it
        bad.touch(mode=0o600)
        real_open = os.open

        def refuse(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if Path(path) == bad:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    else:
        _unlockable(kind, bad, tmp_path)
    plat = sim()
    with lease(1, platform=plat, lock_dir=locks, timeout_s=0) as held:
        assert held.device_ids == ("simulated.SIM-0",)  # the next best, not a traceback
        with lease(1, platform=plat, lock_dir=locks, timeout_s=0) as other:
            assert other.device_ids == ("simulated.SIM-2",)
    with pytest.raises(LeaseTimeoutError, match=f"device 1 cannot be locked \\({bad}: "):
        lease(3, platform=plat, lock_dir=locks, timeout_s=0).acquire()
    assert "simulated.SIM-1" not in {r.device_id for r in lease_status(locks)}
    if kind == "link to a file":
        assert (tmp_path / "target").read_text() == ""  # nothing written through the link


@as_root
def test_another_users_0600_lock_file_is_skipped_by_the_others(tmp_path: Path) -> None:
    from tests.leasing._common import THREE, as_user, shared_dir

    with shared_dir(THREE) as (shared, _):
        (shared / "simulated.SIM-1.lock").touch(mode=0o600)  # root's, unreadable to the child
        plat = sim()

        def attempt() -> None:
            with lease(1, timeout_s=0, lock_dir=shared, platform=plat) as held:
                assert held.device_ids == ("simulated.SIM-0",)
            with pytest.raises(LeaseTimeoutError, match=r"device 1 cannot be locked.*denied"):
                lease(3, timeout_s=0, lock_dir=shared, platform=plat).acquire()

        assert as_user(65534, 0o022, attempt) == 0


def test_the_holder_of_a_lock_is_named_from_the_kernels_list(tmp_path: Path) -> None:
    fd = try_lock(tmp_path / "x.lock")
    assert fd is not None
    try:
        assert lock_holder(tmp_path / "x.lock").startswith(f"pid {os.getpid()} (")
    finally:
        unlock(fd)
    assert lock_holder(tmp_path / "x.lock") == "another process"  # nobody holds it now


# --------------------------------------------------------------------------------------------
# holder documents: untrusted


def test_hostile_metadata_is_ignored(tmp_path: Path) -> None:
    plat = sim()
    with lease(1, platform=plat, lock_dir=tmp_path) as held:
        key = held.device_ids[0]
    meta = tmp_path / f"{key}.json"
    meta.unlink()
    meta.symlink_to("/dev/zero")  # not a regular file: never read
    (tmp_path / "simulated.SIM-0.json").write_bytes(b"{" * 100_000)  # oversized
    (tmp_path / "simulated.SIM-2.json").write_text('{"baseline_used_bytes": -5, "pid": "x"}')
    (tmp_path / "simulated.SIM-2.lock").touch()
    records = {r.device_id: r for r in lease_status(tmp_path)}
    assert records["simulated.SIM-2"].pid is None  # "x" is no pid
    assert records["simulated.SIM-2"].baseline_used_bytes is None
    with lease(3, platform=plat, lock_dir=tmp_path, timeout_s=0) as every:
        assert len(every.devices) == 3  # no wait on a nonsense baseline, no crash
    records = {r.device_id: r for r in lease_status(tmp_path)}
    assert records["simulated.SIM-2"].pid == os.getpid()  # rewritten by the new holder


def test_metadata_behind_a_link_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.json"
    real.write_text('{"pid": 7}')
    link = tmp_path / "simulated.SIM-0.json"
    link.symlink_to(real)
    assert read_holder(real).pid == 7
    assert read_holder(link).pid is None  # another user's link in a shared directory
    fifo = tmp_path / "simulated.SIM-1.json"
    os.mkfifo(fifo)
    box: list[object] = []
    reader = threading.Thread(target=lambda: box.append(read_holder(fifo).pid), daemon=True)
    reader.start()
    reader.join(30)  # a FIFO without a writer would block a plain open() for ever
    assert box == [None]


HOSTILE_SINCE = [1e18, 1e300, 253_402_300_800, -1, "2024", True, None, [], 10**400]
HOSTILE_SINCE_TEXT = ["NaN", "Infinity", "-Infinity", "1e400"]  # JSON Python reads anyway


@pytest.mark.parametrize("since", [json.dumps(s) for s in HOSTILE_SINCE] + HOSTILE_SINCE_TEXT)
def test_status_shows_an_out_of_range_time_as_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], since: str
) -> None:
    from accelplat._cli import main

    (tmp_path / "simulated.SIM-0.lock").touch()
    (tmp_path / "simulated.SIM-0.json").write_text(f'{{"pid": 5, "since": {since}}}')
    (record,) = lease_status(tmp_path)
    assert record.since is None
    assert main(["lease", "--status", "--lock-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pid 5 (" in out
    assert "since ?)" in out
    assert main(["lease", "--status", "--json", "--lock-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["since"] is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pid", 0),
        ("pid", -1),
        ("pid", 2**22 + 1),
        ("pid", 2**63),
        ("pid", 1.5),
        ("pid", True),
        ("pid", "5"),
        ("baseline_used_bytes", -5),
        ("baseline_used_bytes", 2**63),
        ("baseline_used_bytes", 1e30),
        ("baseline_used_bytes", False),
        ("command", 5),
        ("command", ["x"]),
        ("platform", {"a": 1}),
        ("released", "yes"),
        ("device_id", "simulated.SIM-2"),
    ],
)
def test_every_metadata_field_is_range_checked(tmp_path: Path, field: str, value: Any) -> None:
    (tmp_path / "simulated.SIM-0.lock").touch()
    (tmp_path / "simulated.SIM-0.json").write_text(json.dumps({field: value}))
    (record,) = lease_status(tmp_path)
    assert record.device_id == "simulated.SIM-0"  # the file's name, whatever the metadata says
    assert record.pid is None
    assert record.baseline_used_bytes is None
    assert (record.command, record.platform, record.released) == ("", "", False)
    with lease(3, platform=sim(), lock_dir=tmp_path, timeout_s=0):
        pass  # a lease through it neither crashes nor waits


def test_metadata_text_is_bounded_and_escaped(tmp_path: Path) -> None:
    (tmp_path / "simulated.SIM-0.lock").touch()
    meta = {"command": "\x1b]0;owned\x07" + "x" * 5000, "platform": "\x1b[2J"}
    (tmp_path / "simulated.SIM-0.json").write_text(json.dumps(meta))
    (record,) = lease_status(tmp_path)
    assert record.command.startswith("?]0;owned?x")
    assert len(record.command) == 1024
    assert record.platform == "?[2J"
