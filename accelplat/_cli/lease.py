"""``accelplat lease``: run a command on devices leased for it alone, or show who holds what.

``lease -n 2 -- CMD`` waits until two devices are free (no other lease, memory back), saying
what it waits for, runs CMD with only them visible, forwards signals and exits with its status
(``128 + N`` after signal ``N``; 1 when the devices stayed busy; 2 for bad input; 127 when CMD
cannot start). CMD inherits the lock descriptors: the devices stay held until it exits, even if
this process is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from accelplat._cli._args import Size, add_common, count_arg, path, ratio_arg, seconds_arg
from accelplat._cli._errors import dumps, handling, in_foreground, redraw, say, shown
from accelplat._util import format_bytes
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:  # leasing loads when the command runs, not for --help or --version
    from accelplat._leasing import LeaseRecord

PREFIX = "accelplat lease:"
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_REDRAW_S = 0.25  # a terminal's waiting line is drawn again at most this often


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``lease`` sub-command to ``sub``."""
    parser = sub.add_parser(
        "lease",
        help="run a command on devices leased for it alone; --status shows the holders",
        description="Lease devices (or, with --memory, a share of each) among this host's "
        "processes, wait until their memory is back, and run CMD with only them visible.",
    )
    parser.set_defaults(func=_run)
    add = parser.add_argument
    devices = count_arg(minimum=1, maximum=999_999, what="a number of devices >= 1")
    add("-n", "--count", type=devices, default=1, metavar="N", help="devices (default 1)")
    add("--memory", type=_budget, metavar="SIZE", help="lease SIZE of each device, not all of it")
    add("--min-free", action=Size, help="each device must have SIZE free when handed out")
    add("--min-free-ratio", type=ratio_arg, metavar="R", help="each must have R of its memory free")
    wait = seconds_arg(allow_zero=True)  # the default is the library's (DEFAULT_TIMEOUT_S)
    add("--timeout", type=wait, metavar="S", help="give up after S seconds (default 600)")
    where = add("--lock-dir", metavar="DIR", help="default: $ACCELPLAT_LEASE_DIR, else per user")
    path(where, directory=True)
    add("--status", action="store_true", help="show who holds which device")
    add_common(parser, json="with --status: print JSON", quiet=True)
    add("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command")


def _budget(text: str) -> int:
    from accelplat._leasing._shares import parse_budget

    try:
        return parse_budget(text)
    except ConfigurationError as exc:  # a usage error naming the option
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if args.status:
        if cmd:
            raise ConfigurationError("--status takes no command")
        return _status(args)
    if not cmd:
        raise ConfigurationError("give the command to run after --, e.g. lease -n 1 -- pytest")
    from accelplat._enforce import choose
    from accelplat._leasing import DEFAULT_TIMEOUT_S, lease

    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    kw = {"memory": args.memory, "timeout_s": timeout, "lock_dir": args.lock_dir}
    held = lease(args.count, min_free_bytes=args.min_free, min_free_ratio=args.min_free_ratio, **kw)
    each = "" if held.memory_bytes is None else f" ({format_bytes(held.memory_bytes)} of each)"
    waiting = Waiting(f"{args.count} device(s){each}")
    try:
        held.acquire(on_wait=None if args.quiet else waiting)
    finally:
        waiting.close()
    with contextlib.ExitStack() as stack:
        stack.callback(held.release)
        child_env = held.child_environ()
        enforced = None
        if held.memory_bytes is not None:  # a share: held to its budget where this host can
            enforced = choose(held.platform)
            stack.callback(enforced.close)
            child_env.update({**enforced.environ, **enforced.limits(held.environ)})
        if not args.quiet:
            names = ", ".join(f"{d.index} ({d.stable_id or d.name})" for d in held.devices)
            env = " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in held.environ.items())
            line = f"{PREFIX} leased {names}{each} after {held.waited_s:.2f} s"
            say(shown(f"{line}; {env}" if env else line))
            if enforced is not None:
                say(shown(f"{PREFIX} {enforced.describe()}"))
        return _run_child(cmd, child_env, held.lock_fds)


class Waiting:
    """What a waiting lease shows on standard error.

    On a terminal, one line redrawn in place: what it waits for, for how long, who is in the way,
    fit to the width. Elsewhere (a log), one line when the wait starts; its end is the ``leased``
    line or the error.
    """

    def __init__(self, what: str) -> None:
        self.what, self.drawn_at, self.tty = what, -math.inf, sys.stderr.isatty()

    def __call__(self, waited_s: float, reason: str) -> None:
        now = time.monotonic()
        if now - self.drawn_at < (_REDRAW_S if self.tty else math.inf):
            return
        self.drawn_at = now
        if self.tty:
            redraw(
                sys.stderr, shown(f"{PREFIX} waiting {waited_s:.0f} s for {self.what}: {reason}")
            )
        else:
            say(shown(f"{PREFIX} waiting for {self.what}: {reason}"))

    def close(self) -> None:
        """Clear a terminal's waiting line."""
        if self.tty and self.drawn_at > -math.inf:
            redraw(sys.stderr)


def _run_child(cmd: Sequence[str], env: dict[str, str], fds: Sequence[int]) -> int:
    try:
        child = subprocess.Popen(list(cmd), env=env, pass_fds=tuple(fds))
    except OSError as exc:
        say(shown(f"{PREFIX} error: cannot run {cmd[0]!r}: {exc.strerror or exc}"))
        return 127
    foreground = in_foreground()

    def forward(signum: int, frame: object) -> None:
        if signum != signal.SIGINT or not foreground:  # else the terminal sent it to CMD as well
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    signums = [getattr(signal, name) for name in _FORWARDED if hasattr(signal, name)]
    with handling(signums, forward):
        code = child.wait()  # SIGINT is forwarded by the handler, never raised
    return 128 - code if code < 0 else code


def _state(record: LeaseRecord, shared: dict[str, int]) -> str:
    if record.budget_bytes is None and record.device_id in shared:
        return "shared"  # its memory shares hold the device's lock shared
    if record.held:
        return "held"
    return "free (holder crashed)" if record.pid is not None and not record.released else "free"


def _status(args: argparse.Namespace) -> int:
    from accelplat._leasing import lease_status
    from accelplat._leasing._locks import default_lease_dir, describe

    records = lease_status(args.lock_dir)  # None: the private default, checked as such
    shared: dict[str, int] = {}  # device -> bytes promised by live shares
    for r in records:
        if r.budget_bytes is not None and r.held:
            shared[r.device_id] = shared.get(r.device_id, 0) + r.budget_bytes
    directory = str(default_lease_dir()) if args.lock_dir is None else args.lock_dir
    if args.json:
        devices = [
            {"state": _state(r, shared), **asdict(r), "promised_bytes": shared.get(r.device_id)}
            for r in records
        ]
        print(dumps({"lock_dir": directory, "devices": devices}))
        return 0
    print(shown(f"leases in {directory}:" if records else f"no leases recorded in {directory}"))
    for r in records:
        who = describe(r) if r.pid is not None else "no holder"
        if _state(r, shared) == "shared":
            who = f"by memory shares, {format_bytes(shared[r.device_id])} promised"
        share = "" if r.budget_bytes is None else f"  share of {format_bytes(r.budget_bytes)}"
        print(shown(f"  {r.device_id}{share}  {_state(r, shared)}  {who}"))  # escaped
    return 0
