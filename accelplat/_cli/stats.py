"""``accelplat stats``: used, free, total and reserved memory of every visible device.

One table, or with ``--watch [SECONDS]`` (1 s when none is given, as gpustat's ``-i``) one per
refresh. On a terminal the table is the live view, drawn with ``rich`` (the ``cli`` extra): a
header, a bar per device coloured by how full it is, holders on ``h`` or with ``--holders``, the
keys on ``?``, ``q`` to quit. ``--no-color`` or ``NO_COLOR`` drops the colour; off a terminal (or
with ``TERM=dumb``) it is a plain table fitted to the width (``COLUMNS``, else 80) unless
``--color`` or ``FORCE_COLOR`` asks for colour; ``--json`` prints one object per refresh. Where
the platform hands schedulers units of its own (``lease_units``: MIG slices), each is listed too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from accelplat._cli._args import add_common, color, count_arg, seconds_arg
from accelplat._cli._errors import dumps, handling, host_json, time_json
from accelplat._util import format_bytes, printable
from accelplat._vendor.procs import process_details
from accelplat.errors import AccelplatError, ConfigurationError

if TYPE_CHECKING:  # the core loads when the command runs
    from accelplat._platform import Platform
    from accelplat._types import DeviceInfo, MemoryHolder, MemoryInfo, UsageSnapshot

BAR_WIDTH = 30  # the bar's cells on a wide terminal; it shrinks first, to MIN_BAR
MIN_BAR = 10
_BAR_GOOD = 20  # the bar's cells before the SOURCE column has a place
_GAP = 2  # cells between two columns
_NAME_MIN, _NAME_MAX, _SOURCE_MAX, _USER_MAX, _COMMAND_MIN = 8, 28, 24, 16, 12
# rich pads every frame on the alternate screen to the terminal's size: on a 65535×65535 one,
# 4.3e9 cells a frame, which never draws (nor reads a key). The view draws at most this area.
MAX_COLUMNS, MAX_LINES = 500, 200
_RIGHT = frozenset({"DEV", "PID", "USED", "FREE", "TOTAL", "RESERVED", "USE%", "USED / TOTAL"})
NO_RICH = "the live view needs rich: pip install 'accelplat[cli]'"
KEYS = (
    "h  show or hide the processes holding memory",
    "q  quit (Ctrl-C too)",
    "?  show or hide these keys",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stats`` sub-command to ``sub``."""
    parser = sub.add_parser(
        "stats",
        help="show used/free/total device memory, once or refreshing",
        description="Show used, free, total and reserved memory of each visible device, as the "
        "platform's context-free query reports it. Creates no device context.",
    )
    parser.set_defaults(func=_run)
    add_common(parser, json="print JSON (one object per refresh)", devices=True, colour=True)
    add = parser.add_argument
    every = "refresh every SECONDS (default 1) until interrupted (or --count refreshes)"
    seconds = seconds_arg(allow_zero=False)
    add("--watch", nargs="?", const=1.0, type=seconds, metavar="SECONDS", help=every)
    refreshes = count_arg(minimum=1, what="a whole number >= 1")
    add("--count", type=refreshes, metavar="N", help="with --watch: stop after N refreshes")
    holders = "also list the processes holding memory, where the platform can tell"
    add("--holders", action="store_true", help=holders)


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


def holder_json(h: MemoryHolder) -> dict[str, Any]:
    """Return a process holding device memory as ``--json`` documents show it."""
    user, argv = process_details(h.pid)
    return {
        "pid": h.pid,
        "used_bytes": h.used_bytes,
        "state": h.state.value,
        "name": h.name,
        "user": user,
        "command": " ".join(argv),
        "argv": list(argv),
    }


Slice = tuple[str, "DeviceInfo | None", "MemoryInfo | None", str]  # unit, device, memory, error


