"""How every sub-command ends: one exit status mapping, one JSON shape (``docs/cli.md``).

0 success; 1 a check or wait that did not pass, or a runtime failure (no platform, a backend
error, a file that cannot be written); 2 bad usage or configuration; 130 after Ctrl-C; 141 when
standard output was closed early. Every ``--json`` document starts with ``"schema"``; under
``--json`` an error also prints a JSON error object on standard output.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from accelplat._describe import SCHEMA_VERSION
from accelplat._types import MemoryHolder
from accelplat._util import printable
from accelplat.errors import BackendError, ConfigurationError, DeviceNotFoundError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def versioned(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``doc`` with ``"schema": SCHEMA_VERSION`` as its first key."""
    return {"schema": SCHEMA_VERSION, **{k: v for k, v in doc.items() if k != "schema"}}


def dumps(doc: Mapping[str, Any], *, indent: int | None = None) -> str:
    """Serialise ``doc`` as the command line prints it: versioned, strict JSON.

    Args:
        doc: The document's own keys.
        indent: As for :func:`json.dumps`; ``None`` prints one line (streams need that).

    Raises:
        ValueError: For a float that is not finite (JSON has no NaN or infinity).
    """
    return json.dumps(versioned(doc), indent=indent, allow_nan=False)


def holder_json(h: MemoryHolder) -> dict[str, Any]:
    """Return a process holding device memory as ``--json`` documents show it."""
    return {"pid": h.pid, "used_bytes": h.used_bytes, "state": h.state.value, "name": h.name}


def exit_status(exc: BaseException) -> int:
    """Return 2 for bad usage or configuration (an unknown device too), 1 for anything else."""
    if isinstance(exc, (ConfigurationError, DeviceNotFoundError)):
        return EXIT_USAGE
    return EXIT_FAILED


def error_document(exc: BaseException, status: int | None = None) -> dict[str, Any]:
    """Return ``{"status": "error", "exit_status": N, "error": {"type", "message", …}}``.

    ``error`` also has ``vendor_error`` for backend errors and ``platform`` where the error
    names one; ``status`` defaults to :func:`exit_status`.
    """
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, BackendError):
        error["vendor_error"] = exc.vendor_error
    platform = getattr(exc, "platform", None)
    if isinstance(platform, str):
        error["platform"] = platform
    status = exit_status(exc) if status is None else status
    return {"status": "error", "exit_status": status, "error": error}


def fail(exc: BaseException, *, command: str, json_output: bool) -> int:
    """Report ``exc`` as the end of ``command``: message on stderr, JSON on stdout if asked.

    Returns:
        The exit status (:func:`exit_status`).
    """
    status = exit_status(exc)
    prefix = f"accelplat {command}" if command else "accelplat"
    print(f"{prefix}: error: {printable(exc, keep_newlines=True)}", file=sys.stderr)
    if json_output:
        print(dumps(error_document(exc, status)))
    return status


def silence_stdout() -> None:
    """Point standard output at ``/dev/null`` after its reader went away (``| head``).

    Python would otherwise report a ``BrokenPipeError`` when it flushes standard output at exit.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass
