"""``accelplat wait``: block until device memory is clear, settled or released, for scripts.

Exit 0 when every device reached its target; 1 when the timeout passed first (the devices that
missed and the processes holding their memory go to standard error) or the wait could not go
on; 2 for bad arguments. On a terminal, progress is one line of standard error.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from accelplat._cli._args import Size, add_common, count_arg, ratio_arg, seconds_arg
from accelplat._cli._errors import dumps, redraw, say
from accelplat._cli.stats import snapshot_to_json
from accelplat._util import format_bytes, printable
from accelplat.errors import ConfigurationError, MemoryNotSettledError

if TYPE_CHECKING:  # the core loads when the command runs
    from accelplat._platform import Platform
    from accelplat._types import SettleResult, UsageSnapshot


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``wait`` sub-command to ``sub``."""
    parser = sub.add_parser(
        "wait",
        help="wait until device memory is clear or settled (exit 0), else exit 1",
        description="Wait until used memory of each device is at or below a threshold (and, "
        "with a stability window, stays there). Exit 0 when clear, 1 on timeout (with the "
        "processes holding memory), 2 on bad input. With both thresholds, the larger target "
        "applies. Creates no device context.",
    )
    parser.set_defaults(func=_run)
    add = parser.add_argument
    ratio = "clear when used <= R x total (in [0, 1]; raised to the platform's idle floor)"
    add("--threshold-ratio", type=ratio_arg, metavar="R", help=ratio)
    size = "clear when used <= SIZE (e.g. 4GiB, 512MiB, 8GB, 0)"
    add("--threshold-bytes", action=Size, help=size)
    add("--tolerance", action=Size, help="movement that still counts as stable (default 512MiB)")
    for flag, text in (
        ("--timeout", "give up after S seconds (default: the platform's settle timeout)"),
        ("--stable", "usage must stay clear for S seconds (default: the platform's window)"),
    ):
        add(flag, type=seconds_arg(allow_zero=True), metavar="S", help=text)
    settle = "wait as the platform releases memory: its stability window on lazy platforms, "
    add("--settle", action="store_true", help=settle + "none on eager ones (default ratio 0.1)")
    add("--force", action="store_true", help="with --settle: use the window on eager platforms too")
    pid = count_arg(minimum=1, maximum=2**31 - 1, what="a process id (1..2147483647)")
    gone = "wait until process PID (and its descendants) holds no device memory or is gone; "
    gone += "repeatable; no threshold"
    add("--pid", dest="pids", action="append", type=pid, metavar="PID", help=gone)
    add_common(parser, devices=True, quiet=True, json="print the outcome as JSON on stdout")


