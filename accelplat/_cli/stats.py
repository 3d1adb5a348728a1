"""``accelplat stats``: used, free, total and reserved memory of every visible device.

Prints one table (``--json``: one JSON object), or with ``--watch SECONDS`` refreshes it until
interrupted (Ctrl-C or ``q``) or ``--count`` refreshes were shown. On a terminal the output is
the live view of :mod:`accelplat._cli._live` (header, memory bars, holders on ``h`` or with
``--holders``), redrawn in place; ``NO_COLOR`` keeps the view and drops the colour. Output is
plain text when standard output is not a terminal, when ``TERM=dumb``, or when ``rich`` is not
installed; ``--json`` prints one JSON object per refresh (NDJSON). Reads memory through the
platform's context-free queries: creates no device context, imports no framework.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

from accelplat._cli._args import count_arg, parse_devices, seconds_arg
from accelplat._cli._json import dumps
from accelplat._memory import default_clock, snapshot
from accelplat._platform import Platform
from accelplat._registry import current_platform
from accelplat._usage import UsageSnapshot
from accelplat._util import format_bytes, printable
from accelplat.errors import ConfigurationError

__all__ = ["register", "snapshot_to_json", "use_rich"]

_COLUMNS = ("DEV", "NAME", "USED", "FREE", "TOTAL", "RESERVED", "USE%", "SOURCE")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stats`` sub-command to ``sub``."""
    parser = sub.add_parser(
        "stats",
        help="show used/free/total device memory, once or refreshing",
        description="Show used, free, total and reserved memory of each visible device, as the "
        "platform's context-free query reports it. Creates no device context.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (one object per refresh)")
    parser.add_argument(
        "--watch",
        type=seconds_arg(allow_zero=False),
        metavar="SECONDS",
        help="refresh every SECONDS until interrupted (or --count refreshes)",
    )
    parser.add_argument(
        "--count",
        type=count_arg(minimum=1, what="a whole number >= 1"),
        metavar="N",
        help="with --watch: stop after N refreshes",
    )
    parser.add_argument(
        "--devices",
        type=parse_devices,
        metavar="LIST",
        help="comma-separated visible device indices (default: all)",
    )
    parser.add_argument(
        "--holders",
        action="store_true",
        help="also list the processes holding memory, where the platform can tell",
    )
    parser.set_defaults(func=_run)


def use_rich(stream: IO[str]) -> bool:
    """Return whether to draw the live view: a terminal that is not ``TERM=dumb``, ``rich``.

    ``NO_COLOR`` does not matter here: the view is drawn without colour then.
    """
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def snapshot_to_json(
    platform: Platform, snap: UsageSnapshot, names: dict[int, str], *, holders: bool
) -> dict[str, Any]:
    """Return the JSON document ``accelplat stats --json`` prints for one sample.

    Keys: ``platform``, ``timestamp``, ``wall_time`` and ``devices`` (a list of objects with
    ``index``, ``name``, ``used``, ``free``, ``total``, ``reserved`` in bytes, ``used_ratio``,
    ``source`` and, with ``holders``, ``holders``: a list of ``{pid, used_bytes, state, name}``
    or ``null`` when the platform cannot tell).
    """
    devices: list[dict[str, Any]] = []
    for index, info in sorted(snap.memory.items()):
        entry: dict[str, Any] = {
            "index": index,
            "name": names.get(index, ""),
            "used": info.used,
            "free": info.free,
            "total": info.total,
            "reserved": info.reserved,
            "used_ratio": info.used_ratio,
            "source": info.source,
        }
        if holders:
            held = snap.holders.get(index)
            entry["holders"] = (
                None
                if held is None
                else [
                    {
                        "pid": h.pid,
                        "used_bytes": h.used_bytes,
                        "state": h.state.value,
                        "name": h.name,
                    }
                    for h in held
                ]
            )
        devices.append(entry)
    return {
        "platform": platform.name,
        "timestamp": snap.timestamp,
        "wall_time": snap.wall_time,
        "devices": devices,
    }


