"""What the sub-commands share in their parsers: argument types, common options, path marks."""

from __future__ import annotations

import argparse
import functools
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from accelplat import _validate
from accelplat.errors import ConfigurationError

Subcommands = argparse._SubParsersAction  # argparse's sub-command container has no public name
_TEXT: dict[str, Any] = {"argument": "", "from_text": True, "error": argparse.ArgumentTypeError}


def add_common(
    parser: argparse.ArgumentParser,
    *,
    json: bool | str = False,
    devices: bool = False,
    quiet: bool = False,
    colour: bool = False,
) -> None:
    """Add the options several sub-commands share, each with one spelling.

    ``--json`` (``json``: its help), ``--devices``, ``--quiet``, and ``--color`` / ``--no-color``
    (``args.color``: True, False or None; see :func:`color`).
    """
    if json:
        help_text = json if isinstance(json, str) else "print machine-readable JSON"
        parser.add_argument("--json", action="store_true", help=help_text)
    if devices:
        listed = "comma-separated visible device indices (default: all)"
        parser.add_argument("--devices", type=parse_devices, metavar="LIST", help=listed)
    if quiet:
        parser.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    if colour:
        group = parser.add_mutually_exclusive_group()
        forced = "colour even when standard output is not a terminal (as FORCE_COLOR does)"
        plain = "no colour (as NO_COLOR does)"
        for flag, value, text in (("--color", True, forced), ("--no-color", False, plain)):
            group.add_argument(flag, dest="color", action="store_const", const=value, help=text)


def color(flag: bool | None) -> bool | None:
    """Return whether to colour: the flag, else ``NO_COLOR``, else ``FORCE_COLOR``, else None.

    ``None`` leaves it to the output (a terminal gets colour). A variable counts when it is set
    and not empty, as no-color.org and force-color.org say; ``NO_COLOR`` wins over
    ``FORCE_COLOR``, a flag typed on the command line over both.
    """
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return None


def path(action: argparse.Action, *, directory: bool = False) -> argparse.Action:
    """Mark ``action`` as taking a file (or directory) name, for shell completion."""
    # shtab reads ``complete``; its names spare every command importing shtab (80 ms)
    action.complete = "directory" if directory else "file"  # type: ignore[attr-defined]
    return action


def words(action: argparse.Action, names: Iterable[str]) -> argparse.Action:
    """Mark ``action`` as completing to ``names`` in every shell, never to file names."""
    listed = " ".join(names)
    func = f"_accelplat_{action.dest}_words"
    action.complete = {  # type: ignore[attr-defined]
        "bash": func,
        "zsh": f"({listed})",
        "fish": listed,
        "preamble": {"bash": f'{func}() {{ compgen -W "{listed}" -- "$1"; }}'},
    }
    return action


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def output_file(text: str) -> str:
    """Parse a file to write (``--out``): absent, or an existing regular file (or a link to one)."""
    # The writers rename a new file over the name: a FIFO, a device (/dev/null), a socket or a
    # directory there would be replaced, or block, so it is refused before anything runs.
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"needs a file name (without NUL), got {text!r}")
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        return text
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return text
    kind = next((k for test, k in _KINDS if test(mode)), "a special file")
    raise argparse.ArgumentTypeError(f"{text!r} is {kind}, not a regular file; not replaced")


def output_option(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    """Add ``flag`` naming a file to write (:func:`output_file`), marked for completion."""
    path(parser.add_argument(flag, type=output_file, **kwargs))


def parse_devices(text: str) -> list[int] | None:
    """Parse ``--devices``: comma-separated visible indices; ``all`` or ``""`` means all (None)."""
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
    """``action=Size``: a size with a unit (``4GiB``, ``100B``); a refusal names the option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"metavar": "SIZE", **kwargs})

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
    minimum, above = (0, None) if allow_zero else (None, 0)
    expected = f"a finite number of seconds {bound}"
    return functools.partial(
        _validate.number, minimum=minimum, above=above, maximum=maximum, expected=expected, **_TEXT
    )


def ratio_arg(text: str) -> float:
    """Parse a fraction in ``[0, 1]`` (``--threshold-ratio``, ``--min-free-ratio``)."""
    return _validate.number(text, minimum=0, maximum=1, expected="a fraction in [0, 1]", **_TEXT)


def count_arg(*, minimum: int, maximum: int | None = None, what: str) -> Callable[[str], int]:
    """Return an argparse type for a whole number in ``minimum..maximum``, described by ``what``."""
    return functools.partial(
        _validate.integer, minimum=minimum, maximum=maximum, expected=what, **_TEXT
    )
