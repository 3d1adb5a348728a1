"""The version of accelplat: the one place it is written (hatch reads it from here)."""

__version__ = "0.1.0"
