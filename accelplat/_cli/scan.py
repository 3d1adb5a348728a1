"""``accelplat scan PATH``: inventory a test tree's platform predicates for a migration.

``--json`` prints ``schema``, :meth:`accelplat._scan.ScanReport.summary` and every finding.
``--diff BASE`` exits 1 when platform predicates were added since git revision ``BASE`` (a
ratchet). File names come from the scanned tree: the text and Markdown forms escape them.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TYPE_CHECKING

from accelplat._cli._args import add_common, path
from accelplat._cli._errors import dumps
from accelplat._util import printable

if TYPE_CHECKING:  # the scanner loads when the command runs
    from accelplat._scan import Finding, ScanReport

_HELP = "inventory a test tree's platform predicates and what replaces each"
_DESCRIPTION = (
    "Walk the Python files under PATH (with the ast module), list every "
    "platform predicate (is_rocm(), torch.cuda.is_available(), torch.version.hip, "
    "has_device_capability(...), on_gfx9() ...), group them by what they ask and name the "
    "exact accelplat requirement that replaces each, translated from the condition's syntax "
    "tree, or the kind of knowledge that has none. With --diff BASE, fail (exit 1) when "
    "platform predicates were added since the git revision BASE. Imports nothing it scans."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``scan`` sub-command to ``sub``."""
    parser = sub.add_parser("scan", help=_HELP, description=_DESCRIPTION)
    parser.set_defaults(func=_run)
    path(parser.add_argument("path", help="a test directory or a .py file"))
    add_common(parser, json=True)
    add = parser.add_argument
    add("--markdown", action="store_true", help="print the summary as Markdown")
    add("--files", action="store_true", help="also list every finding (file:line predicate)")
    ratchet = "exit 1 if platform predicates were added since git revision BASE (moved lines "
    add("--diff", metavar="BASE", help=ratchet + "are not added); lists them")


# the summary's tables: its key, the Markdown and the text titles, the text's first column width
_SECTIONS = (
    ("by_predicate", "Predicate", "by predicate", 40),
    ("by_replacement", "Replaced by", "replaced by", 40),
    ("without_replacement", "No exact replacement", "no exact replacement", 64),
)


def render_markdown(report: ScanReport) -> str:
    """Return the scan's summary as Markdown (what ``docs/migrating-vllm-tests.md`` shows)."""
    s = report.summary()
    total = s["predicates"]
    lines = [
        f"{total} platform predicates in {s['files_with_predicates']} of {s['files_scanned']} "
        f"files; {s['replaceable']} ({100 * s['replaceable'] / max(1, total):.1f} %) have an "
        "exact accelplat replacement.",
    ]
    for key, title, _, _ in _SECTIONS:  # a section has no rows when the total is 0
        rows = [f"| `{k}` | {n} | {100 * n / total:.1f} % |" for k, n in s[key].items()]
        lines += ["", f"| {title} | count | share |", "| --- | ---: | ---: |", *rows]
    return "\n".join(printable(line) for line in lines)


def _line(f: Finding) -> str:
    said = f.replacement or f"no exact replacement: {f.missing}"
    return f"  {f.path}:{f.line}: {f.predicate} [{f.use}] -> {said}"


def _text(report: ScanReport, files: bool) -> str:
    s = report.summary()
    lines = [
        f"{report.root}: {s['predicates']} platform predicates in {s['files_with_predicates']} "
        f"of {s['files_scanned']} files; {s['replaceable']} with an exact replacement",
    ]
    for key, _, title, width in _SECTIONS:
        lines += [f"{title}:", *(f"  {k:<{width}} {n:>6}" for k, n in s[key].items())]
    if files:
        lines += ["findings:"] + [_line(f) for f in report.findings]
    lines += [f"skipped {error}" for error in report.errors]
    return "\n".join(printable(line) for line in lines)


def _run(args: argparse.Namespace) -> int:
    from accelplat._scan import added_since, scan_path

    if args.diff is not None:
        report, added = added_since(args.path, args.diff)
        if args.json:
            doc = {**report.to_json(), "base": args.diff, "added": [asdict(f) for f in added]}
            print(dumps(doc, indent=2))
        else:
            head = f"{len(added)} platform predicate(s) added since {args.diff}"
            print("\n".join(printable(line) for line in [head, *(_line(f) for f in added)]))
        return 1 if added else 0
    report = scan_path(args.path)
    if args.json:
        print(dumps(report.to_json(), indent=2))
    else:
        print(render_markdown(report) if args.markdown else _text(report, args.files))
    return 0
