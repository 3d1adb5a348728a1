"""``accelplat scan PATH``: inventory a test tree's platform predicates for a migration.

``--json`` prints ``schema``, the summary of :meth:`accelplat._scan.ScanReport.summary` and
every finding.
"""

from __future__ import annotations

import argparse

from accelplat._cli._args import add_common, command, path
from accelplat._cli._errors import dumps
from accelplat._scan import GROUPS, ScanReport, scan_path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``scan`` sub-command to ``sub``."""
    parser = command(
        sub,
        "scan",
        _run,
        help="inventory a test tree's platform predicates and what replaces each",
        description="Walk the Python files under PATH (with the ast module), list every "
        "platform predicate (is_rocm(), torch.cuda.is_available(), torch.version.hip, "
        "has_device_capability(...), on_gfx9() ...), group them by what they ask and name the "
        "accelplat requirement or drop-in that replaces each. Imports nothing it scans.",
    )
    path(parser.add_argument("path", help="a test directory or a .py file"))
    add_common(parser, json=True)
    parser.add_argument(
        "--markdown", action="store_true", help="print the summary as Markdown tables"
    )
    parser.add_argument(
        "--files", action="store_true", help="also list every finding (file:line predicate)"
    )


def _rows(title: str, counts: dict[str, int], total: int) -> list[str]:
    out = [f"| {title} | count | share |", "| --- | ---: | ---: |"]
    for key, n in counts.items():
        out.append(f"| `{key}` | {n} | {100 * n / total:.1f} % |" if total else f"| {key} | {n} |")
    return out


def render_markdown(report: ScanReport) -> str:
    """Return the scan's summary as Markdown (what ``docs/capabilities.md`` shows).

    Args:
        report: A finished scan.
    """
    s = report.summary()
    total = s["predicates"]
    lines = [
        f"{total} platform predicates in {s['files_with_predicates']} of {s['files_scanned']} "
        f"files; {s['replaceable']} ({100 * s['replaceable'] / max(1, total):.1f} %) have an "
        "accelplat replacement.",
        "",
        "| What it asks | predicates | replaceable |",
        "| --- | ---: | ---: |",
    ]
    for group in GROUPS:
        if group in s["by_group"]:
            lines.append(
                f"| {group} | {s['by_group'][group]} | {s['by_group_replaceable'][group]} |"
            )
    lines += ["", *_rows("Predicate", s["by_predicate"], total), ""]
    lines += _rows("Replaced by", s["by_replacement"], total)
    return "\n".join(lines)


def _text(report: ScanReport, files: bool) -> str:
    s = report.summary()
    total = s["predicates"]
    lines = [
        f"{report.root}: {total} platform predicates in {s['files_with_predicates']} of "
        f"{s['files_scanned']} files; {s['replaceable']} replaceable",
        "by what they ask (predicates / replaceable):",
    ]
    for group in GROUPS:
        if group in s["by_group"]:
            lines.append(
                f"  {group:<30} {s['by_group'][group]:>6} {s['by_group_replaceable'][group]:>6}"
            )
    lines.append("by predicate:")
    lines += [f"  {k:<40} {n:>6}" for k, n in s["by_predicate"].items()]
    lines.append("replaced by:")
    lines += [f"  {k:<40} {n:>6}" for k, n in s["by_replacement"].items()]
    if files:
        lines.append("findings:")
        for f in report.findings:
            lines.append(
                f"  {f.path}:{f.line}: {f.predicate} [{f.use}, {f.group}] -> "
                f"{f.replacement or 'no replacement'}"
            )
    for error in report.errors:
        lines.append(f"skipped {error}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    report = scan_path(args.path)
    if args.json:
        print(dumps(report.to_json(), indent=2))
    elif args.markdown:
        print(render_markdown(report))
    else:
        print(_text(report, args.files))
    return 0
