"""``accelplat scan PATH``: inventory a test tree's platform predicates for a migration.

``--json`` prints ``schema``, :meth:`accelplat._scan.ScanReport.summary` and every finding. File
names come from the scanned tree: the text and Markdown forms escape them (``printable``).
"""

from __future__ import annotations

import argparse

from accelplat._cli._args import add_common, command, path
from accelplat._cli._errors import dumps
from accelplat._scan import ScanReport, scan_path
from accelplat._util import printable

_HELP = "inventory a test tree's platform predicates and what replaces each"
_DESCRIPTION = (
    "Walk the Python files under PATH (with the ast module), list every "
    "platform predicate (is_rocm(), torch.cuda.is_available(), torch.version.hip, "
    "has_device_capability(...), on_gfx9() ...), group them by what they ask and name the "
    "accelplat requirement or drop-in that replaces each. Imports nothing it scans."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``scan`` sub-command to ``sub``."""
    parser = command(sub, "scan", _run, help=_HELP, description=_DESCRIPTION)
    path(parser.add_argument("path", help="a test directory or a .py file"))
    add_common(parser, json=True)
    parser.add_argument("--markdown", action="store_true", help="print the summary as Markdown")
    parser.add_argument(
        "--files", action="store_true", help="also list every finding (file:line predicate)"
    )


def _rows(title: str, counts: dict[str, int], total: int) -> list[str]:
    out = [f"| {title} | count | share |", "| --- | ---: | ---: |"]
    for key, n in counts.items():
        out.append(f"| `{key}` | {n} | {100 * n / total:.1f} % |" if total else f"| {key} | {n} |")
    return out


def render_markdown(report: ScanReport) -> str:
    """Return the scan's summary as Markdown (what ``docs/capabilities.md`` shows)."""
    s = report.summary()
    total = s["predicates"]
    lines = [
        f"{total} platform predicates in {s['files_with_predicates']} of {s['files_scanned']} "
        f"files; {s['replaceable']} ({100 * s['replaceable'] / max(1, total):.1f} %) have an "
        "accelplat replacement.",
        "",
        "| What it asks | predicates | replaceable |",
        "| --- | ---: | ---: |",
        *(f"| {g} | {n} | {s['by_group_replaceable'][g]} |" for g, n in s["by_group"].items()),
        "",
        *_rows("Predicate", s["by_predicate"], total),
        "",
        *_rows("Replaced by", s["by_replacement"], total),
    ]
    return "\n".join(printable(line) for line in lines)


def _text(report: ScanReport, files: bool) -> str:
    s = report.summary()
    lines = [
        f"{report.root}: {s['predicates']} platform predicates in {s['files_with_predicates']} "
        f"of {s['files_scanned']} files; {s['replaceable']} replaceable",
        "by what they ask (predicates / replaceable):",
        *(f"  {g:<30} {n:>6} {s['by_group_replaceable'][g]:>6}" for g, n in s["by_group"].items()),
        "by predicate:",
        *(f"  {k:<40} {n:>6}" for k, n in s["by_predicate"].items()),
        "replaced by:",
        *(f"  {k:<40} {n:>6}" for k, n in s["by_replacement"].items()),
    ]
    if files:
        lines += ["findings:"] + [
            f"  {f.path}:{f.line}: {f.predicate} [{f.use}, {f.group}] -> "
            f"{f.replacement or 'no replacement'}"
            for f in report.findings
        ]
    lines += [f"skipped {error}" for error in report.errors]
    return "\n".join(printable(line) for line in lines)


def _run(args: argparse.Namespace) -> int:
    report = scan_path(args.path)
    if args.json:
        print(dumps(report.to_json(), indent=2))
    else:
        print(render_markdown(report) if args.markdown else _text(report, args.files))
    return 0
