"""What the tests that replay the committed hosts (``tests/hosts/*.tar.gz``) share."""

from __future__ import annotations

from pathlib import Path

import pytest

HOSTS = Path(__file__).resolve().parent / "hosts"
BUNDLES = sorted(HOSTS.glob("*.tar.gz"))
"""Every committed host bundle: adding one to ``tests/hosts/`` is the whole job."""

VENDOR_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_FLAT_DEVICE_HIERARCHY",
)


def clear_vendor_variables(monkeypatch: pytest.MonkeyPatch, *more: str) -> None:
    """Unset every visible-devices variable (and ``more``) for the test."""
    for name in (*VENDOR_VARIABLES, *more):
        monkeypatch.delenv(name, raising=False)


class VirtualClock:
    """Settle waits of lazy platforms run in virtual time."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
