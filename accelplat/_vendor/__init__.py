"""Importing a vendor library without letting it write to standard output.

Some vendor Python packages print when imported: ``amdsmi`` prints a line when ROCm's library is
missing, and a ``pynvml`` (a fork, a stray module, a debug build) may print anything. accelplat
imports them while answering ``accelplat info --json`` and other machine-read output, where one
stray line makes the document unreadable. Every vendor import goes through
:func:`import_quietly`: what the module prints to ``sys.stdout`` during its import is captured
(and kept for error messages), never shown.

The capture is at the Python level (``sys.stdout``), like :func:`contextlib.redirect_stdout`:
it holds for the duration of the import only.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["import_quietly", "quiet_stdout"]

_lock = threading.RLock()
"""Serialises the swap of ``sys.stdout``, so two imports in two threads restore it correctly."""


def import_quietly(name: str, printed: list[str] | None = None) -> Any:
    """Import the module ``name`` with anything it prints to standard output captured.

    Args:
        name: The module, e.g. ``"pynvml"``.
        printed: When given, what the import printed is appended to it (one string, possibly
            empty), also when the import raises.

    Returns:
        The module (from ``sys.modules`` when already imported).

    Raises:
        Exception: Whatever the import raises, unchanged.

    Side effects:
        Imports the module; ``sys.stdout`` is replaced while it runs.
    """
    with quiet_stdout() as captured:
        try:
            return importlib.import_module(name)
        finally:
            if printed is not None:
                printed.append(captured.getvalue())


@contextlib.contextmanager
def quiet_stdout() -> Iterator[io.StringIO]:
    """Capture what is printed to ``sys.stdout`` inside the block (for loading plugins too).

    Yields:
        The buffer that received it.
    """
    captured = io.StringIO()
    with _lock, contextlib.redirect_stdout(captured):
        yield captured
