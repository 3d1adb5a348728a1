"""The timeline's default settings, in a module that imports nothing.

The pytest plugin names them in its option help, which pytest builds in every session: this
keeps a session that never asks for a timeline from importing the sampler and the trace model.
"""

from __future__ import annotations

__all__ = ["DEFAULT_HZ", "DEFAULT_LEAK_GRACE_S"]

DEFAULT_HZ = 20.0
"""Default sampling rate, in samples per second."""

DEFAULT_LEAK_GRACE_S = 2.0
"""Seconds after the last test during which memory may still come back before it is leaked."""
