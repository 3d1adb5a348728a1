"""A deliberately broken plugin: importing it fails, as a plugin with a missing runtime would.

accelplat must skip it during detection and show the reason in ``accelplat.detect()`` and
``accelplat info``; forcing it (``ACCELPLAT_PLATFORM=example-npu-broken``) raises
``PlatformNotAvailableError`` with the same reason.
"""

from __future__ import annotations

raise ImportError(
    "libexample_npu_runtime.so.1: cannot open shared object file "
    "(the example's deliberately broken plugin)"
)
