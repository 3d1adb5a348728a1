"""Capture a host's answers at the vendor boundary, and replay them anywhere.

Replaying a bundle (``ACCELPLAT_REPLAY=bundle.tar.gz``, ``accelplat info --replay`` or
:func:`replaying`) makes detection, devices, memory, holders and capabilities answer from it
through the same code paths as on the captured host: only the vendor boundary is replaced.
:func:`capture` (``accelplat capture``) makes a bundle; see docs/report-your-hardware.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelplat.replay._bundle import Bundle, load_bundle, parse_bundle
from accelplat.replay._install import activate, recording, replaying
from accelplat.replay._record import Recorder

if TYPE_CHECKING:
    from accelplat._capture import Capture, capture, compare_info

__all__ = [
    "Bundle",
    "Capture",
    "Recorder",
    "activate",
    "capture",
    "compare_info",
    "load_bundle",
    "parse_bundle",
    "recording",
    "replaying",
]

_FROM_CAPTURE = frozenset({"Capture", "capture", "compare_info"})


def __getattr__(name: str) -> Any:
    # Capturing drives detection, a floor above the formats: imported only when asked for.
    if name in _FROM_CAPTURE:
        from accelplat import _capture

        return getattr(_capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _FROM_CAPTURE)
