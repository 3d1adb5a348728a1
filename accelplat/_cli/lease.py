"""``accelplat lease``: run a command on devices leased for it alone, or show who holds what.

``lease -n 2 -- CMD`` waits until two visible devices are free (no other lease, memory back), runs
CMD with only them visible, forwards signals and exits with its status (``128 + N`` after signal
``N``; 1 when the devices stayed busy; 2 for bad input; 127 when CMD cannot start). CMD inherits
the lock descriptors: the devices stay held until it exits, even if this process is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from accelplat._cli._args import Size, add_common, command, count_arg, path, ratio_arg, seconds_arg
from accelplat._cli._errors import dumps, shown
from accelplat._enforce import choose
from accelplat._leasing import (
    DEFAULT_TIMEOUT_S,
    MIN_SHARE_BYTES,
    LeaseRecord,
    default_lease_dir,
    lease,
    lease_status,
)
from accelplat._util import format_bytes
from accelplat.errors import ConfigurationError

_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``lease`` sub-command to ``sub``."""
    parser = command(
        sub,
        "lease",
        _run,
        help="run a command on devices leased for it alone; --status shows the holders",
        description="Lease devices exclusively among this host's processes (file locks keyed "
        "by device identity; a crashed holder frees them at once), wait until their memory is "
        "back, and run CMD with only them visible; with --memory, lease a share of each "
        "device's memory instead. Leases stay inside the devices this process can see.",
        usage="accelplat lease [-n N] [--memory SIZE | --min-free SIZE] [--min-free-ratio R] "
        "[--timeout S] [--lock-dir DIR] [-q] -- CMD [ARGS ...]\n"
        "       accelplat lease --status [--json] [--lock-dir DIR]",
    )
    parser.add_argument(
        "-n",
        "--count",
        type=count_arg(minimum=1, maximum=999_999, what="a number of devices >= 1"),
        default=1,
        metavar="N",
        help="devices (default 1)",
    )
    parser.add_argument(
        "--memory",
        action=Size,
        help="lease a share of SIZE (e.g. 12GiB) of each device's memory instead of the whole "
        "device; shares coexist while their budgets and the memory in use fit",
    )
    parser.add_argument(
        "--min-free",
        action=Size,
        help="each device must have SIZE free (e.g. 40GiB) when handed out",
    )
    parser.add_argument(
        "--min-free-ratio",
        type=ratio_arg,
        metavar="R",
        help="each device must have the fraction R of its memory free",
    )
    parser.add_argument(
        "--timeout",
        type=seconds_arg(allow_zero=True),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"give up after S seconds (default {DEFAULT_TIMEOUT_S:g})",
    )
    lock_dir = parser.add_argument(
        "--lock-dir",
        metavar="DIR",
        help="lock directory (default: $ACCELPLAT_LEASE_DIR, else a per-user runtime directory)",
    )
    path(lock_dir, directory=True)
    parser.add_argument("--status", action="store_true", help="show who holds which device")
    add_common(parser, json="with --status: print JSON", quiet=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command")


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if args.status:
        if cmd:
            raise ConfigurationError("--status takes no command")
        return _status(args)
    if not cmd:
        raise ConfigurationError("give the command to run after --, e.g. lease -n 1 -- pytest")
    if args.memory is not None and (args.min_free is not None or args.min_free_ratio is not None):
        raise ConfigurationError(
            "--memory leases a share of a device; --min-free and --min-free-ratio are for whole "
            "devices: give one or the other"
        )
    if args.memory is not None and args.memory < MIN_SHARE_BYTES:
        raise ConfigurationError(f"--memory must be at least 1MiB, got {format_bytes(args.memory)}")
    held = lease(
        args.count,
        memory=args.memory,
        min_free_bytes=args.min_free,
        min_free_ratio=args.min_free_ratio,
        timeout_s=args.timeout,
        lock_dir=args.lock_dir,
    )
    with held, contextlib.ExitStack() as stack:
        if not args.quiet:
            names = ", ".join(f"{d.index} ({d.stable_id or d.name})" for d in held.devices)
            env = " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in held.environ.items())
            share = "" if args.memory is None else f" ({format_bytes(args.memory)} of each)"
            line = f"accelplat: leased {names}{share} after {held.waited_s:.2f} s"
            print(f"{line}; {env}" if env else line, file=sys.stderr)
        child_env = held.child_environ()
        if args.memory is not None:  # a share: held to its budget where this host can
            enforced = choose(held.platform)
            stack.callback(enforced.close)
            child_env.update({**enforced.environ, **enforced.limits(held.environ)})
            if not args.quiet:
                print(f"accelplat: {enforced.describe()}", file=sys.stderr)
        return _run_child(cmd, child_env, held.lock_fds)


def _run_child(cmd: Sequence[str], env: dict[str, str], fds: Sequence[int]) -> int:
    try:
        child = subprocess.Popen(list(cmd), env=env, pass_fds=tuple(fds))
    except OSError as exc:
        print(f"accelplat: error: cannot run {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    try:
        foreground = os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        foreground = False

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and foreground:
            return  # the terminal sent it to CMD as well
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    signums = [getattr(signal, name) for name in _FORWARDED if hasattr(signal, name)]
    previous = {signum: signal.signal(signum, forward) for signum in signums}
    try:
        code = child.wait()  # SIGINT is forwarded by the handler, never raised
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _state(record: LeaseRecord, shared: frozenset[str] = frozenset()) -> str:
    if record.budget_bytes is None and record.device_id in shared:
        return "shared"  # its memory shares hold the device's lock shared
    if record.held:
        return "held"
    if record.pid is not None and not record.released:
        return "free (holder crashed)"
    return "free"


def _status(args: argparse.Namespace) -> int:
    records = lease_status(args.lock_dir)  # None: the private default, checked as such
    shared = frozenset(r.device_id for r in records if r.budget_bytes is not None and r.held)
    directory = str(default_lease_dir()) if args.lock_dir is None else args.lock_dir
    if args.json:
        keys = ("held", "pid", "command", "since", "released", "platform", "baseline_used_bytes",
                "budget_bytes")  # fmt: skip
        devices = [
            {
                "device_id": r.device_id,
                "state": _state(r, shared),
                **{k: getattr(r, k) for k in keys},
            }
            for r in records
        ]
        print(dumps({"lock_dir": directory, "devices": devices}))
        return 0
    if not records:
        print(shown(f"no leases recorded in {directory}"))
        return 0
    print(shown(f"leases in {directory}:"))
    for r in records:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.since)) if r.since else "?"
        who = f"pid {r.pid} since {since}: {r.command}" if r.pid is not None else "no holder"
        if _state(r, shared) == "shared":
            who = "by the memory shares below"
        base = ""
        if r.held and r.baseline_used_bytes is not None:
            base = f" (handed out at {format_bytes(r.baseline_used_bytes)} used)"
        share = "" if r.budget_bytes is None else f"  share of {format_bytes(r.budget_bytes)}"
        print(shown(f"  {r.device_id}{share}  {_state(r, shared)}  {who}{base}"))  # escaped
    return 0
