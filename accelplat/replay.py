"""Capture a host's answers at the vendor boundary, and replay them anywhere.

Replaying a bundle (``ACCELPLAT_REPLAY=bundle.tar.gz``, ``accelplat info --replay`` or
:func:`replaying`) makes detection, devices, memory, holders and capabilities answer from it
through the same code paths as on the captured host: only the vendor boundary is replaced.
:func:`capture` (``accelplat capture``) makes a bundle; see docs/report-your-hardware.md.
Each name loads its module on first use, as the package's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat import _lazy

_EXPORTS: dict[str, str] = {
    "Bundle": "accelplat._replay._bundle",
    "load_bundle": "accelplat._replay._bundle",
    "Recorder": "accelplat._replay._record",
    "activate": "accelplat._replay._install",
    "recording": "accelplat._replay._install",
    "replaying": "accelplat._replay._install",
    "Capture": "accelplat._capture",
    "capture": "accelplat._capture",
    "compare_info": "accelplat._capture",
}
"""Each public name and the private module that defines it (the one list)."""

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (the keys of _EXPORTS: one list)


__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # the same names, for type checkers (tests/contracts keeps the two equal)
    from accelplat._capture import Capture as Capture
    from accelplat._capture import capture as capture
    from accelplat._capture import compare_info as compare_info
    from accelplat._replay._bundle import Bundle as Bundle
    from accelplat._replay._bundle import load_bundle as load_bundle
    from accelplat._replay._install import activate as activate
    from accelplat._replay._install import recording as recording
    from accelplat._replay._install import replaying as replaying
    from accelplat._replay._record import Recorder as Recorder