def slices(platform: Platform) -> list[Slice]:
    """Read each unit a scheduler may hand a child (a MIG slice), as that child would see it.

    Empty where the visible devices are the units (``lease_units`` absent or empty).
    """
    from accelplat._owners import sample
    from accelplat._platform import optional

    units, restricted = optional(platform, "lease_units"), optional(platform, "restricted")
    found: list[Slice] = []
    for unit in units() if callable(units) and callable(restricted) else ():
        try:
            view = restricted(unit)
            found.append((unit, view.devices()[0], sample(view, [0], holders=False).memory[0], ""))
        except (AccelplatError, IndexError) as exc:
            found.append((unit, None, None, str(exc) or type(exc).__name__))
    return found


def _device_json(device: DeviceInfo | None, info: MemoryInfo | None) -> dict[str, Any]:
    """A device's (or slice's) ``name``, ``uuid`` and memory, as ``--json`` documents show them."""
    keys = ("used", "free", "total", "reserved", "used_ratio", "source") if info else ()
    named = {"name": device.name, "uuid": device.uuid} if device else {"name": "", "uuid": None}
    return named | {key: getattr(info, key) for key in keys}


def snapshot_to_json(
    platform: Platform,
    snap: UsageSnapshot,
    devices: Mapping[int, DeviceInfo],
    *,
    holders: bool,
    host: Mapping[str, Any] | None = None,
    units: Sequence[Slice] = (),
) -> dict[str, Any]:
    """Return the document ``accelplat stats --json`` prints for one sample (``docs/json.md``).

    ``host`` is :func:`host_json`'s answer, asked once per run (``None``: asked now); ``units``:
    the :func:`slices` read with the sample, listed when there are any.
    """
    entries = [
        {"index": i, **_device_json(devices.get(i), m)} for i, m in sorted(snap.memory.items())
    ]
    for entry in entries if holders else ():
        held = snap.holders.get(entry["index"])
        entry["holders"] = None if held is None else [holder_json(h) for h in held]
    doc = {
        **(host_json(platform) if host is None else host),
        **time_json(snap.timestamp, snap.wall_time),
        "devices": entries,
    }
    if units:
        doc["slices"] = [
            {"unit": u, **_device_json(d, m)} | ({} if m else {"error": why})
            for u, d, m, why in units
        ]
    return doc


def command_line(argv: Sequence[str]) -> str:
    """Return a command line to show: the program's base name, then its arguments."""
    return printable(" ".join([os.path.basename(argv[0]), *argv[1:]])) if argv else ""


def _cells(info: MemoryInfo) -> dict[str, str]:
    used, total = format_bytes(info.used), format_bytes(info.total)
    return {
        "USED": used,
        "FREE": format_bytes(info.free),
        "TOTAL": total,
        "RESERVED": format_bytes(info.reserved),
        "USED / TOTAL": f"{used} / {total}",
        "USE%": f"{100 * info.used_ratio:.1f}%",
        "SOURCE": printable(info.source),
    }


def _devices(snap: UsageSnapshot, names: Mapping[int, str]) -> list[tuple[dict[str, str], float]]:
    """Each device's cells by heading, and its used fraction (for the bar)."""
    rows = sorted(snap.memory.items())
    return [({"DEV": str(i), "NAME": names.get(i, ""), **_cells(m)}, m.used_ratio) for i, m in rows]


def _widest(heading: str, rows: Sequence[Mapping[str, str]]) -> int:
    return max([len(heading), *(len(row.get(heading, "")) for row in rows)])


def fit(
    width: int,
    rows: Sequence[Mapping[str, str]],
    whole: Sequence[str],
    steps: Sequence[tuple[str, int]],
) -> dict[str, int]:
    """Choose the columns of a table ``width`` cells wide, and their widths.

    The ``whole`` columns are always shown whole. Then each step ``(heading, cells)`` in turn
    adds a column not shown yet at ``cells``, if that fits, or grows a shown one towards it.
    """
    sizes = {h: _widest(h, rows) for h in whole}
    for heading, cells in steps:
        left = width - sum(sizes.values()) - _GAP * (len(sizes) - 1)
        if heading in sizes:
            sizes[heading] += max(0, min(cells - sizes[heading], left))
        elif left >= _GAP + cells:
            sizes[heading] = cells
    return sizes


