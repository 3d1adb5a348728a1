"""How every sub-command speaks and ends: exit statuses, JSON, messages, signals (``docs/cli.md``).

0 success; 1 a check or wait that did not pass, or a runtime failure (no platform, a backend
error, a file or standard output that cannot be written); 2 bad usage or configuration; 130
after Ctrl-C; 141 when standard output was closed early. Every ``--json`` document starts with
``"schema"``; under ``--json`` an error also prints a JSON error object on standard output.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

from accelplat._util import printable, shorten
from accelplat.errors import BackendError, ConfigurationError, DeviceNotFoundError

if TYPE_CHECKING:  # the core loads when a command runs, not for --help or --version
    from accelplat._platform import Platform

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

_LONG_RUN = re.compile(r"\S{201,}")


def versioned(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``doc`` with ``"schema": SCHEMA_VERSION`` as its first key."""
    from accelplat._describe import SCHEMA_VERSION

    return {"schema": SCHEMA_VERSION, **{k: v for k, v in doc.items() if k != "schema"}}


def dumps(doc: Mapping[str, Any], *, indent: int | None = None) -> str:
    """Serialise ``doc`` versioned, as strict JSON (a NaN raises ``ValueError``)."""
    return json.dumps(versioned(doc), indent=indent, allow_nan=False)


def host_json(platform: Platform) -> dict[str, Any]:
    """Return ``{"platform", "hostname", "driver_version"}``, as gpustat's JSON names its host."""
    from accelplat._describe import driver_version

    return {
        "platform": platform.name,
        "hostname": socket.gethostname(),
        "driver_version": driver_version(platform),
    }


def time_json(timestamp: float, wall_time: float) -> dict[str, Any]:
    """Return a sample's moment: monotonic ``timestamp``, epoch ``wall_time``, ISO 8601 ``time``.

    ``timestamp`` orders the samples of one run (:func:`time.monotonic`; meaningless across
    processes or hosts); ``time`` is the wall-clock moment in local time with its UTC offset.
    """
    moment = datetime.datetime.fromtimestamp(wall_time, tz=datetime.timezone.utc).astimezone()
    return {
        "timestamp": timestamp,
        "wall_time": wall_time,
        "time": moment.isoformat(timespec="milliseconds"),
    }


def shown(text: object, *, keep_newlines: bool = False) -> str:
    """Return ``text`` for a terminal: escaped (``printable``), and shortened."""
    # A value echoed back can hold 100 KB: runs of 200+ non-blanks are cut (``shorten``), then a
    # text still over 4,000 characters to its first 2,000 and last 1,000.
    capped = _LONG_RUN.sub(lambda m: shorten(m.group()), str(text))
    if len(capped) > 4000:
        capped = f"{capped[:2000]}… ({len(capped)} characters) …{capped[-1000:]}"
    return printable(capped, keep_newlines=keep_newlines)


def exit_status(exc: BaseException) -> int:
    """Return 2 for bad usage or configuration (an unknown device too), 1 for anything else."""
    return EXIT_USAGE if isinstance(exc, (ConfigurationError, DeviceNotFoundError)) else EXIT_FAILED


def error_document(exc: BaseException) -> dict[str, Any]:
    """Return ``{"status": "error", "exit_status": N, "error": {"type", "message", …}}``."""
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, BackendError):
        error["vendor_error"] = exc.vendor_error
    platform = getattr(exc, "platform", None)
    if isinstance(platform, str):
        error["platform"] = platform
    return {"status": "error", "exit_status": exit_status(exc), "error": error}


def say(message: str) -> None:
    """Print ``message`` on standard error, where a failing standard error is no new error."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr)


def redraw(stream: IO[str], *lines: str) -> None:
    """Draw the first of ``lines`` that fits the terminal's width over its last line, in place.

    The last is cut to the width when none fits; no ``lines`` erases the line.
    """
    width = 0
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no terminal behind it
        width = os.get_terminal_size(stream.fileno()).columns  # 0: a terminal never sized
    width = (width or shutil.get_terminal_size().columns) - 1  # a full last column wraps
    line = next((line for line in lines if len(line) <= width), lines[-1] if lines else "")
    line = line if len(line) <= width else line[: max(0, width - 1)] + "…"
    with contextlib.suppress(OSError, ValueError):
        stream.write(f"\r\x1b[K{line}")
        stream.flush()


def fail(exc: BaseException, *, command: str, json_output: bool) -> int:
    """Report ``exc`` on stderr (and as JSON on stdout if asked); return the exit status."""
    prefix = f"accelplat {command}" if command else "accelplat"
    say(f"{prefix}: error: {shown(exc, keep_newlines=True)}")
    if json_output:
        print(dumps(error_document(exc)))
    return exit_status(exc)


@contextlib.contextmanager
def handling(signums: Iterable[int], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Run ``handler`` on each of ``signums`` inside the block, then put back what was there.

    Only the main thread may set handlers: elsewhere the block runs with the handlers it has.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.signal(signum, handler) for signum in signums} if main else {}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def in_foreground() -> bool:
    """Whether this process is in its terminal's foreground group: Ctrl-C reaches its children."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
    return False


class ClosedStdout(io.TextIOBase):
    """Standard output when descriptor 1 was closed (``>&-``): refuses the first write."""

    # Python sets sys.stdout to None then, and print drops everything: the answer would be lost.
    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def silence_stdout() -> None:
    """Point stdout at ``/dev/null`` after a failed write, or Python reports it again at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # stdout without a descriptor
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
