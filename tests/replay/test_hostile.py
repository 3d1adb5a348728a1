"""A malformed bundle never crashes or hangs: thousands of corruptions of real bundles either
load as a checked bundle or raise ``BundleError``; whatever loads, replaying it through
``accelplat info --replay`` ends with an answer or an accelplat error, never a traceback."""

from __future__ import annotations

import contextlib
import json
import random
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from accelplat._cli import main
from accelplat._replay._bundle import Bundle, bundle_bytes, parse_bundle
from accelplat.errors import AccelplatError, BundleError
from accelplat.replay import load_bundle
from tests._hosts import BUNDLES

_ODD_VALUES: list[Any] = [
    None,
    True,
    -1,
    2**70,
    "",
    "x" * 300,
    "\x1b[2J",
    [],
    {},
    {"$handle": "nvml-999"},
    {"$record": {"type": "T", "fields": {}}},
    {"$bytes": ""},
    {"$utf8": "\u0000"},
    [1, [2, [3]]],
    1.5,
]


def _mutate(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """Replace one randomly chosen leaf (or container) of ``value`` with an odd value."""
    if depth > 6 or rng.random() < 0.15 or not isinstance(value, (dict, list)) or not value:
        return rng.choice(_ODD_VALUES)
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    key = rng.choice(list(copy)) if isinstance(copy, dict) else rng.randrange(len(copy))
    copy[key] = _mutate(copy[key], rng, depth + 1)
    return copy


def _replay_info(tmp_path: Path, bundle: Bundle, host: dict[str, Any]) -> None:
    path = tmp_path / "mutated.tar.gz"
    path.write_bytes(bundle_bytes(host, bundle.info, bundle.contents))
    try:
        status = main(["info", "--json", "--replay", str(path)])
    except AccelplatError:
        return
    assert status in (0, 1, 2)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ACCELPLAT_REPLAY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_flipped_bytes_load_or_raise_bundle_error(path: Path) -> None:
    data = path.read_bytes()
    rng = random.Random(path.name)
    for _ in range(300):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        with contextlib.suppress(BundleError):
            parse_bundle(bytes(corrupt))


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_mutated_records_load_checked_or_are_refused_and_replay_without_a_traceback(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = load_bundle(path)
    with tarfile.open(path) as tar:
        member = tar.extractfile("host.json")
        assert member is not None
        host = json.loads(member.read())
    rng = random.Random(f"records-{path.name}")
    replayed = 0
    for _ in range(120):
        mutated = dict(host)
        records = list(host["records"])
        i = rng.randrange(len(records))
        record = dict(records[i])
        if rng.random() < 0.7:  # an answer of the wrong shape, under the right key
            answers = list(record["answers"])
            j = rng.randrange(len(answers))
            answers[j] = {"v": _mutate(answers[j].get("v"), rng)}
            record["answers"] = answers
            records[i] = record
        else:
            records[i] = _mutate(record, rng)
        mutated["records"] = records
        try:
            parse_bundle(bundle_bytes(mutated, bundle.info, bundle.contents))
        except BundleError:
            continue
        _replay_info(tmp_path, bundle, mutated)
        replayed += 1
    capsys.readouterr()
    assert replayed > 5  # the loader is strict, but shape-valid odd answers do reach the backends
