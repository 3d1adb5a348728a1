"""Every lease test starts without an outer visible-devices grant or a lock directory variable."""

from __future__ import annotations

import pytest

from accelplat._backends.simulated import ENV_VISIBLE
from accelplat._leasing import ENV_LEASE_DIR


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VISIBLE, raising=False)
    monkeypatch.delenv(ENV_LEASE_DIR, raising=False)
