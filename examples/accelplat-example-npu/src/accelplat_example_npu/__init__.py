"""An example accelplat backend plugin: a fake NPU described by a JSON file.

Installed, it advertises two entry points in the ``accelplat.platforms`` group:

* ``example-npu`` → :class:`ExampleNpuPlatform`, available when ``EXAMPLE_NPU_CONFIG`` names a
  JSON file describing devices;
* ``example-npu-broken`` → a module whose import fails, to show that accelplat skips a broken
  plugin and reports why.
"""

from __future__ import annotations

from accelplat_example_npu.platform import ENV_CONFIG, ENV_VISIBLE, ExampleNpuPlatform

__all__ = ["ENV_CONFIG", "ENV_VISIBLE", "ExampleNpuPlatform"]
