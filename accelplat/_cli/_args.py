"""What the sub-commands share in their parsers: argument types, common options, path marks."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from accelplat import _validate
from accelplat.errors import ConfigurationError

Subcommands = argparse._SubParsersAction  # argparse's sub-command container has no public name


def command(
    sub: Subcommands[argparse.ArgumentParser],
    name: str,
    run: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """Add the sub-command ``name``, run by ``run(args)`` (which returns the exit status)."""
    parser = sub.add_parser(name, help=help, description=description, **kwargs)
    parser.set_defaults(func=run)
    return parser


def add_common(
    parser: argparse.ArgumentParser,
    *,
    json: bool | str = False,
    devices: bool = False,
    quiet: bool = False,
) -> None:
    """Add the options several sub-commands share, each with one spelling.

    Args:
        parser: The sub-command's parser.
        json: Add ``--json``; a string is its help text.
        devices: Add ``--devices LIST`` (:func:`parse_devices`).
        quiet: Add ``--quiet``/``-q``.
    """
    if json:
        help_text = json if isinstance(json, str) else "print machine-readable JSON"
        parser.add_argument("--json", action="store_true", help=help_text)
    if devices:
        parser.add_argument(
            "--devices",
            type=parse_devices,
            metavar="LIST",
            help="comma-separated visible device indices (default: all)",
        )
    if quiet:
        parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")


def path(action: argparse.Action, *, directory: bool = False) -> argparse.Action:
    """Mark ``action`` as taking a file (or directory) name, for shell completion.

    shtab reads ``complete``; its names ``"file"``/``"directory"`` spare every command the
    import of shtab (80 ms, mostly ``importlib.metadata``).
    """
    action.complete = "directory" if directory else "file"  # type: ignore[attr-defined]
    return action


def parse_devices(text: str) -> list[int] | None:
    """Parse ``--devices``: comma-separated visible indices; ``all`` or ``""`` means all (None).

    Raises:
        argparse.ArgumentTypeError: For anything but integers >= 0 without duplicates.
    """
    stripped = text.strip()
    if stripped.lower() in ("", "all"):
        return None
    devices: list[int] = []
    for part in stripped.split(","):
        item = part.strip()
        if not item.isdigit() or len(item) > 6:
            raise argparse.ArgumentTypeError(
                f"--devices takes comma-separated device indices such as 0,1 (or 'all'); "
                f"got {text!r}"
            )
        devices.append(int(item))
    if len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"--devices lists a device twice: {text!r}")
    return devices


class Size(argparse.Action):
    """``action=Size``: a size with a unit (``4GiB``, ``8GB``, ``100B``; ``parse_size``).

    A refusal names the option (``--require: "4" has no unit; …``) and exits 2.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        try:
            size = _validate.parse_size(str(values).strip(), argument=option_string or self.dest)
        except ConfigurationError as exc:
            parser.error(str(exc))
        setattr(namespace, self.dest, size)


def seconds_arg(*, allow_zero: bool, maximum: float | None = None) -> Callable[[str], float]:
    """Return an argparse type for a finite number of seconds, ``> 0`` or ``>= 0``."""
    bound = ">= 0" if allow_zero else "> 0"
    if maximum is not None:
        bound = f"in {'[' if allow_zero else '('}0, {maximum:g}]"

    def parse(text: str) -> float:
        return _validate.number(
            text,
            "",
            minimum=0 if allow_zero else None,
            above=None if allow_zero else 0,
            maximum=maximum,
            expected=f"a finite number of seconds {bound}",
            from_text=True,
            error=argparse.ArgumentTypeError,
        )

    return parse


def ratio_arg(text: str) -> float:
    """Parse a fraction in ``[0, 1]`` (``--threshold-ratio``, ``--min-free-ratio``)."""
    return _validate.number(
        text,
        "",
        minimum=0,
        maximum=1,
        expected="a fraction in [0, 1]",
        from_text=True,
        error=argparse.ArgumentTypeError,
    )


def count_arg(*, minimum: int, maximum: int | None = None, what: str) -> Callable[[str], int]:
    """Return an argparse type for a whole number in ``minimum..maximum``, described by ``what``."""

    def parse(text: str) -> int:
        return _validate.integer(
            text,
            "",
            minimum=minimum,
            maximum=maximum,
            expected=what,
            from_text=True,
            error=argparse.ArgumentTypeError,
        )

    return parse
