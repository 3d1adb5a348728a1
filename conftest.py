"""Root pytest configuration: keep every test independent of the caller's environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

_ISOLATED_PREFIXES = ("ACCELPLAT_",)
# A CI that sets FORCE_COLOR for its logs would turn `stats` into the coloured view in a pipe.
_ISOLATED_NAMES = ("FORCE_COLOR", "NO_COLOR")


@pytest.fixture(autouse=True)
def _isolate_accelplat(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clear ACCELPLAT_* and colour variables and the registry's caches around every test."""
    import os

    from accelplat import _registry as registry

    for key in list(os.environ):
        if key.startswith(_ISOLATED_PREFIXES) or key in _ISOLATED_NAMES:
            monkeypatch.delenv(key, raising=False)
    registry.reset()
    yield
    registry.reset()


def pytest_configure(config: pytest.Config) -> None:
    """Accept accelplat's markers in a checkout run without installing it.

    Run as ``PYTHONPATH=. python -m pytest`` (as on a GPU machine with no package index), the
    ``pytest11`` entry points are absent, so the plugin is not loaded and ``--strict-markers``
    would refuse a module that declares ``accelplat_requires`` at import. The marker line comes
    from the plugin itself; without the plugin those marks do nothing.
    """
    if config.pluginmanager.has_plugin("accelplat"):
        return
    from accelplat.pytest_plugin._requires import MARKER

    config.addinivalue_line("markers", MARKER)