Piece = tuple[str, str]  # text and its style


def row(
    order: Sequence[str],
    sizes: Mapping[str, int],
    cells: Mapping[str, str],
    style: Mapping[str, str] | None = None,
    right: frozenset[str] = _RIGHT,
) -> list[Piece]:
    """Return a table row: each cell cut to its column (``…``), justified, two cells apart."""
    pieces: list[Piece] = []
    for heading in (h for h in order if h in sizes):
        width, text = sizes[heading], cells.get(heading, "")
        text = text if len(text) <= width else text[: max(0, width - 1)] + "…"
        text = text.rjust(width) if heading in right else text.ljust(width)
        pieces += [(" " * _GAP if pieces else "", ""), (text, (style or {}).get(heading, ""))]
    return pieces


def _steps(rows: Sequence[Mapping[str, str]], *, plain: bool) -> list[tuple[str, int]]:
    """How the device table grows with the width (docs/cli.md, ``stats``)."""
    if plain:  # a log: the whole name first, then reserved memory, then the source
        steps = [("NAME", min(_widest("NAME", rows), _NAME_MIN))]
        return steps + [(h, _widest(h, rows)) for h in ("NAME", "RESERVED", "SOURCE")]
    name = min(_widest("NAME", rows), _NAME_MAX)
    return [
        ("NAME", min(name, _NAME_MIN)),
        ("MEMORY", MIN_BAR),
        ("NAME", name),
        ("MEMORY", _BAR_GOOD),
        ("SOURCE", min(_widest("SOURCE", rows), _SOURCE_MAX)),
        ("MEMORY", BAR_WIDTH),
    ]


_PLAIN = ("DEV", "NAME", "USED", "FREE", "TOTAL", "RESERVED", "USE%", "SOURCE")
_LIVE = ("DEV", "NAME", "MEMORY", "USED / TOTAL", "USE%", "FREE", "SOURCE")
_SLICES = ("SLICE", "NAME", "USED / TOTAL", "USE%", "FREE")
_HOLDERS = ("DEV", "PID", "USER", "COMMAND", "MEMORY", "STATE")


def _tables(
    width: int, devices: Sequence[tuple[dict[str, str], float]], units: Sequence[Slice], plain: bool
) -> tuple[list[list[Piece]], str]:
    """The device table (and the slices') for ``width`` cells, and the one source it left out."""
    order = _PLAIN if plain else _LIVE
    whole = ("DEV", "USED", "FREE", "TOTAL", "USE%") if plain else ("DEV", *_LIVE[3:6])
    rows = [cells for cells, _ in devices]
    sizes = fit(width, rows, whole, _steps(rows, plain=plain))
    sources = {cells["SOURCE"] for cells in rows}
    gone = next(iter(sources)) if "SOURCE" not in sizes and len(sources) == 1 else ""
    bold = None if plain else dict.fromkeys((*_LIVE, *_SLICES), "bold")
    lines = [row(order, sizes, {h: h for h in order}, bold)]
    for cells, ratio in devices:
        colour = colour_for(ratio)
        style = None if plain else {"MEMORY": colour, "USE%": colour, "SOURCE": "dim"}
        drawn = {**cells, "MEMORY": bar(ratio, sizes.get("MEMORY", 0))}
        lines.append(row(order, sizes, drawn, style))
    if units:
        rows = [
            {"SLICE": printable(u), "NAME": printable(d.name if d else why)}
            | (_cells(m) if m else {})
            for u, d, m, why in units
        ]
        sizes = fit(width, rows, ("SLICE", *_SLICES[2:]), _steps(rows, plain=True))
        lines += [[], row(_SLICES, sizes, {h: h for h in _SLICES}, bold)]
        lines += [row(_SLICES, sizes, cells) for cells in rows]
    return lines, gone


