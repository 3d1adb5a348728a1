"""Requirements as plain pytest marks and module-level skips, decided when the module is imported.

They need no plugin: ``requires(...)`` is a ``pytest.mark.skipif`` that pytest itself applies,
so a test cannot silently run where the plugin is disabled. Deciding creates no device context,
so a parent process stays free to fork or spawn its multi-GPU children (vLLM's isolation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from accelplat._needs import parse_needs, unmet
from accelplat._registry import current_platform

if TYPE_CHECKING:
    from accelplat._platform import Platform


def _reasons(
    requirements: tuple[str, ...], keywords: dict[str, object], what: str, platform: Platform | None
) -> list[str]:
    given = {key: value for key, value in keywords.items() if value is not None}
    need = parse_needs(requirements, given, what)
    return unmet(need, current_platform() if platform is None else platform)


def requires(
    *requirements: str,
    devices: int | None = None,
    device_memory: str | None = None,
    shm: str | None = None,
    shm_path: str | None = None,
    platform: Platform | None = None,
    reason: str | None = None,
) -> pytest.MarkDecorator:
    """Return a ``skipif`` mark that skips unless every requirement holds.

    ``@requires("xpu or (cuda and capability>=90)", devices=2)``; the words are in
    ``docs/capabilities.md``. Decided now, on the current platform (or ``platform``).

    Args:
        requirements: Requirement expressions, all of which must hold.
        devices: Accelerators needed (the host CPU never counts).
        device_memory: Total memory each of them needs, with a unit (``"40GiB"``).
        shm: Free space needed in ``shm_path`` (default ``/dev/shm``), with a unit.
        shm_path: Where ``shm`` is measured.
        platform: Decide on this platform instead of the current one.
        reason: The test's own words for why it needs them (a migrated ``skipif``'s reason);
            accelplat's reasons follow in parentheses.

    Returns:
        ``pytest.mark.skipif(...)`` whose reason names each unmet requirement.

    Raises:
        ConfigurationError: A malformed requirement, an unknown word, a size without a unit.
    """
    keywords: dict[str, object] = {
        "devices": devices, "device_memory": device_memory, "shm": shm, "shm_path": shm_path
    }  # fmt: skip
    reasons = _reasons(requirements, keywords, "requires", platform)
    said = _said(reason, reasons) or "all requirements hold"
    return pytest.mark.skipif(bool(reasons), reason=said)


def skip_module_unless(
    *requirements: str,
    devices: int | None = None,
    device_memory: str | None = None,
    platform: Platform | None = None,
    reason: str | None = None,
) -> None:
    """Skip the whole test module being imported unless every requirement holds.

    Call it at module level, before imports that need the hardware (vLLM's
    ``pytest.skip(..., allow_module_level=True)`` under a platform condition). Arguments as
    :func:`requires`.

    Raises:
        pytest.skip.Exception: When a requirement is unmet (the reason names each).
        ConfigurationError: A malformed requirement or an unknown word.
    """
    keywords: dict[str, object] = {"devices": devices, "device_memory": device_memory}
    reasons = _reasons(requirements, keywords, "skip_module_unless", platform)
    if reasons:
        pytest.skip(_said(reason, reasons), allow_module_level=True)


def _said(reason: str | None, reasons: list[str]) -> str:
    """The skip reason: the test's own words first, then why accelplat says no."""
    ours = "; ".join(reasons)
    return f"{reason} ({ours})" if reason and ours else reason or ours
