"""``accelplat stats``: used, free, total and reserved memory of every visible device.

One table, or with ``--watch SECONDS`` one per refresh. On a terminal the table is the live
view, drawn with ``rich`` (the ``cli`` extra): a header, a bar per device coloured by how full it
is, holders on ``h`` or with ``--holders``, ``q`` to quit. ``--no-color`` or ``NO_COLOR`` drops
the colour; off a terminal (or with ``TERM=dumb``) it is plain text unless ``--color`` or
``FORCE_COLOR`` asks for colour; ``--json`` prints one object per refresh.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from typing_extensions import Self

from accelplat._cli._args import add_common, color, color_options, command, count_arg, seconds_arg
from accelplat._cli._errors import dumps, holder_json, host_json, time_json
from accelplat._memory import default_clock, snapshot
from accelplat._platform import Platform
from accelplat._registry import current_platform
from accelplat._types import UsageSnapshot
from accelplat._util import format_bytes, printable
from accelplat.errors import ConfigurationError

_COLUMNS = ("DEV", "NAME", "USED", "FREE", "TOTAL", "RESERVED", "USE%", "SOURCE")
BAR_WIDTH = 30
NO_RICH = "the live view needs rich: pip install 'accelplat[cli]'"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stats`` sub-command to ``sub``."""
    parser = command(
        sub,
        "stats",
        _run,
        help="show used/free/total device memory, once or refreshing",
        description="Show used, free, total and reserved memory of each visible device, as the "
        "platform's context-free query reports it. Creates no device context.",
    )
    add_common(parser, json="print JSON (one object per refresh)", devices=True)
    color_options(parser)
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
        "--holders",
        action="store_true",
        help="also list the processes holding memory, where the platform can tell",
    )


def use_rich(stream: IO[str], *, watch: bool = False, colour: bool | None = None) -> bool:
    """Whether to draw the live view: a terminal but ``TERM=dumb``, and ``rich`` (for ``watch``).

    ``colour=True`` (``--color``, ``FORCE_COLOR``) draws it anywhere, a pipe too.
    """
    if colour is not True and (os.environ.get("TERM") == "dumb" or not stream.isatty()):
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        if watch:
            raise ConfigurationError(NO_RICH) from None
        return False
    return True


