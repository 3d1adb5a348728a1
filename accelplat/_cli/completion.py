"""``accelplat completion bash|zsh|fish``: a shell completion script for this command line.

The script is generated from the command line's own argument parser, so every sub-command and
option (including those of commands added later) is completed without a list kept by hand:
sub-command names, each command's options, the choices of options and arguments that have
them (``completion``'s shell, ``--shell`` values …), and file names after options that take a
path. Install it with, for example::

    accelplat completion bash > ~/.local/share/bash-completion/completions/accelplat
    accelplat completion zsh > "${fpath[1]}/_accelplat"
    accelplat completion fish > ~/.config/fish/completions/accelplat.fish

Nothing here probes a platform or reads device memory.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SHELLS", "CommandSpec", "OptionSpec", "register", "script", "spec_of"]

SHELLS = ("bash", "zsh", "fish")
"""Shells a script can be generated for."""

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")


@dataclass(frozen=True)
class OptionSpec:
    """One option of a command, as completion needs it.

    Attributes:
        flags: Its spellings, e.g. ``("-q", "--quiet")``.
        takes_value: Whether a value follows it.
        choices: The values it accepts, when argparse knows them.
        path: Whether its value names a file or directory (complete file names).
        help: One line of help (for shells that show descriptions).
    """

    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...] = ()
    path: bool = False
    help: str = ""


@dataclass(frozen=True)
class CommandSpec:
    """A command (the program or one sub-command) and what may follow it.

    Attributes:
        name: The sub-command's name (the program's name for the top level).
        help: One line of help.
        options: Its options.
        commands: Its sub-commands, by name.
        positional_choices: Choices of its positional arguments (e.g. the shell names).
        positional_paths: Whether it takes positional arguments without choices (file names,
            or a command to run): file names are completed for them.
    """

    name: str
    help: str = ""
    options: tuple[OptionSpec, ...] = ()
    commands: dict[str, CommandSpec] = field(default_factory=dict)
    positional_choices: tuple[str, ...] = ()
    positional_paths: bool = False


_PATH_HINT = re.compile(r"(path|file|dir|out|trace|spec|config|log)", re.IGNORECASE)


def _is_path(action: argparse.Action) -> bool:
    """Whether an option's value names a file: a path type, or a plain one named like a path."""
    if isinstance(action.type, argparse.FileType) or action.type is Path:
        return True
    if action.type not in (None, str):
        return False  # numbers, sizes, device lists …
    return bool(_PATH_HINT.search(f"{action.dest} {action.metavar or ''}"))


def _one_line(text: str | None) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    return " ".join(text.split())


def _choices(action: argparse.Action) -> tuple[str, ...]:
    if action.choices is None or isinstance(action.choices, argparse._SubParsersAction):
        return ()
    return tuple(str(c) for c in action.choices)


def spec_of(parser: argparse.ArgumentParser, name: str, help_text: str = "") -> CommandSpec:
    """Describe ``parser`` (recursively through its sub-commands) for completion.

    Args:
        parser: An argument parser.
        name: The command's name.
        help_text: Its one-line help.

    Returns:
        The description; options whose help is suppressed are left out.
    """
    options: list[OptionSpec] = []
    commands: dict[str, CommandSpec] = {}
    positional: list[str] = []
    paths = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: _one_line(a.help) for a in action._choices_actions}
            for sub_name, sub_parser in action.choices.items():
                commands[sub_name] = spec_of(sub_parser, sub_name, helps.get(sub_name, ""))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            options.append(
                OptionSpec(
                    flags=tuple(action.option_strings),
                    takes_value=action.nargs != 0,
                    choices=_choices(action),
                    path=action.nargs != 0 and not _choices(action) and _is_path(action),
                    help=_one_line(action.help),
                )
            )
        elif _choices(action):
            positional.extend(_choices(action))
        elif action.nargs != 0:
            paths = True
    return CommandSpec(
        name=name,
        help=help_text,
        options=tuple(options),
        commands=commands,
        positional_choices=tuple(positional),
        positional_paths=paths,
    )


def _words(words: tuple[str, ...] | list[str]) -> str:
    """Join words for a shell script; anything unusual is refused rather than quoted."""
    for word in words:
        if not _SAFE_WORD.match(word):
            raise ValueError(f"cannot put {word!r} into a completion script")
    return " ".join(words)


def _quote_sq(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _all_flags(cmd: CommandSpec) -> list[str]:
    return [flag for opt in cmd.options for flag in opt.flags]


def _valued(cmd: CommandSpec) -> Iterator[OptionSpec]:
    return (opt for opt in cmd.options if opt.takes_value)


def _bash(prog: str, top: CommandSpec) -> str:
    fn = f"_{prog.replace('-', '_')}_complete"
    lines = [
        f"# bash completion for {prog}; generated by `{prog} completion bash`",
        f"{fn}() {{",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmd="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        "            -*) ;;",
        '            *) cmd="${COMP_WORDS[i]}"; break ;;',
        "        esac",
        "    done",
        '    case "$cmd" in',
    ]
    for name, cmd in [("", top), *sorted(top.commands.items())]:
        words = (sorted(top.commands) if not name else []) + list(cmd.positional_choices)
        lines.append(f'        "{name}")')
        lines += _option_value_cases(
            cmd,
            choices='COMPREPLY=($(compgen -W "{words}" -- "$cur"))',
            path='COMPREPLY=($(compgen -f -- "$cur"))',
            other="COMPREPLY=()",
        )
        lines.append('            if [[ "$cur" == -* ]]; then')
        lines.append(
            f'                COMPREPLY=($(compgen -W "{_words(_all_flags(cmd))}" -- "$cur"))'
        )
        lines.append("            else")
        lines.append(f'                COMPREPLY=($(compgen -W "{_words(words)}" -- "$cur"))')
        if cmd.positional_paths:
            lines.append('                COMPREPLY+=($(compgen -f -- "$cur"))')
        lines.append("            fi")
        lines.append("            ;;")
    lines += [
        "        *) COMPREPLY=() ;;",
        "    esac",
        "}",
        f"complete -o default -F {fn} {prog}",
        "",
    ]
    return "\n".join(lines)


