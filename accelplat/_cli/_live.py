"""The terminal view of ``accelplat stats``: header, memory bars, holders, keys.

Drawn with ``rich``. :func:`render` builds one frame from one sample: a header (host, local
time, platform, device count, refresh interval and the keys), one row per device with a bar of
used memory coloured by how full the device is (green below 50 %, yellow below 80 %, red above),
and, when holders are shown, one row per process holding memory (pid, user, command, bytes,
state). Colour follows the console: ``NO_COLOR`` (or ``TERM=dumb``) gives the same layout without
colour; standard output that is not a terminal never comes here (``stats`` prints plain text).

:class:`Keys` reads single key presses from a terminal on standard input while the view waits
for its next refresh: ``h`` shows or hides holders, ``q`` quits. It puts the terminal in cbreak
mode (keys arrive unbuffered, unechoed; Ctrl-C still interrupts) and always restores it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from typing_extensions import Self

from accelplat._usage import MemoryHolder, UsageSnapshot
from accelplat._util import format_bytes, printable

__all__ = ["BAR_WIDTH", "Keys", "ViewState", "bar", "colour_for", "render"]

BAR_WIDTH = 30
"""Characters in a device's memory bar."""

_FULL = "█"
_EMPTY = "░"


@dataclass
class ViewState:
    """What the viewer chose with the keys.

    Attributes:
        holders: Whether holder rows are shown (and holders sampled).
        quit: Whether ``q`` was pressed.
    """

    holders: bool = False
    quit: bool = False


def colour_for(ratio: float) -> str:
    """Return the bar colour for a used fraction: green, yellow from 50 %, red from 80 %."""
    if ratio >= 0.8:
        return "red"
    if ratio >= 0.5:
        return "yellow"
    return "green"


def bar(ratio: float, width: int = BAR_WIDTH) -> str:
    """Return a bar of ``width`` characters, the used fraction ``ratio`` drawn full.

    Any used memory shows at least one full cell; only a full device fills the bar.
    """
    ratio = min(1.0, max(0.0, ratio))
    cells = round(ratio * width)
    if ratio > 0 and cells == 0:
        cells = 1
    if ratio < 1 and cells == width:
        cells = width - 1
    return _FULL * cells + _EMPTY * (width - cells)


def _holder_rows(
    snap: UsageSnapshot, details: Callable[[int], tuple[str, str]]
) -> Iterator[tuple[str, ...]]:
    for index in sorted(snap.memory):
        held: tuple[MemoryHolder, ...] | None = snap.holders.get(index)
        if held is None:
            yield (str(index), "", "", "(the platform cannot tell who holds memory)", "", "")
            continue
        if not held:
            yield (str(index), "", "", "(no process holds memory)", "", "")
        for h in sorted(held, key=lambda h: -(h.used_bytes or 0)):
            user, command = details(h.pid)
            yield (
                str(index),
                str(h.pid),
                printable(user),
                printable(command or h.name),
                "?" if h.used_bytes is None else format_bytes(h.used_bytes),
                h.state.value,
            )


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
    """Build one frame of the view.

    Args:
        platform: The platform's name.
        snap: The sample to show.
        names: Device names by visible index.
        state: Whether holders are shown.
        interval: Seconds between refreshes, or ``None`` for a single frame (no key hints).
        details: Returns ``(user, command line)`` of a pid (``("", "")`` when unknown).
        host: Host name shown in the header (default: this host's).
        now: Wall time shown in the header (default: now).

    Returns:
        A ``rich`` renderable.
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    host = socket.gethostname() if host is None else host
    when = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
    header = Text()
    header.append("accelplat stats", style="bold")
    header.append(f"  host {host}  {stamp}  ")
    header.append(f"platform {platform}", style="bold cyan")
    header.append(f" · {len(snap.memory)} device(s)")
    if interval is not None:
        header.append(f" · every {interval:g} s", style="dim")
        header.append("   [h] holders  [q] quit  [Ctrl-C] exit", style="dim")

    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    table.add_column("DEV", justify="right", no_wrap=True)
    table.add_column("NAME", no_wrap=True, overflow="ellipsis", max_width=28)
    table.add_column("MEMORY", no_wrap=True)
    table.add_column("USED / TOTAL", justify="right", no_wrap=True)
    table.add_column("USE%", justify="right", no_wrap=True)
    table.add_column("FREE", justify="right", no_wrap=True)
    table.add_column("SOURCE", no_wrap=True, overflow="ellipsis", max_width=24)
    for index, info in sorted(snap.memory.items()):
        ratio = info.used_ratio
        colour = colour_for(ratio)
        table.add_row(
            str(index),
            Text(names.get(index, "")),
            Text(bar(ratio), style=colour),
            f"{format_bytes(info.used)} / {format_bytes(info.total)}",
            Text(f"{100 * ratio:.1f}%", style=colour),
            format_bytes(info.free),
            Text(info.source, style="dim"),
        )
    parts: list[Any] = [header, Text(""), table]
    if state.holders:
        held = Table(box=None, pad_edge=False, header_style="bold", expand=False)
        held.add_column("DEV", justify="right", no_wrap=True)
        held.add_column("PID", justify="right", no_wrap=True)
        held.add_column("USER", no_wrap=True, overflow="ellipsis", max_width=16)
        held.add_column("COMMAND", no_wrap=True, overflow="ellipsis", max_width=60)
        held.add_column("MEMORY", justify="right", no_wrap=True)
        held.add_column("STATE", no_wrap=True)
        for row in _holder_rows(snap, details):
            held.add_row(*(Text(cell) for cell in row))
        parts += [Text(""), held]
    return Group(*parts)


class Keys:
    """Single key presses from a terminal on standard input, for the live view.

    Use as a context manager; outside a terminal (or where ``termios`` is missing) it reads
    nothing and :meth:`wait` only sleeps.

    Args:
        stream: The input stream (default ``sys.stdin``).
        sleep: What to call to wait when there is no terminal to read from.
    """

    def __init__(
        self, stream: IO[str] | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._stream = sys.stdin if stream is None else stream
        self._sleep = sleep
        self._fd: int | None = None
        self._restore_fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> Self:
        try:
            import termios
            import tty

            fd = self._stream.fileno()
            if not os.isatty(fd):
                return self
            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
            self._fd = self._restore_fd = fd
        except (ImportError, OSError, ValueError, AttributeError):
            self._fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._restore_fd is not None and self._saved is not None:
            import termios

            with contextlib.suppress(OSError):
                termios.tcsetattr(self._restore_fd, termios.TCSADRAIN, self._saved)
        self._fd = self._restore_fd = None

    @property
    def active(self) -> bool:
        """Whether key presses are being read."""
        return self._fd is not None

    def wait(self, timeout: float, state: ViewState) -> None:
        """Wait ``timeout`` seconds, or until a key changes ``state``.

        Args:
            timeout: Seconds until the next refresh.
            state: Updated in place: ``h`` toggles holders, ``q`` sets ``quit``.
        """
        fd = self._fd
        if fd is None:
            self._sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
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
                if key == "q":
                    state.quit = True
                elif key == "h":
                    state.holders = not state.holders
                else:
                    continue
                return  # redraw now
