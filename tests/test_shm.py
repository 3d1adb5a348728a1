"""/dev/shm budgets: statvfs arithmetic, vLLM's wording, the CI seed case, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import accelplat
import accelplat.types
from accelplat import GIB, MIB
from accelplat._shm import ShmInfo, largest_shm_budget, require_shm, shm_info
from accelplat.errors import ConfigurationError, InsufficientSharedMemoryError
from tests.fakes.hostfs import FRSIZE, fake_statvfs


def test_public_names_are_exported() -> None:
    assert accelplat.shm_info is shm_info
    assert accelplat.require_shm is require_shm
    assert accelplat.largest_shm_budget is largest_shm_budget
    assert accelplat.types.ShmInfo is ShmInfo


def test_shm_info_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    # root-reserved blocks: bfree (all free) > bavail (free to users)
    calls = fake_statvfs(monkeypatch, total=64 * MIB, free=16 * MIB, bfree=20 * MIB)
    info = shm_info("/fake/shm")
    assert info == ShmInfo(path="/fake/shm", total=64 * MIB, free=16 * MIB, used=44 * MIB)
    assert calls == ["/fake/shm"]


def test_shm_info_accepts_pathlike_and_reads_a_real_mount(tmp_path: Path) -> None:
    info = shm_info(tmp_path)
    assert info.path == str(tmp_path)
    assert 0 <= info.free <= info.total
    assert 0 <= info.used <= info.total


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
def test_default_path_is_dev_shm() -> None:
    st = os.statvfs("/dev/shm")
    info = shm_info()
    assert info.path == "/dev/shm"
    assert info.total == st.f_blocks * st.f_frsize


def test_require_shm_returns_info_when_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_statvfs(monkeypatch, total=8 * GIB, free=2 * GIB)
    info = require_shm(2 * GIB, "broadcast queue", path="/fake/shm")
    assert info.free == 2 * GIB
    assert require_shm(0, path="/fake/shm").free == 2 * GIB


def test_require_shm_message_is_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_statvfs(monkeypatch, total=64 * MIB, free=64 * MIB)
    monkeypatch.setattr("accelplat._shm.DEFAULT_SHM_PATH", "/fake/shm")
    with pytest.raises(InsufficientSharedMemoryError) as err:
        require_shm(160 * MIB, "shared-memory allocation", path="/fake/shm")
    assert str(err.value) == (
        "Insufficient space in /fake/shm for shared-memory allocation: 160 MiB required, "
        "64 MiB free. Increase /fake/shm (e.g. --shm-size or --ipc=host)."
    )
    assert (err.value.required, err.value.free, err.value.path) == (
        160 * MIB,
        64 * MIB,
        "/fake/shm",
    )
    assert isinstance(err.value, RuntimeError)


def test_require_shm_on_another_mount_gives_no_container_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_statvfs(monkeypatch, total=GIB, free=MIB // 2)
    with pytest.raises(InsufficientSharedMemoryError, match="Free space on /fake/scratch") as err:
        require_shm(MIB, "spill file", path="/fake/scratch")
    assert "1.00 MiB required, 0.50 MiB free" in str(err.value)
    assert "--shm-size" not in str(err.value)


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        (int(1.4 * GIB), GIB),  # the seed case: 4 GiB asked, 1.4-2.1 GiB free on CI workers
        (int(2.1 * GIB), 2 * GIB),
        (4 * GIB, 4 * GIB),
        (GIB - FRSIZE, None),
    ],
)
def test_largest_shm_budget_seed_case(
    monkeypatch: pytest.MonkeyPatch, free: int, expected: int | None
) -> None:
    fake_statvfs(monkeypatch, total=16 * GIB, free=free)
    assert largest_shm_budget([4 * GIB, 2 * GIB, GIB], path="/fake/shm") == expected
    # order of candidates does not matter
    assert largest_shm_budget([GIB, 4 * GIB, 2 * GIB], path="/fake/shm") == expected


def test_largest_shm_budget_keeps_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_statvfs(monkeypatch, total=16 * GIB, free=2 * GIB)
    assert largest_shm_budget([2 * GIB, GIB], path="/fake/shm") == 2 * GIB
    assert largest_shm_budget([2 * GIB, GIB], path="/fake/shm", headroom_bytes=1) == GIB
    assert largest_shm_budget(iter([3 * GIB]), path="/fake/shm", headroom_bytes=GIB) is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (-1, r"required_bytes must be an int >= 0, got -1"),
        (float("nan"), r"required_bytes must be an int >= 0, got float nan"),
        (float("inf"), r"required_bytes must be an int >= 0, got float inf"),
        (1.5 * GIB, r"required_bytes must be an int >= 0, got float"),
        (True, r"required_bytes must be an int >= 0, got bool"),
        ("4GiB", r"required_bytes must be an int >= 0, got str"),
    ],
)
def test_require_shm_rejects_bad_sizes(value: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        require_shm(value)  # type: ignore[arg-type]


def test_bad_name_and_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_statvfs(monkeypatch, total=GIB, free=GIB)
    with pytest.raises(ConfigurationError, match="name must be a non-empty str"):
        require_shm(1, "  ", path="/fake/shm")
    with pytest.raises(ConfigurationError, match=r"path '/fake/missing' does not exist"):
        shm_info("/fake/missing")
    with pytest.raises(ConfigurationError, match=r"path '/fake/missing' does not exist"):
        require_shm(1, path="/fake/missing")
    with pytest.raises(ConfigurationError, match="path must be a str"):
        shm_info(b"/dev/shm")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="path must be a non-empty path"):
        shm_info("")
    with pytest.raises(ValueError, match="does not exist"):  # ConfigurationError is a ValueError
        largest_shm_budget([GIB], path="/fake/missing")


def test_path_that_is_a_file_on_a_real_fs_works(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_text("x")
    assert shm_info(f).total == shm_info(tmp_path).total


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"candidates": []}, "at least one budget"),
        ({"candidates": [GIB, 0]}, r"candidates\[1\] must be an int >= 1, got 0"),
        ({"candidates": [GIB, -GIB]}, r"candidates\[1\] must be an int >= 1"),
        ({"candidates": [1.0]}, r"candidates\[0\] must be an int"),
        ({"candidates": "4GiB"}, "candidates must be an iterable of byte counts"),
        ({"candidates": 4 * GIB}, "candidates must be an iterable of byte counts"),
        ({"candidates": [GIB], "headroom_bytes": -1}, "headroom_bytes must be an int >= 0, got -1"),
        (
            {"candidates": [GIB], "headroom_bytes": float("nan")},
            "headroom_bytes must be an int >= 0, got float",
        ),
    ],
)
def test_largest_shm_budget_rejects_bad_input(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        largest_shm_budget(**kwargs)  # type: ignore[arg-type]