def _option_value_cases(cmd: CommandSpec, *, choices: str, path: str, other: str) -> list[str]:
    """The bash/zsh ``case "$prev"`` block that completes the value of an option.

    Args:
        cmd: The command whose valued options are completed.
        choices: The shell action for an option with choices; ``{words}`` stands for them.
        path: The shell action for an option that takes a path.
        other: The action for a number, size or list: nothing to offer.

    Returns:
        The block's lines.
    """
    lines = ['            case "$prev" in']
    for opt in _valued(cmd):
        if opt.choices:
            action = choices.format(words=_words(opt.choices))
        else:
            action = path if opt.path else other
        lines.append(f"                {'|'.join(opt.flags)}) {action}; return ;;")
    lines.append("            esac")
    return lines


def _zsh(prog: str, top: CommandSpec) -> str:
    fn = f"_{prog.replace('-', '_')}"
    lines = [
        f"#compdef {prog}",
        f"# zsh completion for {prog}; generated by `{prog} completion zsh`",
        f"{fn}() {{",
        "    local cmd='' i",
        "    for ((i = 2; i < CURRENT; i++)); do",
        '        case "${words[i]}" in',
        "            -*) ;;",
        '            *) cmd="${words[i]}"; break ;;',
        "        esac",
        "    done",
        '    local prev="${words[CURRENT-1]}"',
        '    case "$cmd" in',
    ]
    for name, cmd in [("", top), *sorted(top.commands.items())]:
        lines.append(f'        "{name}")')
        lines += _option_value_cases(cmd, choices="compadd -- {words}", path="_files", other=":")
        if not name:
            lines.append("            local -a commands")
            lines.append("            commands=(")
            for sub_name, sub in sorted(top.commands.items()):
                lines.append(f"                {_quote_sq(f'{sub_name}:{sub.help}')}")
            lines.append("            )")
            lines.append('            if [[ "$PREFIX" != -* ]]; then')
            lines.append(f"                _describe -t commands '{prog} command' commands")
            lines.append("            fi")
        lines.append('            if [[ "$PREFIX" == -* ]]; then')
        lines.append(f"                compadd -- {_words(_all_flags(cmd))}")
        if cmd.positional_choices or cmd.positional_paths:
            lines.append("            else")
            if cmd.positional_choices:
                lines.append(f"                compadd -- {_words(cmd.positional_choices)}")
            if cmd.positional_paths:
                lines.append("                _files")
        lines.append("            fi")
        lines.append("            ;;")
    lines += [
        "    esac",
        "}",
        'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then',
        f'    {fn} "$@"',
        "else",
        f"    compdef {fn} {prog}",
        "fi",
        "",
    ]
    return "\n".join(lines)


def _fish(prog: str, top: CommandSpec) -> str:
    lines = [
        f"# fish completion for {prog}; generated by `{prog} completion fish`",
        f"complete -c {prog} -f",
    ]

    def option_lines(cmd: CommandSpec, condition: str) -> None:
        for opt in cmd.options:
            parts = [f"complete -c {prog} -n {_quote_sq(condition)}"]
            for flag in opt.flags:
                parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
            if opt.choices:
                parts.append(f"-x -a {_quote_sq(_words(opt.choices))}")
            elif opt.path:
                parts.append("-r -F")
            elif opt.takes_value:
                parts.append("-x")
            if opt.help:
                parts.append(f"-d {_quote_sq(opt.help)}")
            lines.append(" ".join(parts))

    option_lines(top, "__fish_use_subcommand")
    for sub_name, sub in sorted(top.commands.items()):
        description = f" -d {_quote_sq(sub.help)}" if sub.help else ""
        lines.append(
            f"complete -c {prog} -n '__fish_use_subcommand' -a {_words([sub_name])}{description}"
        )
        condition = f"__fish_seen_subcommand_from {_words([sub_name])}"
        option_lines(sub, condition)
        if sub.positional_choices:
            choices = _quote_sq(_words(sub.positional_choices))
            lines.append(f"complete -c {prog} -n {_quote_sq(condition)} -a {choices}")
        if sub.positional_paths:
            lines.append(f"complete -c {prog} -n {_quote_sq(condition)} -F")
    lines.append("")
    return "\n".join(lines)


def script(shell: str, parser: argparse.ArgumentParser | None = None) -> str:
    """Return the completion script for ``shell``.

    Args:
        shell: ``"bash"``, ``"zsh"`` or ``"fish"``.
        parser: The parser to describe; by default the full ``accelplat`` command line.

    Returns:
        The script's text.

    Raises:
        ValueError: For an unknown shell, or a command or option name that is not a plain word.
    """
    if parser is None:
        from accelplat._cli import build_parser

        parser = build_parser()
    prog = parser.prog
    top = spec_of(parser, prog)
    if shell == "bash":
        return _bash(prog, top)
    if shell == "zsh":
        return _zsh(prog, top)
    if shell == "fish":
        return _fish(prog, top)
    raise ValueError(f"no completion for shell {shell!r}; choose one of {', '.join(SHELLS)}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``completion`` sub-command to ``sub``."""
    parser = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for SHELL, generated from this command line's "
        "own parser, on standard output. Load it with e.g. "
        "`source <(accelplat completion bash)` or save it where the shell looks for "
        "completions.",
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.shell))
    return 0