def _plain(
    platform: Platform,
    snap: UsageSnapshot,
    names: Mapping[int, str],
    holders: bool,
    units: Sequence[Slice],
) -> str:
    devices = _devices(snap, names)
    lines, gone = _tables(shutil.get_terminal_size().columns, devices, units, plain=True)
    head = f"platform: {platform.name} ({len(snap.memory)} device(s)) at {stamp(snap.wall_time)}"
    out = [head + (f"; source {gone}" if gone else "")]
    out += ["".join(text for text, _ in line).rstrip() for line in lines]
    for index in sorted(snap.memory) if holders else ():
        held = snap.holders.get(index)
        if not held:
            unknown = "holders unknown (the platform cannot tell)"
            out.append(f"device {index}: {unknown if held is None else 'no process holds memory'}")
        for h in held or ():
            label = f" {printable(h.name)}" if h.name else ""
            user, argv = process_details(h.pid)
            who = f", user {printable(user)}" if user else ""
            who += f": {command_line(argv)}" if argv else ""
            used = format_bytes(h.used_bytes)
            out.append(f"device {index}: pid {h.pid}{label} ({h.state.value}) {used}{who}")
    return "\n".join(out)


def _run(args: argparse.Namespace) -> int:
    if args.count is not None and args.watch is None and args.count != 1:
        raise ConfigurationError("--count needs --watch SECONDS")
    from accelplat._memory import snapshot
    from accelplat._owners import default_clock
    from accelplat._registry import current_platform

    platform = current_platform()
    devices = {d.index: d for d in platform.devices()}
    shown = {i: printable(d.name) for i, d in devices.items()}  # for a terminal: escapes escaped
    snapshot(args.devices, platform=platform, holders=False)  # check the devices first
    out, colour, clock = sys.stdout, color(args.color), default_clock(platform)
    live = not args.json and use_rich(out, watch=args.watch is not None, colour=colour)
    watching, name = live and args.watch, platform.name
    state = ViewState(holders=args.holders)
    host = host_json(platform) if args.json else None  # asked once per run
    try:
        with contextlib.suppress(KeyboardInterrupt), contextlib.ExitStack() as stack:  # Ctrl-C
            if watching:  # SIGTERM, SIGHUP: end as Ctrl-C does, terminal restored
                stack.enter_context(handling(_ENDING, _end))  # undone last
            wait = listen(stack, sys.stdin if watching else None, clock.sleep)
            draw = _live_view(stack, args.watch, colour) if live else None
            n = 0
            while not state.quit:
                snap = snapshot(args.devices, platform=platform, holders=state.holders)
                units = slices(platform)
                if draw is not None:
                    draw(render(name, snap, shown, state=state, interval=args.watch, units=units))
                elif host is not None:
                    doc = snapshot_to_json(
                        platform, snap, devices, holders=state.holders, host=host, units=units
                    )
                    out.write(dumps(doc) + "\n")
                else:
                    text = _plain(platform, snap, shown, state.holders, units)
                    out.write(("\n" if n else "") + text + "\n")
                out.flush()
                n += 1
                if args.watch is None or n == args.count:
                    break
                wait(args.watch, state)
    except _EndedError as ended:
        return 128 + int(ended.args[0])
    return 0


_ENDING = (signal.SIGTERM, signal.SIGHUP)


class _EndedError(Exception):
    """A signal of ``_ENDING`` (``args[0]``) ended the live view."""


def _end(signum: int, frame: object) -> None:
    for other in _ENDING:  # a repeat while the view unwinds is ignored
        signal.signal(other, signal.SIG_IGN)
    raise _EndedError(signum)


def _live_view(
    stack: contextlib.ExitStack[Any], watch: float | None, colour: bool | None
) -> Callable[[Frame], None]:
    """Return what draws a frame of the view; ``stack`` gives the terminal back at its end."""
    from rich.console import Console
    from rich.live import Live

    # colour() read NO_COLOR and FORCE_COLOR already; rich would read them again over a flag.
    console = Console(no_color=colour is False, force_terminal=colour or None)
    if watch is None or not sys.stdout.isatty():  # a forced colour in a pipe: frame by frame
        return console.print
    # The alternate screen, as top and nvitop use: each refresh draws the whole screen from its
    # top-left corner, so a resized terminal (which reflows what it shows) keeps no stale line.
    # Leaving it restores the shell's screen; the last frame is printed there to stay.
    last: list[Frame] = []
    stack.callback(lambda: console.print(last[-1]) if last else None)
    live = Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False)
    view = stack.enter_context(live)

    def draw(frame: Frame) -> None:
        columns, lines = shutil.get_terminal_size()
        console.size = (min(columns, MAX_COLUMNS), min(lines, MAX_LINES))  # read at each draw
        last[:] = [frame]
        view.update(frame, refresh=True)

    return draw


