"""``accelplat record`` and ``accelplat report``: a memory timeline of any command.

``record`` runs COMMAND (no shell) while sampling memory and exits with its status (``128 + N``
after signal ``N``, 127 when it could not start). SIGINT, SIGTERM, SIGHUP and SIGQUIT are
forwarded (the keyboard's not again when the terminal signalled the group), then escalated after
``--kill-after``; COMMAND is always reaped, the trace kept, marked partial. ``report`` renders it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from accelplat._cli._args import output_option, path
from accelplat._cli._errors import handling, in_foreground
from accelplat.errors import AccelplatError, ConfigurationError
from accelplat.timeline._defaults import DEFAULT_HZ, DEFAULT_LEAK_GRACE_S

if TYPE_CHECKING:  # the recorder and the renderer load when a command runs, not for --help
    from accelplat._leaks import Holdings
    from accelplat.timeline._sampler import Recorder
    from accelplat.timeline._trace import Trace

DEFAULT_KILL_AFTER_S = 5.0  # seconds to exit after a forwarded signal, then SIGTERM, SIGKILL
_CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_KEYBOARD = (signal.SIGINT, signal.SIGQUIT)  # Ctrl-C, Ctrl-\: the terminal signals the group


class _StopLingeringError(Exception):
    """Ends the leak grace period early (a signal arrived after the command finished)."""


class _Signals:
    """Catches the signals that would end ``record``: the handler notes and forwards them only.

    The main thread waits, escalates and saves the trace, so a signal never interrupts the saving.
    """

    def __init__(self, kill_after: float) -> None:
        self.received: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.child_done = False
        self.during = False  # whether a signal arrived before the command was reaped
        self._early: list[int] = []
        self._kill_after = kill_after
        self._deadline = math.inf
        self._stage = 0

    def attach(self, proc: subprocess.Popen[bytes]) -> None:
        """Note the started command; forward what arrived while it was starting."""
        # Handlers run on the main thread between these steps: each signal is forwarded once.
        self.proc = proc
        while self._early:
            self._forward(proc, self._early.pop(0), early=True)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        proc = self.proc
        if proc is None:
            self.during = True
            self._early.append(signum)  # the command is starting: attach() forwards it
        elif not self.child_done and proc.poll() is None:  # else the main thread stops lingering
            self.during = True
            self._forward(proc, signum, early=False)

    def _forward(self, proc: subprocess.Popen[bytes], signum: int, *, early: bool) -> None:
        if signum == signal.SIGINT and self.received.count(signal.SIGINT) >= 2:
            proc.kill()  # a second Ctrl-C: no more waiting
            return
        self._deadline = min(self._deadline, time.monotonic() + self._kill_after)
        if signum in _KEYBOARD and not early and in_foreground():
            return  # the terminal sent it to the child's process group already
        proc.send_signal(signum)

    def reap(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for ``proc``; terminate, then kill, it if it outlives its grace after a signal."""
        while True:
            try:
                return proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                if time.monotonic() >= self._deadline:
                    proc.send_signal(signal.SIGKILL if self._stage else signal.SIGTERM)
                    self._stage += 1
                    self._deadline = time.monotonic() + self._kill_after

    def sleep(self, seconds: float) -> None:
        """Sleep between lingering samples; stop lingering once a signal has arrived."""
        if self.received:
            raise _StopLingeringError
        time.sleep(seconds)
        if self.received:
            raise _StopLingeringError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``record`` and ``report`` sub-commands to ``sub``."""
    rec = sub.add_parser(
        "record",
        help="run a command while sampling device memory into a trace file",
        description="Run COMMAND (without a shell) while sampling used memory of every visible "
        "device; save the trace as JSON and exit with COMMAND's exit status. Render the trace "
        "with `accelplat report`. Creates no device context on context-free platforms.",
    )
    rec.set_defaults(func=run_record)
    output_option(rec, "--out", required=True, metavar="TRACE.json", help="trace to write")
    hz = f"samples per second (default {DEFAULT_HZ:g})"
    rec.add_argument("--hz", type=float, default=DEFAULT_HZ, metavar="N", help=hz)
    output_option(rec, "--html", metavar="REPORT.html", help="also render the report here")
    tolerance = "growth of used memory across the command that is not yet a leak (default 256MiB)"
    rec.add_argument("--leak-tolerance", metavar="SIZE", help=tolerance)
    grace = "keep sampling up to this long after the command exits while memory is still held"
    for flag, default, text in (
        ("--leak-grace", DEFAULT_LEAK_GRACE_S, grace),
        ("--kill-after", DEFAULT_KILL_AFTER_S, "after forwarding a signal, how long the command "
         "may take to exit before it is sent SIGTERM, then SIGKILL"),
    ):  # fmt: skip
        help_text = f"{text} (default {default:g})"
        rec.add_argument(flag, type=float, default=default, metavar="SECONDS", help=help_text)
    rec.add_argument(  # not dest "command": that names the sub-command (errors' prefix)
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run"
    )

    rep = sub.add_parser(
        "report",
        help="render a trace file as a self-contained HTML timeline (or a Chrome trace)",
        description="Render a trace saved by `accelplat record` or by pytest's "
        "--accelplat-timeline-json as one self-contained HTML page, and/or as Chrome "
        "trace-event JSON for Perfetto or chrome://tracing.",
    )
    rep.set_defaults(func=run_report)
    path(rep.add_argument("trace", metavar="TRACE.json", help="the trace to render"))
    output_option(rep, "--out", metavar="REPORT.html", help="page to write")
    chrome = "also (or only) write Chrome trace-event JSON: memory counters, test and wait "
    chrome += "slices, for ui.perfetto.dev or chrome://tracing"
    output_option(rep, "--chrome-trace", metavar="OUT.json", help=chrome)
    rep.add_argument("--title", metavar="TEXT", help="page heading")
    tolerance = "override the trace's leak tolerance: 256MiB"
    rep.add_argument("--leak-tolerance", metavar="SIZE", help=tolerance)
    grace = "override the trace's leak grace period"
    rep.add_argument("--leak-grace", type=float, metavar="SECONDS", help=grace)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The leak rule's options given (a trace's own keys): each checked, named by its option."""
    from accelplat._leaks import parse_leak_tolerance
    from accelplat.timeline._sampler import validate_grace

    given: dict[str, Any] = {}
    if args.leak_tolerance is not None:
        tolerance = parse_leak_tolerance(args.leak_tolerance, argument="--leak-tolerance")
        given["leak_tolerance_bytes"] = tolerance
    if args.leak_grace is not None:
        given["leak_grace_s"] = validate_grace(args.leak_grace, argument="--leak-grace")
    return given


