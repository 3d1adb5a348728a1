"""Vendor libraries: importing one without letting it write to standard output, and its numbers.

One line printed on import (``amdsmi``'s without ROCm's library, a ``pynvml`` fork's) makes
``accelplat info --json`` unreadable: every vendor import goes through :func:`import_quietly`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import operator
import threading
from collections.abc import Iterator
from typing import Any

from accelplat import _util
from accelplat.errors import BackendError

_lock = threading.RLock()  # serialises the swap of sys.stdout, so two threads restore it right


def import_quietly(name: str, printed: list[str] | None = None) -> Any:
    """Import ``name`` with its standard output captured; appended to ``printed``, also on error."""
    with quiet_stdout() as captured:
        try:
            return importlib.import_module(name)
        finally:
            if printed is not None:
                printed.append(captured.getvalue())


@contextlib.contextmanager
def quiet_stdout() -> Iterator[io.StringIO]:
    """Capture what is printed to ``sys.stdout`` inside the block into the buffer yielded."""
    captured = io.StringIO()
    with _lock, contextlib.redirect_stdout(captured):
        yield captured


def vendor_int(platform: str, where: str, name: str, value: object) -> int:
    """Return a vendor's number as an ``int`` (numpy's, integral floats); ``BackendError`` else."""
    if isinstance(value, float) and value.is_integer():  # False for inf and nan
        return int(value)
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError):  # floats too: no float is an index
            return operator.index(value)  # type: ignore[arg-type]
    shown = _util.clip(repr(value), 40)
    raise BackendError(platform, f"{where}: {name} is {shown}, not an integer", "malformed reading")


@functools.cache
def facts(table: str) -> Any:
    """Return one table of the package data file ``vendor_facts.json`` (read once, on first use)."""
    import json
    from importlib import resources

    text = resources.files(__package__).joinpath("vendor_facts.json").read_text(encoding="utf-8")
    return json.loads(text)[table]
