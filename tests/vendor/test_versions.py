"""Installed versions and their comparison (accelplat/_vendor/versions.py), by PEP 440."""

from __future__ import annotations

import importlib.metadata
import itertools

import pytest

from accelplat._vendor.versions import (
    distribution_version,
    graph_support,
    satisfies,
)


def test_pre_releases_come_before_their_release() -> None:
    order = ["2.5.1", "2.6.0.dev20250101", "2.6.0a0", "2.6.0rc1", "2.6.0", "2.6.0.post1"]
    for earlier, later in itertools.pairwise(order):
        assert satisfies(later, f">={earlier}") is True
        assert satisfies(earlier, f">={later}") is False


@pytest.mark.parametrize(
    ("version", "specifier", "expected"),
    [
        ("2.6.0a0", ">=2.6", False),  # a pre-release of 2.6 is not yet 2.6
        ("2.6.0a0", ">=2.5", True),
        ("2.6.0a0", "<2.6", False),  # nor before it, as PEP 440 (and pip) read "<2.6"
        ("2.6.0a0", "<2.6.0b1", True),
        ("2.6.0a0+git1234", ">=2.5,<2.6", False),
        ("2.11.0+cu130", ">=2.11", True),  # the local label does not count against the release
        ("2.11.0+cu130", "==2.11.0", True),
        ("2.5.1+rocm6.2", ">=2.4,<3", True),
        ("1.10.0", ">=1.9", True),  # numbers, not text: 10 > 9
        ("not a version", ">=1", None),
    ],
)
def test_satisfies_compares_by_pep_440(version: str, specifier: str, expected: bool | None) -> None:
    assert satisfies(version, specifier) is expected


def test_an_invalid_specifier_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        satisfies("2.6.0", "at least 2.6")


def test_distribution_version_reads_metadata_without_importing() -> None:
    assert distribution_version("packaging") == importlib.metadata.version("packaging")
    assert distribution_version("surely-not-an-installed-distribution") is None


@pytest.mark.parametrize(
    ("installed", "available"),
    [
        ("2.11.0+xpu", True),
        ("2.11.0rc1+xpu", False),  # a release candidate of the first version with the API
        ("2.10.0+xpu", False),
        ("2.12.0.dev20260301+xpu", True),  # a nightly after it
    ],
)
def test_graph_support_counts_pre_releases_of_the_minimum_as_before_it(
    monkeypatch: pytest.MonkeyPatch, installed: str, available: bool
) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    graph = graph_support("torch.xpu.XPUGraph", (2, 11), label="XPU graphs", flavour="xpu")
    assert graph.available is available
    assert installed in graph.reason
