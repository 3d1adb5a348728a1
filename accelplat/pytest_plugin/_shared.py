"""What the plugin's parts share: the session's platform, the leak tolerance, the last reading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from accelplat._platform import Platform
    from accelplat.timeline._trace import DeviceTrack

DEFAULT_LEAK_TOLERANCE = "256MiB"
"""The leak tolerance as text, for the help (equal to ``_leaks.DEFAULT_LEAK_TOLERANCE_BYTES``,
which a test checks; importing that module here would load the size grammar in every session)."""

LEAK_PLUGIN_NAME = "accelplat-leak-check"
FORCED_KEY = pytest.StashKey[str]()
_AFTER_TEARDOWN_KEY = pytest.StashKey[dict[int, int]]()


def reapply_forced(config: pytest.Config) -> None:
    """Put ``--accelplat-platform`` back if something (``registry.reset()``) cleared it.

    A platform a test or fixture forced itself is left alone.
    """
    name = config.stash.get(FORCED_KEY, None)
    if name is None:
        return
    from accelplat import _registry as registry

    if registry.forced_platform() is None:
        registry.set_current_platform(name)


def current(config: pytest.Config) -> Platform:
    """The session's platform: ``--accelplat-platform`` when given, else the detected one."""
    reapply_forced(config)
    from accelplat._registry import current_platform

    return current_platform()


def leak_tolerance(config: pytest.Config, *options: str) -> int:
    """The leak tolerance in bytes: the first of ``options`` given, else the ini, else 256 MiB.

    One session judges leaks with one tolerance, so the leak check and the timeline read it here.

    Raises:
        pytest.UsageError: Naming the option, for what is not a size.
    """
    from accelplat._leaks import parse_leak_tolerance
    from accelplat.errors import ConfigurationError

    named = [(o, config.getoption(o)) for o in options]
    named.append(("accelplat_leak_tolerance", config.getini("accelplat_leak_tolerance")))
    argument, raw = next(((o, v) for o, v in named if v), named[-1])
    try:
        return parse_leak_tolerance(str(raw or DEFAULT_LEAK_TOLERANCE), argument=argument)
    except ConfigurationError as exc:
        raise pytest.UsageError(str(exc)) from None


def used_bytes(platform: Platform) -> dict[int, int]:
    """Used bytes per visible device now."""
    return {d: platform.memory_info(d).used for d in range(platform.device_count())}


def share_after_teardown(
    item: pytest.Item, devices: Sequence[DeviceTrack], reading: Sequence[int | None]
) -> None:
    """Offer the leak check the timeline's reading of used memory as ``item``'s teardown ended.

    Both compare memory at that moment, so the leak check need not read again. A reading that
    misses a device (a failed query) is not offered, nor kept when the leak check is off.

    Args:
        item: The test.
        devices: The sampled devices, in reading order.
        reading: Used bytes per device, ``None`` where the query failed.
    """
    if item.config.pluginmanager.get_plugin(LEAK_PLUGIN_NAME) is None:
        return
    if any(used is None for used in reading):
        return
    item.stash[_AFTER_TEARDOWN_KEY] = {
        d.index: used for d, used in zip(devices, reading, strict=True) if used is not None
    }


def used_after_teardown(item: pytest.Item, platform: Platform) -> dict[int, int]:
    """Used bytes per visible device at the end of ``item``'s teardown.

    Takes the timeline's reading of that moment when it covers every visible device.
    """
    shared = item.stash.get(_AFTER_TEARDOWN_KEY, None)
    if shared is not None:
        del item.stash[_AFTER_TEARDOWN_KEY]
        if sorted(shared) == list(range(platform.device_count())):
            return shared
    return used_bytes(platform)
