"""The footprint store: learned peaks, margins from their spread, untrusted reading, safe writes."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from accelplat._types import GIB, MIB
from accelplat.errors import ConfigurationError
from accelplat.pytest_plugin import _footprints
from accelplat.pytest_plugin._footprints import (
    KEPT,
    MAX_FOOTPRINTS_BYTES,
    budget_for,
    is_stale,
    load_footprints,
    save_footprints,
)


def test_the_budget_is_the_newest_figure_and_a_margin_from_their_spread() -> None:
    assert budget_for([8 * GIB]) == 9 * GIB  # one figure: the least margin
    assert budget_for([8 * GIB, 8 * GIB + 100 * MIB]) == 9 * GIB + 100 * MIB  # steady
    assert budget_for([12 * GIB, 8 * GIB]) == 12 * GIB  # the spread covers the past


def test_a_budget_is_stale_when_exceeded_or_far_too_large() -> None:
    assert is_stale(11 * GIB, 10 * GIB)
    assert is_stale(3 * GIB, 10 * GIB)
    assert not is_stale(6 * GIB, 10 * GIB)
    assert not is_stale(100 * MIB, 300 * MIB)  # twice, but less than 1 GiB apart
    assert is_stale(1, 0)  # learned to need none, and used some


def test_newer_figures_win_and_a_few_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "fp.json"
    assert load_footprints(path) == {}  # no store yet
    save_footprints(path, {"a": 1, "b": 2})
    for peak in range(3, 3 + KEPT):
        save_footprints(path, {"b": peak})
    assert load_footprints(path) == {"a": (1,), "b": tuple(range(3, 3 + KEPT))}
    save_footprints(path, {"b": 99}, restart={"b"})  # stale: its history restarts
    save_footprints(path, {"a": None})  # forgotten: measured alone next time
    assert load_footprints(path) == {"b": (99,)}
    assert json.loads(path.read_text())["format"] == "accelplat.footprints"


def test_the_store_gets_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    old = os.umask(0o077)
    try:
        save_footprints(path, {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_sessions_writing_at_once_lose_no_figures(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    threads = [
        threading.Thread(target=save_footprints, args=(path, {f"t{i}": i})) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert load_footprints(path) == {f"t{i}": (i,) for i in range(8)}


def test_a_lock_held_too_long_is_an_error_not_a_wait_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fp.json"
    monkeypatch.setattr(_footprints, "LOCK_TIMEOUT_S", 0.2)
    with open(tmp_path / ".fp.json.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match="stayed locked"):
            save_footprints(path, {"a": 1})
    assert not path.exists()


def test_the_oldest_entries_go_when_the_store_outgrows_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fp.json"
    monkeypatch.setattr(_footprints, "MAX_FOOTPRINTS_BYTES", 2000)
    save_footprints(path, {f"old{i:02}": i for i in range(100)})
    save_footprints(path, {"new": 1})
    kept = load_footprints(path)
    assert path.stat().st_size <= 2000
    assert "new" in kept
    assert "old00" not in kept


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"format": "other", "tests": {}}, "format"),
        ({"format": "accelplat.footprints", "version": 2, "tests": {}}, "version"),
        ({"format": "accelplat.footprints", "tests": []}, "tests"),
        ({"format": "accelplat.footprints", "tests": {"a": 5}}, "tests['a']"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peaks": [2**51]}}}, "peaks"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peaks": [True]}}}, "peaks"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peaks": []}}}, "no figures"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peaks": [1] * 6}}}, "at most 5"),
        ({"format": "accelplat.footprints", "tests": {"a": {"peak": 1}}}, "unknown key"),
    ],
    ids=str,
)
def test_a_malformed_store_names_the_file_and_field(
    tmp_path: Path, doc: object, field: str
) -> None:
    path = tmp_path / "fp.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigurationError, match="footprint store") as info:
        load_footprints(path)
    assert field in str(info.value)
    with pytest.raises(ConfigurationError):
        save_footprints(path, {"x": 1})  # a malformed store is not overwritten
    assert json.loads(path.read_text()) == doc


def test_what_is_not_a_small_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigurationError, match="cannot read footprint store"):
        load_footprints(tmp_path / "fifo")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_FOOTPRINTS_BYTES + 1))
    with pytest.raises(ConfigurationError, match="larger than"):
        load_footprints(big)
