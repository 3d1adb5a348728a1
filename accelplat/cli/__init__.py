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

from accelplat.errors import AccelplatError

__all__ = ["build_parser", "main"]

_COMMAND_MODULES: tuple[str, ...] = (
    "accelplat.cli.info",
    "accelplat.cli.stats",
    "accelplat.cli.wait",
    "accelplat.cli.sizing",
    "accelplat.cli.timeline",
    "accelplat.cli.lease",
    "accelplat.cli.scan",
    "accelplat.cli.completion",
    "accelplat.cli.capture",
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
        The exit status: 0 on success, 1 for a failed check or wait, 2 for bad usage.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        status: int = func(args)
    except AccelplatError as exc:
        print(f"accelplat: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        return 130
    return status
