"""pytest plugin for accelplat (registered through the ``pytest11`` entry point)."""