def run_record(args: argparse.Namespace) -> int:
    """Run ``args.command`` while recording; write the trace (and ``--html``) even on failure."""
    from accelplat._vendor import procs
    from accelplat.timeline._sampler import Recorder, validate_grace, validate_hz
    from accelplat.timeline._trace import SpanOwners, clip

    argv: list[str] = args.argv[1:] if args.argv[:1] == ["--"] else list(args.argv)
    if not argv:
        raise ConfigurationError("needs a command after `--`")
    hz = validate_hz(args.hz, argument="--hz")
    leak_rule = _overrides(args)  # --leak-grace has a default: always given
    signals = _Signals(validate_grace(args.kill_after, argument="--kill-after"))
    for target in filter(None, (args.out, args.html)):
        if not Path(target).resolve().parent.is_dir():
            raise ConfigurationError(f"the directory of {target!r} does not exist")
    recorder = Recorder.of_current_platform(hz=hz, **leak_rule)
    label = clip(" ".join(argv))
    with handling(_CAUGHT, signals._handle):
        recorder.start()
        before = _holdings(recorder)
        recorder.begin_test(label)
        try:
            proc = subprocess.Popen(argv)  # no shell: the arguments reach it as given
        except OSError as exc:
            why = exc.strerror or exc
            print(f"accelplat record: cannot run {argv[0]!r}: {why}", file=sys.stderr)
            recorder.add_note(f"The command could not be started: {why}")
            status = 127
        else:
            procs.remember({proc.pid})  # its memory is the command's even after it exits
            signals.attach(proc)
            code = signals.reap(proc)
            status = 128 - code if code < 0 else code
            signals.child_done = True
        recorder.end_test(label, f"exit {status}")
        if not signals.during:
            with contextlib.suppress(_StopLingeringError):
                recorder.linger(sleep=signals.sleep)
        recorder.stop()
        after = _holdings(recorder)
        trace = recorder.trace(command=argv, exit_code=status)
        if before and after:  # the command's span, judged by owner
            owners = tuple(SpanOwners(d, before[d], after[d]) for d in sorted(before) if d in after)
            trace = replace(trace, tests=(replace(trace.tests[0], owners=owners),))
        if signals.received:
            names = ", ".join(dict.fromkeys(signal.Signals(s).name for s in signals.received))
            when = "while the command ran" if signals.during else "after the command finished"
            cut = "" if signals.during else "; the leak grace period was cut short"
            note = f"Partial recording: {names} arrived {when}{cut}."
            trace = replace(trace, partial=True, notes=(*trace.notes, note))
            status = 128 + signals.received[0]
        return _save(trace, Path(args.out), args.html, status)


def _holdings(recorder: Recorder) -> dict[int, Holdings]:
    """What each device holds now, by owner (the command is a child): {} if it cannot be read."""
    from accelplat._leaks import current_holdings

    if recorder.platform is not None:
        with contextlib.suppress(AccelplatError):
            return current_holdings(recorder.platform)
    return {}


def _save(trace: Trace, out: Path, html_path: str | None, status: int) -> int:
    from accelplat.timeline._render import write_report
    from accelplat.timeline._trace import save_trace

    written: list[str] = []
    try:
        written.append(str(save_trace(trace, out)))
        if html_path:
            written.append(str(write_report(trace, html_path)))
    except OSError as exc:
        print(f"accelplat record: cannot write the trace: {exc}", file=sys.stderr)
        return status or 1
    leaks = trace.leaks()
    held = f"; {len(leaks)} device(s) left memory held" if leaks else ""
    what = f"{len(trace.samples)} samples of {len(trace.devices)} device(s)"
    done = f"{what} in {trace.duration:.2f} s -> {', '.join(written)}{held}"
    print(f"accelplat record: {done}", file=sys.stderr)
    return status


def run_report(args: argparse.Namespace) -> int:
    """Render the trace ``args.trace`` to ``args.out``; return 0, or 1 when it cannot be written."""
    if args.out is None and args.chrome_trace is None:
        raise ConfigurationError("needs --out REPORT.html or --chrome-trace OUT.json (or both)")
    from accelplat.timeline._render import write_report
    from accelplat.timeline._trace import load_trace

    overrides = _overrides(args)
    trace = replace(load_trace(args.trace), **overrides)  # the Chrome trace's too
    pages: list[tuple[str, Literal["html", "chrome"]]] = [(args.out, "html")] * bool(args.out)
    pages += [(args.chrome_trace, "chrome")] * bool(args.chrome_trace)
    for target, kind in pages:
        try:
            written = write_report(trace, target, title=args.title, format=kind)
        except OSError as exc:  # a runtime failure, not bad usage
            print(f"accelplat report: error: cannot write {target!r}: {exc}", file=sys.stderr)
            return 1
        print(f"accelplat report: wrote {written}", file=sys.stderr)
    return 0
