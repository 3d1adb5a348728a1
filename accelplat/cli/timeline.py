"""``accelplat record`` and ``accelplat report``: a memory timeline of any command.

``accelplat record --out trace.json -- COMMAND [ARG …]`` runs the command (directly, without a
shell), samples device memory while it runs, saves the trace and exits with the command's exit
status (``128 + N`` when the command was killed by signal ``N``, as shells report it; ``127`` when
it could not be started). ``accelplat report trace.json --out report.html`` renders the trace as
the same self-contained page the pytest plugin writes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from accelplat.errors import AccelplatError, ConfigurationError
from accelplat.leaks import parse_leak_tolerance
from accelplat.timeline.render import write_report
from accelplat.timeline.sampler import DEFAULT_HZ, Recorder, validate_grace, validate_hz
from accelplat.timeline.trace import (
    DEFAULT_LEAK_GRACE_S,
    DEFAULT_LEAK_TOLERANCE_BYTES,
    load_trace,
    save_trace,
)

__all__ = ["register", "run_record", "run_report"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``record`` and ``report`` sub-commands to ``sub``."""
    rec = sub.add_parser(
        "record",
        help="run a command while sampling device memory into a trace file",
        description="Run COMMAND (without a shell) while sampling used memory of every visible "
        "device; save the trace as JSON and exit with COMMAND's exit status. Render the trace "
        "with `accelplat report`. Creates no device context on context-free platforms.",
    )
    rec.add_argument("--out", required=True, metavar="TRACE.json", help="where to save the trace")
    rec.add_argument(
        "--hz",
        type=float,
        default=DEFAULT_HZ,
        metavar="N",
        help=f"samples per second (default {DEFAULT_HZ:g})",
    )
    rec.add_argument(
        "--html", metavar="REPORT.html", default=None, help="also render the report here"
    )
    rec.add_argument(
        "--leak-tolerance",
        metavar="SIZE",
        default=None,
        help="growth of used memory across the command that is not yet a leak (default 256MiB)",
    )
    rec.add_argument(
        "--leak-grace",
        type=float,
        default=DEFAULT_LEAK_GRACE_S,
        metavar="SECONDS",
        help="keep sampling up to this long after the command exits while memory is still held "
        f"(default {DEFAULT_LEAK_GRACE_S:g})",
    )
    rec.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run"
    )
    rec.set_defaults(func=run_record)

    rep = sub.add_parser(
        "report",
        help="render a trace file as a self-contained HTML timeline",
        description="Render a trace saved by `accelplat record` or by pytest's "
        "--accelplat-timeline-json as one self-contained HTML page.",
    )
    rep.add_argument("trace", metavar="TRACE.json", help="the trace to render")
    rep.add_argument("--out", required=True, metavar="REPORT.html", help="where to write the page")
    rep.add_argument("--title", default=None, help="page heading")
    rep.add_argument(
        "--leak-tolerance",
        metavar="SIZE",
        default=None,
        help="override the trace's leak tolerance, e.g. 256MiB",
    )
    rep.add_argument(
        "--leak-grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="override the trace's leak grace period",
    )
    rep.set_defaults(func=run_report)


def _tolerance(raw: str | None) -> int | None:
    return None if raw is None else parse_leak_tolerance(raw, argument="--leak-tolerance")


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_record(args: argparse.Namespace) -> int:
    """Run ``args.command`` while recording; return its exit status.

    Args:
        args: Parsed arguments: ``out``, ``hz``, ``html``, ``leak_tolerance``, ``leak_grace``,
            ``command``.

    Returns:
        The command's exit status (``128 + N`` for signal ``N``, ``127`` when it could not be
        started, ``130`` when interrupted).

    Raises:
        ConfigurationError: For a missing command, a bad rate, tolerance or grace period.

    Side effects:
        Starts the command as a child process; writes the trace (and the page with ``--html``),
        even when the command fails.
    """
    command: list[str] = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigurationError("accelplat record needs a command after `--`")
    hz = validate_hz(args.hz, argument="--hz")
    tolerance = _tolerance(args.leak_tolerance)
    grace = validate_grace(args.leak_grace, argument="--leak-grace")
    out = Path(args.out)
    for target in (out, Path(args.html) if args.html else None):
        if target is not None and not target.resolve().parent.is_dir():
            raise ConfigurationError(f"the directory of {os.fspath(target)!r} does not exist")
    from accelplat.registry import current_platform

    notes: list[str] = []
    try:
        platform = current_platform()
    except AccelplatError as exc:
        platform = None
        notes.append(f"No platform was sampled: {exc}")
    recorder = Recorder(
        platform,
        hz=hz,
        leak_tolerance_bytes=DEFAULT_LEAK_TOLERANCE_BYTES if tolerance is None else tolerance,
        leak_grace_s=grace,
        notes=notes,
    )
    label = " ".join(command)
    recorder.start()
    recorder.begin_test(label)
    status: int
    try:
        proc = subprocess.Popen(command)  # no shell: the arguments reach the command as given
    except OSError as exc:
        print(
            f"accelplat record: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr
        )
        recorder.add_note(f"The command could not be started: {exc.strerror or exc}")
        status = 127
    else:
        try:
            status = _exit_status(proc.wait())
        except KeyboardInterrupt:  # the child got the same SIGINT from the terminal
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            status = 130
    recorder.end_test(label, f"exit {status}")
    recorder.linger()
    recorder.stop()
    trace = recorder.trace(command=command, exit_code=status)
    written: list[str] = []
    try:
        written.append(str(save_trace(trace, out)))
        if args.html:
            written.append(str(write_report(trace, args.html)))
    except OSError as exc:
        print(f"accelplat record: cannot write the trace: {exc}", file=sys.stderr)
        return status or 1
    leaks = trace.leaks()
    print(
        f"accelplat record: {len(trace.samples)} samples of {len(trace.devices)} device(s) in "
        f"{trace.duration:.2f} s -> {', '.join(written)}"
        + (f"; {len(leaks)} device(s) left memory held" if leaks else ""),
        file=sys.stderr,
    )
    return status


def run_report(args: argparse.Namespace) -> int:
    """Render the trace ``args.trace`` to ``args.out``.

    Args:
        args: Parsed arguments: ``trace``, ``out``, ``title``, ``leak_tolerance``,
            ``leak_grace``.

    Returns:
        ``0``.

    Raises:
        ConfigurationError: For an unreadable, oversized or malformed trace, or a bad tolerance.
    """
    tolerance = _tolerance(args.leak_tolerance)
    grace = (
        None
        if args.leak_grace is None
        else validate_grace(args.leak_grace, argument="--leak-grace")
    )
    trace = load_trace(args.trace)
    try:
        path = write_report(
            trace, args.out, title=args.title, leak_tolerance_bytes=tolerance, leak_grace_s=grace
        )
    except OSError as exc:
        raise ConfigurationError(f"cannot write {os.fspath(args.out)!r}: {exc}") from None
    print(f"accelplat report: wrote {path}", file=sys.stderr)
    return 0
