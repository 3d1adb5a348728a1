"""Root pytest configuration: keep every test independent of the caller's environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

_ISOLATED_PREFIXES = ("ACCELPLAT_",)


@pytest.fixture(autouse=True)
def _isolate_accelplat(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clear ACCELPLAT_* variables and the registry's caches around every test."""
    import os

    from accelplat import registry

    for key in list(os.environ):
        if key.startswith(_ISOLATED_PREFIXES):
            monkeypatch.delenv(key, raising=False)
    registry.reset()
    yield
    registry.reset()
