"""How every sub-command ends on an error: one exit status mapping, one JSON error object.

The mapping (documented in ``docs/cli.md``):

* **0**: success;
* **1**: a check or wait that did not pass, or a runtime failure: no platform available, a
  backend error (a GPU lost, a driver failing, an impossible reading), a file that cannot be
  written;
* **2**: bad usage or configuration: an argument, a variable or an input file that is wrong
  (:class:`~accelplat.errors.ConfigurationError`, an unknown device index);
* **130** after Ctrl-C, **141** when standard output was closed early (``accelplat info |
  head -1``), as a shell reports a command ended by ``SIGINT``/``SIGPIPE``.

Under ``--json`` an error also prints one JSON object on standard output (the message still
goes to standard error)::

    {"schema": 1, "status": "error", "exit_status": 1,
     "error": {"type": "BackendError", "message": "...", "vendor_error": "NVMLError_GpuIsLost"}}
"""

from __future__ import annotations

import os
import sys
from typing import Any

from accelplat._cli._json import dumps
from accelplat._util import printable
from accelplat.errors import BackendError, ConfigurationError, DeviceNotFoundError

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "error_document",
    "exit_status",
    "fail",
    "silence_stdout",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def exit_status(exc: BaseException) -> int:
    """Return the exit status for an error that ended a sub-command.

    Args:
        exc: The error.

    Returns:
        ``2`` for bad usage or configuration (:class:`~accelplat.errors.ConfigurationError`,
        an unknown device); ``1`` for everything else (a backend failure, no platform, a
        failed check).
    """
    if isinstance(exc, (ConfigurationError, DeviceNotFoundError)):
        return EXIT_USAGE
    return EXIT_FAILED


def error_document(exc: BaseException, status: int | None = None) -> dict[str, Any]:
    """Return the JSON error object for ``exc`` (without the schema key; ``dumps`` adds it).

    Args:
        exc: The error.
        status: The exit status; ``None`` uses :func:`exit_status`.

    Returns:
        ``{"status": "error", "exit_status": N, "error": {"type", "message", …}}``, with
        ``vendor_error`` for backend errors and ``platform`` where the error names one.
    """
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, BackendError):
        error["vendor_error"] = exc.vendor_error
    platform = getattr(exc, "platform", None)
    if isinstance(platform, str):
        error["platform"] = platform
    return {
        "status": "error",
        "exit_status": exit_status(exc) if status is None else status,
        "error": error,
    }


def fail(exc: BaseException, *, command: str, json_output: bool) -> int:
    """Report ``exc`` as the end of ``command``: message on stderr, JSON on stdout if asked.

    Args:
        exc: The error.
        command: The sub-command, for the message (``"wait"``).
        json_output: Whether ``--json`` was given.

    Returns:
        The exit status (:func:`exit_status`).

    Side effects:
        Writes to standard error, and with ``json_output`` one line to standard output.
    """
    status = exit_status(exc)
    prefix = f"accelplat {command}" if command else "accelplat"
    print(f"{prefix}: error: {printable(exc, keep_newlines=True)}", file=sys.stderr)
    if json_output:
        print(dumps(error_document(exc, status)))
    return status


def silence_stdout() -> None:
    """Point standard output at ``/dev/null`` after its reader went away (``| head``).

    Python would otherwise report a ``BrokenPipeError`` when it flushes standard output at
    exit. Nothing more is printed there.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass
