"""``accelplat capture``: record this host's answers into a bundle others can replay.

The bundle (a ``.tar.gz``; format in :mod:`accelplat._replay._bundle`) holds what accelplat reads
here and nothing else; the command prints exactly what went in.
"""

from __future__ import annotations

import argparse

from accelplat._cli._args import count_arg, output_option, seconds_arg
from accelplat._cli._errors import EXIT_FAILED, say, shown
from accelplat._files import write_text_atomic


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "capture",
        help="record what accelplat reads on this host into a bundle (for bug reports and tests)",
        description="Record what accelplat reads on this host - the sysfs/procfs/cgroup files "
        "its backends open, the answers of NVML / Level Zero Sysman / amdsmi, installed "
        "versions, the relevant environment variables, a few memory samples - into a bundle "
        "that `accelplat info --replay BUNDLE` (or ACCELPLAT_REPLAY=BUNDLE) replays anywhere. "
        "No host name or user name is recorded. Creates no device context.",
    )
    parser.set_defaults(func=_run)
    add = parser.add_argument
    bundle = "bundle to write: host.tar.gz"
    output_option(parser, "--out", required=True, metavar="BUNDLE", help=bundle)
    hidden = "leave out the pids and names of processes holding device memory"
    add("--no-processes", action="store_true", help=hidden)
    add("--quiet", "-q", action="store_true", help="print only the bundle's path, not its contents")
    samples = count_arg(minimum=0, maximum=100, what="a whole number 0-100")
    more = "memory samples after the first (default 4)"
    add("--samples", type=samples, default=4, metavar="N", help=more)
    interval = seconds_arg(allow_zero=True, maximum=10)
    between = "seconds between memory samples (default 0.4)"
    add("--interval", type=interval, default=0.4, metavar="SECONDS", help=between)


def _run(args: argparse.Namespace) -> int:
    from accelplat.replay import capture

    result = capture(
        processes=not args.no_processes, samples=args.samples, interval_s=args.interval
    )
    try:
        write_text_atomic(args.out, result.data)
    except OSError as exc:
        say(f"accelplat capture: error: cannot write {shown(repr(args.out))}: {shown(exc)}")
        return EXIT_FAILED
    wrote = f"wrote {shown(args.out)} ({len(result.data)} bytes)"
    if args.quiet:  # what it holds is in the bundle's CONTENTS.txt
        print(f"{wrote}; its CONTENTS.txt lists everything it holds.")
    else:
        print(result.contents)
        print(f"{wrote}; this is everything it holds (above).")
    return 0
