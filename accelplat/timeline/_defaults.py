"""The timeline's defaults, in a module that imports nothing.

The plugin's option help (built in every session) names them without importing the sampler.
"""

from __future__ import annotations

DEFAULT_HZ = 20.0  # samples per second
DEFAULT_LEAK_GRACE_S = 2.0  # seconds after the last test in which memory may still come back
