"""The ``accelplat`` command line.

Each sub-command lives in a module of this package that exposes ``register(subparsers)``; the
module's ``register`` adds its parser and sets ``func`` to a callable taking the parsed
``argparse.Namespace`` and returning the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from accelplat._cli._errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    fail,
    silence_stdout,
)
from accelplat.errors import AccelplatError

__all__ = ["build_parser", "main"]

_COMMAND_MODULES: tuple[str, ...] = (
    "accelplat._cli.info",
    "accelplat._cli.stats",
    "accelplat._cli.wait",
    "accelplat._cli.sizing",
    "accelplat._cli.timeline",
    "accelplat._cli.lease",
    "accelplat._cli.scan",
    "accelplat._cli.completion",
    "accelplat._cli.capture",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every available sub-command registered."""
    from accelplat import __version__

    parser = argparse.ArgumentParser(
        prog="accelplat",
        description="Accelerator facts for ML test suites: platform, memory, waits, sizing.",
    )
    parser.add_argument("--version", action="version", version=f"accelplat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command not shipped in this build
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``None`` means ``sys.argv[1:]``.

    Returns:
        The exit status, the same mapping for every sub-command (:mod:`accelplat._cli._errors`):
        0 on success; 1 for a failed check or wait, or a runtime or backend error; 2 for bad
        usage or configuration; 130 after Ctrl-C; 141 when standard output was closed early.
        Under ``--json`` an error also prints a JSON error object on standard output.
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
            status = fail(
                exc,
                command=str(getattr(args, "command", "") or ""),
                json_output=bool(getattr(args, "json", False)),
            )
        sys.stdout.flush()
    except BrokenPipeError:  # `accelplat info | head -1`: the reader has gone, not an error
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status
