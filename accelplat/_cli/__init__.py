"""The ``accelplat`` command line (``docs/cli.md``).

Each sub-command's module has ``register(sub)``, which adds its parser with ``func``: a callable
taking the parsed arguments and returning the exit status (:mod:`accelplat._cli._errors`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accelplat._cli import capture, info, lease, scan, sizing, stats, timeline, wait
from accelplat._cli._args import Subcommands, command
from accelplat._cli._errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    fail,
    silence_stdout,
)
from accelplat.errors import AccelplatError

SHELLS = ("bash", "zsh", "fish")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every sub-command registered."""
    from accelplat import __version__

    parser = argparse.ArgumentParser(
        prog="accelplat",
        description="Accelerator facts for ML test suites: platform, memory, waits, sizing.",
    )
    parser.add_argument("--version", action="version", version=f"accelplat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (info, stats, wait, sizing, timeline, lease, scan, capture):
        module.register(sub)
    _register_completion(sub)
    return parser


def _register_completion(sub: Subcommands[argparse.ArgumentParser]) -> None:
    parser = command(
        sub,
        "completion",
        _completion,
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for SHELL, generated from this command line's "
        "own parser, on standard output. Load it with e.g. "
        "`source <(accelplat completion bash)` or save it where the shell looks for "
        "completions.",
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")


def _completion(args: argparse.Namespace) -> int:
    import shtab  # 80 ms: only for this command

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``None`` means ``sys.argv[1:]``.

    Returns:
        The exit status, the same mapping for every sub-command (:mod:`accelplat._cli._errors`).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        try:
            status: int = func(args)
        except AccelplatError as exc:
            status = fail(exc, command=args.command, json_output=getattr(args, "json", False))
        sys.stdout.flush()
    except BrokenPipeError:  # `accelplat info | head -1`: the reader has gone, not an error
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status
