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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from typing_extensions import Self

from accelplat._cli._args import add_common, color, color_options, command, count_arg, seconds_arg
from accelplat._cli._errors import Details, dumps, holder_json, host_json, time_json
from accelplat._memory import snapshot
from accelplat._owners import default_clock
from accelplat._platform import Platform
from accelplat._registry import current_platform
from accelplat._types import UsageSnapshot
from accelplat._util import format_bytes, printable
from accelplat.errors import ConfigurationError

_COLUMNS = ("DEV", "NAME", "USED", "FREE", "TOTAL", "RESERVED", "USE%", "SOURCE")
BAR_WIDTH = 30  # the bar's cells on a wide terminal; it shrinks first, to MIN_BAR
MIN_BAR = 10
_BAR_GOOD = 20  # the bar's cells before the SOURCE column has a place
_GAP = 2  # cells between two columns
_NAME_MIN, _NAME_MAX, _SOURCE_MAX, _USER_MAX, _COMMAND_MIN = 8, 28, 24, 16, 12
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
    details: Details | None = None,
    host: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the document ``accelplat stats --json`` prints for one sample (``docs/json.md``).

    ``details`` (default: read with psutil) gives each holder's user and command line; ``host``
    is :func:`host_json`'s answer, asked once per run (``None``: asked now).
    """
    details = _process_details() if details is None and holders else details
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
            entry["holders"] = None if held is None else [holder_json(h, details) for h in held]
        devices.append(entry)
    return {
        **(host_json(platform) if host is None else host),
        **time_json(snap.timestamp, snap.wall_time),
        "devices": devices,
    }


def _process_details() -> Details:
    from accelplat._vendor.procs import process_details

    return process_details


def _plain(
    platform: Platform,
    snap: UsageSnapshot,
    names: dict[int, str],
    holders: bool,
    details: Details | None = None,
) -> str:
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for index, m in sorted(snap.memory.items()):
        sizes = (format_bytes(n) for n in (m.used, m.free, m.total, m.reserved))
        use = f"{100 * m.used_ratio:.1f}%"
        rows.append((str(index), names.get(index, ""), *sizes, use, m.source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    count = f"({len(snap.memory)} device(s))"
    lines = [f"platform: {platform.name} {count} at {stamp(snap.wall_time)}"]
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
            user, cmdline = details(h.pid) if details is not None else ("", "")
            who = f", user {printable(user)}" if user else ""
            who += f": {printable(cmdline)}" if cmdline else ""
            lines.append(f"device {index}: pid {h.pid}{label} ({h.state.value}) {used}{who}")
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
                    text = _plain(platform, snap, shown, state.holders, _process_details())
                    out.write(("\n" if n else "") + text)
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

    # colour() read NO_COLOR and FORCE_COLOR already; rich would read them again over a flag.
    console = Console(no_color=colour is False, force_terminal=colour or None)

    def frame(snap: UsageSnapshot) -> Any:
        return render(
            platform, snap, names, state=state, interval=watch, details=_process_details()
        )

    if watch is None or not sys.stdout.isatty():  # a forced colour in a pipe: frame by frame
        return lambda snap: console.print(frame(snap))
    # The alternate screen, as top and nvitop use: each refresh draws the whole screen from its
    # top-left corner, so a resized terminal (which reflows what it shows) keeps no stale line.
    # Leaving it restores the shell's screen; the last frame is printed there to stay.
    last: list[Any] = []
    stack.callback(lambda: console.print(last[-1]) if last else None)
    live = Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False)
    view = stack.enter_context(live)

    def draw(snap: UsageSnapshot) -> None:
        last[:] = [frame(snap)]
        view.update(last[0], refresh=True)

    return draw


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


def stamp(wall_time: float) -> str:
    """Return ``wall_time`` (seconds since the epoch) as local ``YYYY-MM-DD HH:MM:SS``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_time))


@dataclass(frozen=True)
class Column:
    """A column of the live view: its heading, its width in cells, and its justification."""

    heading: str
    width: int
    right: bool = False


def _widest(heading: str, rows: Sequence[Mapping[str, str]]) -> int:
    from rich.cells import cell_len

    return max([cell_len(heading), *(cell_len(row.get(heading, "")) for row in rows)])