@dataclass
class ViewState:
    """What the viewer chose with the keys: holders shown (and sampled), keys shown, ``q``."""

    holders: bool = False
    quit: bool = False
    keys: bool = False


def colour_for(ratio: float) -> str:
    """Return the bar colour for a used fraction: green, yellow from 50 %, red from 80 %."""
    return "red" if ratio >= 0.8 else "yellow" if ratio >= 0.5 else "green"


def bar(ratio: float, width: int = BAR_WIDTH) -> str:
    """Return a bar of ``width`` cells: any use shows one full cell, only a full device all."""
    ratio = min(1.0, max(0.0, ratio))
    least, most = (1 if ratio > 0 else 0), (width if ratio == 1 else width - 1)
    cells = min(max(round(ratio * width), least), most)
    return "█" * cells + "░" * (width - cells)


def stamp(wall_time: float) -> str:
    """Return ``wall_time`` (seconds since the epoch) as local ``YYYY-MM-DD HH:MM:SS``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_time))


Part = tuple[Piece, ...]  # a part of the header: (text, style) pieces kept together


def _pack(parts: Sequence[Part], width: int) -> list[list[Piece]]:
    """Return the header's parts as lines of ``width`` cells, never breaking a part."""
    lines: list[list[Piece]] = [[]]
    for part in parts:
        size = sum(len(text) for text, _ in part)
        used = sum(len(text) for text, _ in lines[-1])
        if lines[-1] and used + _GAP + size > width:
            lines.append([])
        lines[-1] += [(" " * _GAP, "")] * bool(lines[-1]) + list(part)
    return lines


@dataclass
class Frame:
    """One frame of the live view, laid out for the console's width when rich draws it."""

    header: list[Part]
    devices: list[tuple[dict[str, str], float]]  # per device: cell text by heading, used ratio
    holders: list[dict[str, str]] | None  # per holder: cell text by heading; None: not shown
    units: Sequence[Slice] = ()
    keys: bool = False

    def lines(self, width: int) -> list[list[Piece]]:
        """Return the frame's lines of ``(text, style)`` pieces for ``width`` cells."""
        tables, gone = _tables(width, self.devices, self.units, plain=False)
        lines = _pack([*self.header, *([((f"source {gone}", "dim"),)] if gone else [])], width)
        lines += [[("  " + k, "dim")] for k in KEYS] if self.keys else []
        lines += [[], *tables]
        if self.holders is not None:
            sizes = fit(width, self.holders, ("DEV", "PID", "MEMORY", "STATE"), ())
            left = width - sum(sizes.values()) - _GAP * 5
            sizes["USER"] = min(_widest("USER", self.holders), _USER_MAX, max(4, left - 12))
            sizes["COMMAND"] = max(_COMMAND_MIN, left - sizes["USER"])
            right = _RIGHT | {"MEMORY"}
            heads = {h: h for h in _HOLDERS}
            lines += [[], row(_HOLDERS, sizes, heads, dict.fromkeys(_HOLDERS, "bold"), right)]
            lines += [row(_HOLDERS, sizes, cells, None, right) for cells in self.holders]
        return lines

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        for pieces in self.lines(max(1, options.max_width)):
            line = Text.assemble(*pieces, no_wrap=True, overflow="crop")
            line.rstrip()
            yield line


