"""Importing a vendor library without letting it write to standard output.

Some vendor packages print when imported (``amdsmi`` does when ROCm's library is missing; a
``pynvml`` fork may print anything), and one stray line makes ``accelplat info --json``
unreadable. Every vendor import goes through :func:`import_quietly`, which captures what the
import prints to ``sys.stdout`` (as :func:`contextlib.redirect_stdout` does) and keeps it for
error messages.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import threading
from collections.abc import Iterator
from typing import Any

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
