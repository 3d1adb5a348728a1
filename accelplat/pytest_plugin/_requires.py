"""The ``accelplat_requires`` marker: its arguments checked, and why a test skips (``_needs``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from accelplat.errors import ConfigurationError, MarkerError
from accelplat.pytest_plugin._shared import current

if TYPE_CHECKING:
    from accelplat._needs import Needs

MARKER = (
    "accelplat_requires(*requirements, devices=None, device_memory=None, platforms=None, "
    "shm=None, shm_path='/dev/shm'): skip unless every requirement holds ('fp8', "
    "'xpu or (cuda and capability>=90)') and every resource is there (accelerators only; sizes "
    "with a unit: '40GiB'); the reason lists each unmet one"
)  # shown by pytest --markers


def parse(mark: pytest.Mark) -> Needs:
    """Check an ``accelplat_requires`` marker and return what it asks for, else MarkerError."""
    from accelplat._needs import parse_needs  # on first use: a session without markers pays none

    try:
        return parse_needs(tuple(mark.args), mark.kwargs)
    except ConfigurationError as exc:
        raise MarkerError(str(exc)) from None


def skip_reason(item: pytest.Item) -> str | None:
    """Why ``item``'s markers (all must hold) skip it, closest first, or ``None``; MarkerError."""
    marks = list(item.iter_markers("accelplat_requires"))
    if not marks:
        return None
    from accelplat._needs import unmet

    platform = current(item.config)
    reasons = [r for mark in marks for r in unmet(parse(mark), platform)]
    return "; ".join(dict.fromkeys(reasons)) or None
