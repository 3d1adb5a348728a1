"""The ``accelplat`` command line (``docs/cli.md``).

Each sub-command's module has ``register(sub)``, adding a parser whose ``func(args)`` returns the
exit status (:mod:`accelplat._cli._errors`).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from accelplat._cli import _errors, capture, info, lease, scan, sizing, stats, timeline, wait
from accelplat._cli._args import Subcommands
from accelplat.errors import AccelplatError

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

SHELLS = ("bash", "zsh", "fish")


class _Parser(argparse.ArgumentParser):
    """Help that fails loudly: argparse drops an ``OSError`` of standard output (``/dev/full``)."""

    commands: dict[str, argparse.ArgumentParser]  # the sub-commands' parsers, by name

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        (sys.stdout if file is None else file).write(self.format_help())

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """Parse ``argv``; an unknown option is refused by its sub-command, with a suggestion.

        argparse refuses what a sub-command does not know with the top-level usage and no hint;
        this names the sub-command's usage and the closest option it has (``--wach``: ``--watch``).
        """
        args, extras = self.parse_known_args(argv)
        if not extras:
            return args
        parser = self.commands.get(getattr(args, "command", None) or "", self)
        options = parser.format_help().partition("\noptions:\n")[2]  # its options, listed
        known = re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", options)
        guess = difflib.get_close_matches(extras[0].split("=", 1)[0], known, n=1)
        hint = f" (did you mean {guess[0]}?)" if guess else ""
        parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


class _Version(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from accelplat import __version__

        sys.stdout.write(f"accelplat {__version__}\n")
        parser.exit()


def build_parser() -> _Parser:
    """Return the argument parser with every sub-command registered."""
    parser = _Parser(
        prog="accelplat",
        description="Accelerator facts for ML test suites: platform, memory, waits, sizing.",
    )
    parser.add_argument(
        "-V", "--version", action=_Version, nargs=0, help="print the version and exit"
    )
    sub: Subcommands[Any] = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices
    for module in (info, stats, wait, sizing, timeline, lease, scan, capture):
        module.register(sub)
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for SHELL, generated from this command line's own "
        "parser, on standard output. Load it with e.g. `source <(accelplat completion bash)` or "
        "save it where the shell looks for completions.",
    )
    completion.set_defaults(func=_completion)
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    return parser


def _completion(args: argparse.Namespace) -> int:
    import shtab  # 80 ms: only for this command

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``None``: ``sys.argv[1:]``); return the exit status.

    A standard output that cannot be written (full, closed) ends any command with 1 and a message,
    one closed by its reader (``| head``) with 141 and nothing.
    """
    closed = sys.stdout is None
    if closed:
        sys.stdout = _errors.ClosedStdout()
    args: argparse.Namespace | None = None
    try:
        try:
            parser = build_parser()
            args = parser.parse(argv)  # --help prints, then raises SystemExit
            func = getattr(args, "func", None)
            if func is None:
                parser.print_help()
                return _errors.EXIT_USAGE
            try:
                return int(func(args))
            except AccelplatError as exc:
                return _errors.fail(
                    exc, command=args.command, json_output=getattr(args, "json", False)
                )
        finally:
            sys.stdout.flush()  # a failure here replaces what was returned or raised
    except BrokenPipeError:  # `accelplat info | head -1`: the reader has gone, not an error
        _errors.silence_stdout()
        return _errors.EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return _errors.EXIT_INTERRUPTED
    except OSError as exc:
        if exc.filename is None:  # standard output: writes name no file, other failures do
            _errors.silence_stdout()
            exc = OSError(f"cannot write standard output: {exc.strerror or exc}")
        return _errors.fail(exc, command=getattr(args, "command", ""), json_output=False)
    finally:
        if closed:
            sys.stdout = None