def _rows(snap: UsageSnapshot, names: dict[int, str]) -> list[tuple[str, ...]]:
    return [
        (
            str(index),
            names.get(index, ""),
            format_bytes(info.used),
            format_bytes(info.free),
            format_bytes(info.total),
            format_bytes(info.reserved),
            f"{100 * info.used_ratio:.1f}%",
            info.source,
        )
        for index, info in sorted(snap.memory.items())
    ]


def _holder_lines(snap: UsageSnapshot) -> list[str]:
    lines: list[str] = []
    for index in sorted(snap.memory):
        held = snap.holders.get(index)
        if held is None:
            lines.append(f"device {index}: holders unknown (the platform cannot tell)")
        elif not held:
            lines.append(f"device {index}: no process holds memory")
        for h in held or ():
            label = f" {printable(h.name)}" if h.name else ""
            lines.append(
                f"device {index}: pid {h.pid}{label} ({h.state.value}) {format_bytes(h.used_bytes)}"
            )
    return lines


def _plain(platform: Platform, snap: UsageSnapshot, names: dict[int, str], holders: bool) -> str:
    rows = [_COLUMNS, *_rows(snap, names)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    numeric = {2, 3, 4, 5, 6}
    lines = [f"platform: {platform.name} ({len(snap.memory)} device(s))"]
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in numeric and row is not rows[0] else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    if holders:
        lines.extend(_holder_lines(snap))
    return "\n".join(lines)


def _samples(
    platform: Platform,
    devices: Sequence[int] | None,
    *,
    holders: bool,
    watch: float | None,
    count: int | None,
) -> Iterator[UsageSnapshot]:
    clock = default_clock(platform)
    shown = 0
    while True:
        yield snapshot(devices, platform=platform, holders=holders)
        shown += 1
        if watch is None or (count is not None and shown >= count):
            return
        clock.sleep(watch)


def _run(args: argparse.Namespace) -> int:
    if args.count is not None and args.watch is None and args.count != 1:
        raise ConfigurationError("--count needs --watch SECONDS")
    platform = current_platform()
    names = {d.index: d.name for d in platform.devices()}
    shown = {i: printable(n) for i, n in names.items()}  # for a terminal: escapes escaped
    snapshot(args.devices, platform=platform, holders=False)  # check the devices first
    samples = _samples(
        platform, args.devices, holders=args.holders, watch=args.watch, count=args.count
    )
    out = sys.stdout
    try:
        if args.json:
            for snap in samples:
                doc = snapshot_to_json(platform, snap, names, holders=args.holders)
                out.write(dumps(doc) + "\n")
                out.flush()
        elif use_rich(out):
            _show_rich(
                platform,
                args.devices,
                shown,
                holders=args.holders,
                watch=args.watch,
                count=args.count,
            )
        else:
            for i, snap in enumerate(samples):
                if i:
                    out.write("\n")
                out.write(_plain(platform, snap, shown, args.holders) + "\n")
                out.flush()
    except KeyboardInterrupt:  # the normal way to end --watch
        return 0
    return 0


def _show_rich(
    platform: Platform,
    devices: Sequence[int] | None,
    names: dict[int, str],
    *,
    holders: bool,
    watch: float | None,
    count: int | None,
) -> None:
    from rich.console import Console
    from rich.live import Live

    from accelplat._cli._live import Keys, ViewState, render
    from accelplat._vendor.procs import process_details

    console = Console(no_color=bool(os.environ.get("NO_COLOR")) or None)
    state = ViewState(holders=holders)

    def frame() -> Any:
        snap = snapshot(devices, platform=platform, holders=state.holders)
        return render(
            platform.name, snap, names, state=state, interval=watch, details=process_details
        )

    if watch is None:
        console.print(frame())
        return
    clock = default_clock(platform)
    with (
        Keys(sleep=clock.sleep) as keys,
        Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False) as view,
    ):
        shown = 0
        while not state.quit:
            view.update(frame(), refresh=True)
            shown += 1
            if count is not None and shown >= count:
                break
            keys.wait(watch, state)