def device_columns(width: int, rows: Sequence[Mapping[str, str]]) -> list[Column]:
    """Choose the device table's columns for a terminal ``width`` cells wide.

    DEV, USED / TOTAL, USE% and FREE are always whole. Narrowing the terminal shrinks the bar
    first (from 30 cells to 20), then drops SOURCE (the header names it when it is one for all),
    shrinks the bar to ``MIN_BAR``, cuts NAME (to 8 cells), and last drops the bar. At 80 columns
    an "NVIDIA H200" row keeps its whole name and a 19-cell bar.
    """
    fixed = [Column(h, _widest(h, rows), right=True) for h in ("DEV", "USED / TOTAL", "USE%")]
    fixed.append(Column("FREE", _widest("FREE", rows), right=True))
    left = width - sum(c.width for c in fixed) - _GAP * (len(fixed) - 1)
    name_full = min(_widest("NAME", rows), _NAME_MAX)
    source_full = min(_widest("SOURCE", rows), _SOURCE_MAX)
    name = min(name_full, _NAME_MIN) if left >= _GAP + min(name_full, _NAME_MIN) else 0
    left -= _GAP + name if name else 0
    cells = MIN_BAR if left >= _GAP + MIN_BAR else 0
    left -= _GAP + cells if cells else 0
    if name:  # what a wider terminal gives next: the whole name, a 20-cell bar, the source
        grow = min(name_full - name, left)
        name, left = name + grow, left - grow
    if cells:
        grow = min(_BAR_GOOD - cells, left)
        cells, left = cells + grow, left - grow
    source = source_full if left >= _GAP + source_full else 0
    left -= _GAP + source if source else 0
    if cells:
        cells += min(BAR_WIDTH - cells, left)
    columns = [fixed[0], *([Column("NAME", name)] if name else [])]
    columns += [Column("MEMORY", cells)] if cells else []
    return columns + fixed[1:] + ([Column("SOURCE", source)] if source else [])


def holder_columns(width: int, rows: Sequence[Mapping[str, str]]) -> list[Column]:
    """Choose the holder table's columns: all but USER and COMMAND whole, COMMAND the rest."""
    fixed = [Column(h, _widest(h, rows), right=True) for h in ("DEV", "PID")]
    tail = [Column("MEMORY", _widest("MEMORY", rows), right=True)]
    tail.append(Column("STATE", _widest("STATE", rows)))
    left = width - sum(c.width for c in (*fixed, *tail)) - _GAP * (len(fixed) + len(tail))
    user = min(_widest("USER", rows), _USER_MAX, max(4, left - _GAP - _COMMAND_MIN))
    command = max(_COMMAND_MIN, left - _GAP - user)
    return [*fixed, Column("USER", user), Column("COMMAND", command), *tail]


def _line(columns: Sequence[Column], cells: Mapping[str, Any]) -> Any:
    """Return one row: each cell cut to its column (``…``) and justified, two cells apart."""
    from rich.text import Text

    out = Text(no_wrap=True, overflow="crop")
    for n, column in enumerate(columns):
        cell = cells.get(column.heading, "")
        text = cell.copy() if isinstance(cell, Text) else Text(str(cell))
        text.truncate(column.width, overflow="ellipsis")
        text.align("right" if column.right else "left", column.width)
        out.append_text(Text(" " * _GAP) if n else Text())
        out.append_text(text)
    out.rstrip()
    return out


Part = tuple[tuple[str, str], ...]  # a part of the header: (text, style) pieces kept together


def _pack(parts: Sequence[Part], width: int) -> list[Any]:
    """Return the header's parts as lines of ``width`` cells, never breaking a part."""
    from rich.cells import cell_len
    from rich.text import Text

    lines: list[Any] = []
    line = Text(no_wrap=True, overflow="crop")
    for part in parts:
        size = sum(cell_len(text) for text, _ in part)
        if line and cell_len(line.plain) + _GAP + size > width:
            lines.append(line)
            line = Text(no_wrap=True, overflow="crop")
        if line:
            line.append(" " * _GAP)
        for text, style in part:
            line.append(text, style=style)
    return [*lines, line]


