"""What the plugin's parts share: the session's platform, the leak tolerance, the last reading."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from accelplat._validate import number
from accelplat.errors import AccelplatError

if TYPE_CHECKING:
    from accelplat._platform import Platform
    from accelplat.timeline._trace import DeviceTrack

DEFAULT_LEAK_TOLERANCE = "256MiB"  # == _leaks.DEFAULT_LEAK_TOLERANCE_BYTES, a test checks
LEAK_PLUGIN_NAME = "accelplat-leak-check"
TIMELINE_PLUGIN_NAME = "accelplat-timeline-recorder"
FORCED_KEY = pytest.StashKey[str]()
PACK_KEY = pytest.StashKey[str]()  # the header's words on packing
_AFTER_TEARDOWN_KEY = pytest.StashKey[dict[int, int]]()


@contextlib.contextmanager
def usage_errors(prefix: str = "") -> Iterator[None]:
    """Raise what goes wrong inside (a bad option, an unusable platform) as pytest's usage error.

    One usage error, with ``prefix`` and the cause's words, instead of a skip of every test.
    """
    try:
        yield
    except AccelplatError as exc:
        raise pytest.UsageError(f"{prefix}{exc}") from None


def reapply_forced(config: pytest.Config) -> None:
    """Put ``--accelplat-platform`` back if something (``registry.reset()``) cleared it."""
    name = config.stash.get(FORCED_KEY, None)
    if name is None:
        return
    from accelplat import _registry as registry

    if registry.forced_platform() is None:
        registry.set_current_platform(name)


def skip_at_test(reason: str) -> NoReturn:
    """Skip the test being set up, reported at its own line as pytest's skip markers are."""
    raise pytest.skip.Exception(reason, _use_item_location=True)


def current(config: pytest.Config) -> Platform:
    """The session's platform: ``--accelplat-platform`` when given, else the detected one."""
    reapply_forced(config)
    from accelplat._registry import current_platform

    return current_platform()


def leak_tolerance(config: pytest.Config, *options: str) -> int:
    """The leak tolerance in bytes: the first of ``options`` given, else the ini, else 256 MiB."""
    from accelplat._leaks import parse_leak_tolerance  # the size grammar: not in every session

    named = [(o, config.getoption(o)) for o in options]
    named.append(("accelplat_leak_tolerance", config.getini("accelplat_leak_tolerance")))
    argument, raw = next(((o, v) for o, v in named if v), named[-1])
    with usage_errors():
        return parse_leak_tolerance(str(raw or DEFAULT_LEAK_TOLERANCE), argument=argument)


def catch_ending_signals(handler: Callable[[int, FrameType | None], Any]) -> Callable[[], None]:
    """Give ``handler`` SIGTERM and SIGHUP where they are unhandled; return what undoes it.

    Only from the main thread (elsewhere nothing is changed): the part that catches them ends
    the session as Ctrl-C does, so that what it holds is let go and what it records is written.
    """
    main = threading.current_thread() is threading.main_thread()
    free = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is signal.SIG_DFL]
    ending = free if main else []
    for signum in ending:
        signal.signal(signum, handler)

    def restore() -> None:
        for signum in ending:
            signal.signal(signum, signal.SIG_DFL)

    return restore


def auto_seconds(raw: object, argument: str) -> float | None:
    """``raw`` (an option's or ini's) as seconds >= 0, ``None`` for ``auto``; else UsageError."""
    if str(raw).strip().lower() == "auto":
        return None
    with usage_errors():  # finite and >= 0: a negative, nan or inf time is no time
        return number(raw, argument, minimum=0, from_text=True, expected="'auto' or seconds >= 0")


def share_after_teardown(
    item: pytest.Item, devices: Sequence[DeviceTrack], reading: Sequence[int | None]
) -> None:
    """Offer the leak check the timeline's reading (``devices`` order) if whole (no ``None``)."""
    if item.config.pluginmanager.get_plugin(LEAK_PLUGIN_NAME) is None or None in reading:
        return
    item.stash[_AFTER_TEARDOWN_KEY] = {
        d.index: used for d, used in zip(devices, reading, strict=True) if used is not None
    }


def used_after_teardown(item: pytest.Item, platform: Platform) -> dict[int, int] | None:
    """Used bytes per visible device as ``item``'s teardown ended: the timeline's, if whole."""
    shared = item.stash.get(_AFTER_TEARDOWN_KEY, None)
    if shared is not None:
        del item.stash[_AFTER_TEARDOWN_KEY]
        if sorted(shared) == list(range(platform.device_count())):
            return shared
    return None