def snapshot_to_json(
    platform: Platform,
    snap: UsageSnapshot,
    names: dict[int, str],
    *,
    holders: bool,
    host: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the document ``accelplat stats --json`` prints for one sample (``docs/json.md``).

    ``host`` is :func:`host_json`'s answer, asked once per run (``None``: asked now).
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
            entry["holders"] = None if held is None else [holder_json(h) for h in held]
        devices.append(entry)
    return {
        **(host_json(platform) if host is None else host),
        **time_json(snap.timestamp, snap.wall_time),
        "devices": devices,
    }


def _plain(platform: Platform, snap: UsageSnapshot, names: dict[int, str], holders: bool) -> str:
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for index, m in sorted(snap.memory.items()):
        sizes = (format_bytes(n) for n in (m.used, m.free, m.total, m.reserved))
        use = f"{100 * m.used_ratio:.1f}%"
        rows.append((str(index), names.get(index, ""), *sizes, use, m.source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = [f"platform: {platform.name} ({len(snap.memory)} device(s))"]
    for n, row in enumerate(rows):
        cells = [
            c.rjust(w) if n and 2 <= i <= 6 else c.ljust(w)  # numbers right, but not the header
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    for index in sorted(snap.memory) if holders else ():
        held = snap.holders.get(index)
        if held is None:
            lines.append(f"device {index}: holders unknown (the platform cannot tell)")
        elif not held:
            lines.append(f"device {index}: no process holds memory")
        for h in held or ():
            label = f" {printable(h.name)}" if h.name else ""
            used = format_bytes(h.used_bytes)
            lines.append(f"device {index}: pid {h.pid}{label} ({h.state.value}) {used}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    if args.count is not None and args.watch is None and args.count != 1:
        raise ConfigurationError("--count needs --watch SECONDS")
    platform = current_platform()
    names = {d.index: d.name for d in platform.devices()}
    shown = {i: printable(n) for i, n in names.items()}  # for a terminal: escapes escaped
    snapshot(args.devices, platform=platform, holders=False)  # check the devices first
    out = sys.stdout
    colour = color(args.color)
    live = not args.json and use_rich(out, watch=args.watch is not None, colour=colour)
    clock = default_clock(platform)
    state = ViewState(holders=args.holders)
    host: dict[str, Any] | None
    try:
        with contextlib.suppress(KeyboardInterrupt), contextlib.ExitStack() as stack:  # Ctrl-C
            if live and args.watch:  # SIGTERM, SIGHUP: end as Ctrl-C does, terminal restored
                stack.enter_context(_ended_by(signal.SIGTERM, signal.SIGHUP))  # undone last
            keys = stack.enter_context(Keys(sleep=clock.sleep)) if live and args.watch else None
            draw = (
                _live_view(stack, platform.name, shown, state, args.watch, colour=colour)
                if live
                else None
            )
            n, host = 0, None  # host: host_json(), asked once per run
            while not state.quit:
                snap = snapshot(args.devices, platform=platform, holders=state.holders)
                if draw is not None:
                    draw(snap)
                elif args.json:
                    host = host or host_json(platform)
                    doc = snapshot_to_json(platform, snap, names, holders=state.holders, host=host)
                    out.write(dumps(doc) + "\n")
                else:
                    out.write(("\n" if n else "") + _plain(platform, snap, shown, state.holders))
                    out.write("\n")
                out.flush()
                n += 1
                if args.watch is None or (args.count is not None and n >= args.count):
                    break
                if keys is not None:
                    keys.wait(args.watch, state)
                else:
                    clock.sleep(args.watch)
    except _EndedError as ended:
        return 128 + ended.signum
    return 0


class _EndedError(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _ended_by(*signums: int) -> Iterator[None]:
    """Raise :class:`_EndedError` on any of ``signums``, ignoring repeats while it unwinds."""

    def end(signum: int, frame: FrameType | None) -> None:
        for other in signums:
            signal.signal(other, signal.SIG_IGN)
        raise _EndedError(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers
        return
    previous = {signum: signal.signal(signum, end) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _live_view(
    stack: contextlib.ExitStack[Any],
    platform: str,
    names: dict[int, str],
    state: ViewState,
    watch: float | None,
    *,
    colour: bool | None = None,
) -> Callable[[UsageSnapshot], None]:
    from rich.console import Console
    from rich.live import Live

    from accelplat._vendor.procs import process_details

    # colour() read NO_COLOR and FORCE_COLOR already; rich would read them again over a flag.
    console = Console(no_color=colour is False, force_terminal=colour or None)

    def frame(snap: UsageSnapshot) -> Any:
        return render(platform, snap, names, state=state, interval=watch, details=process_details)

    if watch is None or not sys.stdout.isatty():  # a forced colour in a pipe: frame by frame
        return lambda snap: console.print(frame(snap))
    live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False)
    view = stack.enter_context(live)
    return lambda snap: view.update(frame(snap), refresh=True)


@dataclass
class ViewState:
    """What the viewer chose with the keys: holder rows shown (and sampled), ``q`` pressed."""

    holders: bool = False
    quit: bool = False


def colour_for(ratio: float) -> str:
    """Return the bar colour for a used fraction: green, yellow from 50 %, red from 80 %."""
    return "red" if ratio >= 0.8 else "yellow" if ratio >= 0.5 else "green"


def bar(ratio: float, width: int = BAR_WIDTH) -> str:
    """Return a bar of ``width`` cells: any use shows one full cell, only a full device all."""
    ratio = min(1.0, max(0.0, ratio))
    cells = round(ratio * width)
    if ratio > 0 and cells == 0:
        cells = 1
    if ratio < 1 and cells == width:
        cells = width - 1
    return "█" * cells + "░" * (width - cells)


def render(
    platform: str,
    snap: UsageSnapshot,
    names: Mapping[int, str],
    *,
    state: ViewState,
    interval: float | None,
    details: Callable[[int], tuple[str, str]],
    host: str | None = None,
    now: float | None = None,
) -> Any:
    """Build one frame of the live view (``interval=None``: one frame, no key hints)."""
    from rich.console import Group, JustifyMethod
    from rich.table import Table
    from rich.text import Text

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() if now is None else now))
    header = Text()
    header.append("accelplat stats", style="bold")
    header.append(f"  host {socket.gethostname() if host is None else host}  {stamp}  ")
    header.append(f"platform {platform}", style="bold cyan")
    header.append(f" · {len(snap.memory)} device(s)")
    if interval is not None:
        header.append(f" · every {interval:g} s", style="dim")
        header.append("   [h] holders  [q] quit  [Ctrl-C] exit", style="dim")

    def table(*columns: str) -> Table:
        out = Table(box=None, pad_edge=False, header_style="bold", expand=False)
        for spec in columns:  # "NAME", ">NAME" right-justified, "NAME:28" at most 28 wide
            name, _, width = spec.lstrip(">").partition(":")
            justify: JustifyMethod = "right" if spec.startswith(">") else "left"
            limit = int(width) if width else None
            out.add_column(
                name, justify=justify, no_wrap=True, overflow="ellipsis", max_width=limit
            )
        return out

    devices = table(">DEV", "NAME:28", "MEMORY", ">USED / TOTAL", ">USE%", ">FREE", "SOURCE:24")
    for index, info in sorted(snap.memory.items()):
        ratio = info.used_ratio
        colour = colour_for(ratio)
        devices.add_row(
            str(index),
            Text(names.get(index, "")),
            Text(bar(ratio), style=colour),
            f"{format_bytes(info.used)} / {format_bytes(info.total)}",
            Text(f"{100 * ratio:.1f}%", style=colour),
            format_bytes(info.free),
            Text(info.source, style="dim"),
        )
    parts: list[Any] = [header, Text(""), devices]
    if state.holders:
        rows = table(">DEV", ">PID", "USER:16", "COMMAND:60", ">MEMORY", "STATE")
        for index in sorted(snap.memory):
            held = snap.holders.get(index)
            cells = []
            if not held:
                unknown = "the platform cannot tell who holds memory"
                note = unknown if held is None else "no process holds memory"
                cells.append((str(index), "", "", f"({note})", "", ""))
            for h in sorted(held or (), key=lambda h: -(h.used_bytes or 0)):
                user, cmdline = details(h.pid)
                used = "?" if h.used_bytes is None else format_bytes(h.used_bytes)
                who = (str(h.pid), printable(user), printable(cmdline or h.name))
                cells.append((str(index), *who, used, h.state.value))
            for row in cells:
                rows.add_row(*(Text(cell) for cell in row))
        parts += [Text(""), rows]
    return Group(*parts)


class Keys:
    """Key presses on a terminal (``h`` holders, ``q`` quit), in cbreak mode until exit."""

    def __init__(
        self, stream: IO[str] | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._stream = sys.stdin if stream is None else stream
        self._sleep = sleep
        self._fd: int | None = None
        self._restore_fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> Self:
        with contextlib.suppress(ImportError, OSError, ValueError, AttributeError):
            import termios
            import tty

            fd = self._stream.fileno()
            if os.isatty(fd):
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self._fd = self._restore_fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._restore_fd is not None and self._saved is not None:
            import termios

            with contextlib.suppress(OSError):
                termios.tcsetattr(self._restore_fd, termios.TCSADRAIN, self._saved)
        self._fd = self._restore_fd = None

    @property
    def active(self) -> bool:
        return self._fd is not None

    def wait(self, timeout: float, state: ViewState) -> None:
        """Wait ``timeout`` seconds, or until a key changes ``state`` (updated in place)."""
        fd = self._fd
        if fd is None:
            self._sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], left)[0]:
                return
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:  # end of input: stop reading, keep refreshing
                self._fd = None
                self._sleep(max(0.0, deadline - time.monotonic()))
                return
            for key in data.decode("utf-8", "replace").lower():
                if key in "qh":
                    state.quit = state.quit or key == "q"
                    state.holders ^= key == "h"
                    return  # redraw now