@dataclass
class Frame:
    """One frame of the live view, laid out for the console's width when rich draws it."""

    header: list[Part]
    devices: list[tuple[dict[str, str], float]]  # per device: cell text by heading, used ratio
    holders: list[dict[str, str]] | None  # per holder: cell text by heading; None: not shown

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        width = max(1, options.max_width)
        header = list(self.header)
        rows = [cells for cells, _ in self.devices]
        columns = device_columns(width, rows)
        sources = {row["SOURCE"] for row in rows}
        if "SOURCE" not in {c.heading for c in columns} and len(sources) == 1:
            header.append(((f"source {next(iter(sources))}", "dim"),))  # one for all: say it once
        yield from _pack(header, width)
        yield Text("")
        yield _line(columns, {c.heading: Text(c.heading, style="bold") for c in columns})
        bar_cells = next((c.width for c in columns if c.heading == "MEMORY"), 0)
        for row, ratio in self.devices:
            colour = colour_for(ratio)
            cells: dict[str, Any] = dict(row)
            cells["MEMORY"] = Text(bar(ratio, bar_cells), style=colour) if bar_cells else ""
            cells["USE%"] = Text(row["USE%"], style=colour)
            cells["SOURCE"] = Text(row["SOURCE"], style="dim")
            yield _line(columns, cells)
        if self.holders is not None:
            columns = holder_columns(width, self.holders)
            yield Text("")
            yield _line(columns, {c.heading: Text(c.heading, style="bold") for c in columns})
            for row in self.holders:
                yield _line(columns, row)


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
) -> Frame:
    """Build one frame of the live view (``interval=None``: one frame, no key hints).

    ``now`` (default: the snapshot's wall time) is the time in the header.
    """
    where: Part = ((f"platform {platform}", "bold cyan"), (f" · {len(snap.memory)} device(s)", ""))
    if interval is not None:
        where += ((f" · every {interval:g} s", "dim"),)
    header: list[Part] = [
        (("accelplat stats", "bold"),),
        ((f"host {socket.gethostname() if host is None else host}", ""),),
        ((stamp(snap.wall_time if now is None else now), ""),),
        where,
    ]
    if interval is not None:
        header.append((("[h] holders  [q] quit  [Ctrl-C] exit", "dim"),))
    devices = []
    for index, info in sorted(snap.memory.items()):
        ratio = info.used_ratio
        cells = {
            "DEV": str(index),
            "NAME": names.get(index, ""),
            "USED / TOTAL": f"{format_bytes(info.used)} / {format_bytes(info.total)}",
            "USE%": f"{100 * ratio:.1f}%",
            "FREE": format_bytes(info.free),
            "SOURCE": printable(info.source),
        }
        devices.append((cells, ratio))
    holders: list[dict[str, str]] | None = None
    if state.holders:
        holders = []
        for index in sorted(snap.memory):
            held = snap.holders.get(index)
            if not held:
                unknown = "the platform cannot tell who holds memory"
                note = unknown if held is None else "no process holds memory"
                holders.append({"DEV": str(index), "COMMAND": f"({note})"})
            for h in sorted(held or (), key=lambda h: -(h.used_bytes or 0)):
                user, cmdline = details(h.pid)
                holders.append(
                    {
                        "DEV": str(index),
                        "PID": str(h.pid),
                        "USER": printable(user),
                        "COMMAND": printable(cmdline or h.name),
                        "MEMORY": "?" if h.used_bytes is None else format_bytes(h.used_bytes),
                        "STATE": h.state.value,
                    }
                )
    return Frame(header, devices, holders)


class Keys:
    """Key presses on a terminal (``h`` holders, ``q`` quit), in cbreak mode until exit.

    A resize of the terminal (``SIGWINCH``) also ends :meth:`wait`, so the view redraws at once.
    """

    def __init__(
        self, stream: IO[str] | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._stream = sys.stdin if stream is None else stream
        self._sleep = sleep
        self._fd: int | None = None
        self._restore_fd: int | None = None
        self._saved: Any = None
        self._wake: tuple[int, int] | None = None  # a pipe the SIGWINCH handler writes to
        self._previous: Any = None

    def __enter__(self) -> Self:
        with contextlib.suppress(ImportError, OSError, ValueError, AttributeError):
            import termios
            import tty

            fd = self._stream.fileno()
            if os.isatty(fd):
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self._fd = self._restore_fd = fd
        winch = getattr(signal, "SIGWINCH", None)
        if self._fd is not None and winch and threading.current_thread() is threading.main_thread():
            self._wake = os.pipe()
            for end in self._wake:
                os.set_blocking(end, False)
            self._previous = signal.signal(winch, self._resized)
        return self

    def _resized(self, signum: int, frame: FrameType | None) -> None:
        if self._wake is not None:
            with contextlib.suppress(OSError):  # a full pipe has a wake-up pending already
                os.write(self._wake[1], b"r")

    def __exit__(self, *exc: object) -> None:
        if self._restore_fd is not None and self._saved is not None:
            import termios

            with contextlib.suppress(OSError):
                termios.tcsetattr(self._restore_fd, termios.TCSADRAIN, self._saved)
        self._fd = self._restore_fd = None
        if self._wake is not None:
            signal.signal(signal.SIGWINCH, self._previous)
            for end in self._wake:
                os.close(end)
            self._wake = None

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
        wake = [] if self._wake is None else [self._wake[0]]
        while (left := deadline - time.monotonic()) > 0:
            ready = select.select([fd, *wake], [], [], left)[0]
            if not ready:
                return
            if wake and wake[0] in ready:  # resized: drain the pipe, redraw now
                with contextlib.suppress(OSError):
                    os.read(wake[0], 64)
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