class Progress:
    """One progress line redrawn in place when ``enabled`` (a terminal, no ``--quiet``).

    The line fits the terminal's width, so that it stays one row: where each device's usage and
    target do not fit (eight GPUs at 80 columns), it counts the devices clear and names the others.
    """

    def __init__(self, stream: IO[str], *, enabled: bool, min_interval_s: float = 0.1) -> None:
        self._stream = stream
        self._enabled = enabled
        self._min_interval_s = min_interval_s
        self._last_draw = -math.inf
        self._first: float | None = None

    def __call__(self, snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        """Record one sample (an ``on_poll`` callback); redraw when enough real time passed."""
        if self._first is None:
            self._first = snap.timestamp
        now = time.monotonic()
        if not self._enabled or now - self._last_draw < self._min_interval_s:
            return
        self._last_draw = now
        head = f"waiting {snap.timestamp - self._first:6.1f} s: "
        used = {device: info.used for device, info in sorted(snap.memory.items())}
        waiting = {d: n for d, n in used.items() if n > targets.get(d, -1)}
        parts = ", ".join(
            f"{d}={format_bytes(n)} (<= {format_bytes(targets.get(d))} "
            f"{'wait' if d in waiting else 'ok'})"
            for d, n in used.items()
        )
        indices, most = ",".join(map(str, waiting)), format_bytes(max(waiting.values(), default=0))
        short = f"{head}{len(used) - len(waiting)} of {len(used)} clear; waiting for "
        redraw(self._stream, head + parts, f"{short}{indices}: up to {most}")

    def finish(self) -> None:
        """Erase the line, so that what follows starts on a clean one."""
        if self._last_draw > -math.inf:
            redraw(self._stream)
            self._last_draw = -math.inf


def _outcome_json(
    outcome: SettleResult | MemoryNotSettledError, platform: Platform, pids: Sequence[int] = ()
) -> dict[str, Any]:
    """Return the document ``wait --json`` prints (``docs/json.md``).

    The last reading, as ``stats --json`` shows one, each device with its target. A wait on
    ``pids`` has no usage threshold: its devices have no target, and a device is clear when the
    wait ended clear or none of ``pids`` is listed among its holders.
    """
    devices = {d.index: d for d in platform.devices()}
    doc = snapshot_to_json(platform, outcome.snapshot, devices, holders=True)
    done = not isinstance(outcome, MemoryNotSettledError)
    for entry in doc["devices"]:
        entry["target"] = target = None if pids else outcome.targets.get(entry["index"])
        entry["cleared"] = target is not None and entry["used"] <= target
        if pids:  # the wait's target was the processes' own memory, not the device's usage
            holders = entry["holders"]
            gone = holders is not None and not any(h["pid"] in pids for h in holders)
            entry["cleared"] = done or gone
    doc = {"status": "clear", **doc, "waited_s": outcome.waited_s}
    if isinstance(outcome, MemoryNotSettledError):
        return doc | {"status": "timeout", "error": str(outcome)}
    return doc | {"polls": outcome.polls, "already_settled": outcome.already_settled}


def _wait(args: argparse.Namespace, progress: Progress, platform: Platform) -> SettleResult:
    """Wait as ``args`` ask; the progress line is finished however it ends (Ctrl-C too)."""
    from accelplat import _memory

    common = {"platform": platform, "devices": args.devices, "timeout_s": args.timeout}
    try:
        if args.pids:  # no on_poll: its targets are no usage levels to draw
            return _memory.wait_for_release(args.pids, **common)
        if args.settle:  # whole devices: the engines a script started are not our children
            ratio = 0.1 if args.threshold_ratio is None else args.threshold_ratio
            return _memory.wait_for_memory_to_settle(
                threshold_ratio=ratio, force=args.force, owners="all", on_poll=progress, **common
            )
        if args.tolerance is not None:
            common["stable_tolerance_bytes"] = args.tolerance
        return _memory.wait_for_memory_to_clear(
            threshold_bytes=args.threshold_bytes,
            threshold_ratio=args.threshold_ratio,
            stable_duration_s=args.stable,
            on_poll=progress,
            **common,
        )
    finally:  # the shell's prompt, or the message that follows, starts on a clean line
        progress.finish()


_SETTLE_TAKES_NO = {
    "threshold_bytes": "--settle takes --threshold-ratio only; for a byte threshold use "
    "--threshold-bytes SIZE with --stable S",
    "stable": "--settle uses the platform's stability window; drop --stable or --settle",
    "tolerance": "--settle uses the default tolerance; drop --tolerance or --settle",
}


def _run(args: argparse.Namespace) -> int:
    given = [n for n in ("threshold_ratio", *_SETTLE_TAKES_NO) if getattr(args, n) is not None]
    if args.settle and (taken := [n for n in given if n in _SETTLE_TAKES_NO]):
        raise ConfigurationError(_SETTLE_TAKES_NO[taken[0]])
    if args.pids and (args.settle or args.force or given):
        raise ConfigurationError(
            "--pid waits for those processes' memory: it takes no threshold, --stable, "
            "--tolerance, --settle or --force"
        )
    if args.force and not args.settle:
        raise ConfigurationError("--force only applies with --settle")
    if not (args.settle or args.pids or {"threshold_ratio", "threshold_bytes"} & {*given}):
        raise ConfigurationError(
            "give --threshold-ratio R or --threshold-bytes SIZE (or --settle, or --pid PID)"
        )
    from accelplat._registry import current_platform

    drawn = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"  # a log gets no redraws
    progress = Progress(sys.stderr, enabled=drawn and not args.quiet)
    platform = current_platform()
    outcome: SettleResult | MemoryNotSettledError
    try:
        outcome = _wait(args, progress, platform)
    except MemoryNotSettledError as exc:
        say(f"accelplat wait: {printable(exc, keep_newlines=True)}")
        outcome = exc
    if args.json:
        print(dumps(_outcome_json(outcome, platform, args.pids or ())))
    elif not args.quiet and not isinstance(outcome, MemoryNotSettledError):
        how = (
            "already clear" if outcome.already_settled else f"clear after {outcome.waited_s:.2f} s"
        )
        detail = f"({outcome.polls} poll(s)): {outcome.snapshot.describe()}"
        print(f"accelplat wait: {how} {detail}", file=sys.stderr)
    return 1 if isinstance(outcome, MemoryNotSettledError) else 0
