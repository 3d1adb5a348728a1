"""The timeline's defaults, importing nothing: the plugin's option help names them every session."""

from __future__ import annotations

DEFAULT_HZ = 20.0  # samples per second
DEFAULT_LEAK_GRACE_S = 2.0  # seconds after the last test in which memory may still come back