def render(
    platform: str,
    snap: UsageSnapshot,
    names: Mapping[int, str],
    *,
    state: ViewState,
    interval: float | None,
    details: Callable[[int], tuple[str, Sequence[str]]] = process_details,  # pid: user, argv
    host: str | None = None,
    units: Sequence[Slice] = (),
) -> Frame:
    """Build one frame of the live view (``interval=None``: one frame, no key hints)."""
    watched: list[Piece] = [] if interval is None else [(f" · every {interval:g} s", "dim")]
    header: list[Part] = [
        (("accelplat stats", "bold"),),
        ((f"host {socket.gethostname() if host is None else host}", ""),),
        ((stamp(snap.wall_time), ""),),
        ((f"platform {platform}", "bold cyan"), (f" · {len(snap.memory)} device(s)", ""), *watched),
        *([(("[h] holders  [q] quit  [?] keys", "dim"),)] if watched else []),
    ]
    holders: list[dict[str, str]] = []
    for index in sorted(snap.memory) if state.holders else ():
        held = snap.holders.get(index)
        if not held:
            unknown = "the platform cannot tell who holds memory"
            note = unknown if held is None else "no process holds memory"
            holders.append({"DEV": str(index), "COMMAND": f"({note})"})
        for h in sorted(held or (), key=lambda h: -(h.used_bytes or 0)):
            user, argv = details(h.pid)
            command, used = command_line(argv) or printable(h.name), format_bytes(h.used_bytes)
            cells = (str(index), str(h.pid), printable(user), command, used, h.state.value)
            holders.append(dict(zip(_HOLDERS, cells, strict=True)))
    shown = holders if state.holders else None
    return Frame(header, _devices(snap, names), shown, units, state.keys and interval is not None)


def listen(
    stack: contextlib.ExitStack[Any],
    stream: IO[str] | None,
    sleep: Callable[[float], None] = time.sleep,
) -> Callable[[float, ViewState], None]:
    """Return ``wait(timeout, state)``: sleep ``timeout`` s, or until a key changes ``state``.

    The keys (``h`` holders, ``?`` keys, ``q`` quit; ``state`` is updated in place) are read from
    the terminal ``stream``, in cbreak mode until ``stack`` closes (``None``, or not a terminal:
    no keys, ``wait`` only sleeps). A key typed before the view started is kept (cbreak is entered
    without flushing input). A resize of the terminal (``SIGWINCH``) also ends a wait, so the view
    redraws at once.
    """
    fd: int | None = None
    with contextlib.suppress(ImportError, OSError, ValueError, AttributeError):
        import termios
        import tty

        if stream is not None and os.isatty(stream.fileno()):
            fd = stream.fileno()
            stack.callback(_restore_terminal, fd, termios.tcgetattr(fd))
            tty.setcbreak(fd, termios.TCSANOW)  # TCSAFLUSH would drop a `q` typed already
    if fd is None:
        return lambda timeout, state: sleep(timeout)
    wake, write = os.pipe()  # a resize writes to it, which ends a wait
    for end in (wake, write):
        os.set_blocking(end, False)
        stack.callback(os.close, end)

    def resized(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):  # a full pipe has a wake-up pending already
            os.write(write, b"r")

    stack.enter_context(handling([signal.SIGWINCH], resized))
    reading = [fd]  # emptied at the end of input: then a wait only sleeps

    def wait(timeout: float, state: ViewState) -> None:
        deadline = time.monotonic() + timeout
        while reading and (left := deadline - time.monotonic()) > 0:
            if fd not in select.select([fd, wake], [], [], left)[0]:  # the time is up, or resized
                with contextlib.suppress(OSError):  # drain the pipe
                    os.read(wake, 64)
                return
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:  # end of input: stop reading, keep refreshing
                reading.clear()
            for key in data.decode("utf-8", "replace").lower():
                if key in "qh?":
                    state.quit = state.quit or key == "q"
                    state.holders ^= key == "h"
                    state.keys ^= key == "?"
                    return  # redraw now
        if not reading:
            sleep(max(0.0, deadline - time.monotonic()))

    return wait


def _restore_terminal(fd: int, saved: Any) -> None:
    import termios

    with contextlib.suppress(OSError):
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
