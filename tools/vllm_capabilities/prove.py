"""Prove on every modelled host that the scan's replacements and the migration keep decisions.

Usage::

    python tools/vllm_capabilities/prove.py VLLM_TESTS_DIR [--json] [--check]

Static: nothing is imported from the tree, nothing is collected. For every condition the
translator (``accelplat/_translate.py``) replaces in ``VLLM_TESTS_DIR``, it evaluates the
original with vLLM 0.33's semantics (``vllm_model.py``) and the replacement with accelplat's
answer on each host of ``hosts.py``, then migrates every file in memory (``migrate.py``) and
checks every requirement the migrated file carries the same way. Prints the figures:

* platform predicates: calls of ``is_cuda/is_rocm/is_xpu/is_cpu/is_tpu/is_cuda_alike``,
  ``torch.cuda.is_available()``, ``torch.xpu.is_available()``, ``torch.version.hip``,
  ``hasattr(torch, "xpu")`` (the scan's kind ``platform``); the share replaceable with identical
  decisions on every host through the built-in vocabulary (no project table is used at all,
  so "overall" is the same figure);
* decision changes (condition x host pairs whose answer differs; must be 0);
* scan precision (share of the scan's stated replacements identical on every host) and recall
  (share of predicates inside a skip decision that get an identical replacement).

``--check`` exits 1 unless there are 0 decision changes (and no original that raises where its
replacement decides), precision >= 95 %, and the built-in share >= 55 %.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

import hosts as modelled  # noqa: E402
import migrate  # noqa: E402
from vllm_model import RAISES, Host, UnmodelledError, evaluate, gcn_capability  # noqa: E402

from accelplat import _scan, _translate  # noqa: E402
from accelplat._util import shown  # noqa: E402

__all__ = ["Host", "gcn_capability", "prove"]  # what the tests read besides the figures
_DECIDING = ("count", "memory", "quant")  # kinds the translator does not replace


@dataclass
class _Check:  # one translated part of one condition
    where: str  # path:line
    original: ast.AST
    requirement: str  # true where the original is
    run_if: str  # true where it is false


def _original(site: _translate.Site) -> ast.AST:
    first, last = site.span
    if first is last:
        return first
    assert isinstance(site.node, ast.BoolOp)
    return ast.BoolOp(op=site.node.op, values=site.node.values[site.first : site.last + 1])


def _call_text(code: str) -> str:
    """``func:requirement`` of one replacement call (``accelplat.has("rocm")``)."""
    call = ast.parse(code, mode="eval").body
    assert isinstance(call, ast.Call)
    assert isinstance(call.args[0], ast.Constant)
    return f"{ast.unparse(call.func)}:{call.args[0].value}"


def _migrated_requirements(source: str) -> list[str]:
    """The requirement texts a migrated file carries, in source order."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "accelplat.has", "accelplat.testing.requires", "accelplat.testing.skip_module_unless",
        ):  # fmt: skip
            arg = node.args[0]
            assert isinstance(arg, ast.Constant)
            assert isinstance(arg.value, str)
            found.append((node.lineno, node.col_offset, ast.unparse(node.func), arg.value))
    return [f"{kind}:{text}" for _, _, kind, text in sorted(found)]


def _one_file(
    rel: str, source: str
) -> tuple[list[_scan.Finding], list[_Check], dict[int, int], bool]:
    """One file's findings, checks, each finding's check, and whether its migration differs."""
    findings: list[_scan.Finding] = []
    checks: list[_Check] = []
    check_of: dict[int, int] = {}
    by_site: dict[int, int] = {}
    expected = []
    for p in _scan.placed(ast.parse(source)):
        text = (
            None if p.site is None or p.decision is None else _scan.replacement(p.decision, p.site)
        )
        findings.append(
            _scan.Finding(rel, getattr(p.node, "lineno", 0), p.predicate, p.kind, p.use, text)
        )
        if p.site is None or text is None:
            continue
        if id(p.site) not in by_site:
            by_site[id(p.site)] = len(checks)
            where = f"{rel}:{getattr(p.site.span[0], 'lineno', 0)}"
            checks.append(_Check(where, _original(p.site), p.site.requirement, p.site.run_if))
            expected.append((p.site.span[0], text))
        check_of[len(findings) - 1] = by_site[id(p.site)]
    if not expected:
        return findings, checks, check_of, False
    new, _ = migrate.rewrite(source)  # it writes exactly these, in the same order, nothing else
    expected.sort(key=lambda e: (e[0].lineno, e[0].col_offset))  # type: ignore[attr-defined]
    want = [_call_text(t) for _, t in expected]
    return findings, checks, check_of, _migrated_requirements(new) != want


def collect(
    tests: Path,
) -> tuple[list[_scan.Finding], list[_Check], dict[int, int], list[str], list[str]]:
    """Findings, checks, each finding's check, migration mismatches, and the files left out."""
    findings: list[_scan.Finding] = []
    checks: list[_Check] = []
    check_of: dict[int, int] = {}
    mismatches: list[str] = []
    paths, skipped = migrate.test_files(tests, None)
    for path in paths:
        rel = str(path.relative_to(tests))
        try:
            got, got_checks, got_of, differs = _one_file(rel, migrate.read_source(path))
        except migrate.UNREADABLE as exc:  # a hostile file: left out, named, the rest goes on
            skipped.append(f"{shown(rel)}: {type(exc).__name__}")
            continue
        check_of.update({len(findings) + i: len(checks) + c for i, c in got_of.items()})
        findings += got
        checks += got_checks
        if differs:
            mismatches.append(rel)
    return findings, checks, check_of, mismatches, skipped


def prove(tests: Path, bundles: Path = modelled.BUNDLES) -> dict[str, object]:
    """Every figure, JSON-ready; hosts replayed from ``bundles`` where a bundle is there."""
    findings, checks, check_of, mismatches, skipped = collect(tests)
    texts = sorted({t for c in checks for t in (c.requirement, c.run_if)})
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # a child interpreter each
        replies = list(pool.map(lambda h: modelled.answers(h, texts, bundles), modelled.ALL))
    per_host = {h.name: reply[0] for h, reply in zip(modelled.ALL, replies, strict=True)}
    sources = {h.name: reply[1] for h, reply in zip(modelled.ALL, replies, strict=True)}
    changed: Counter[str] = Counter()
    raises: Counter[str] = Counter()
    unmodelled: list[str] = []
    bad_checks: set[int] = set()
    examples: list[str] = []
    for i, check in enumerate(checks):
        for host in modelled.ALL:
            try:
                original = evaluate(check.original, host)
            except UnmodelledError as exc:
                unmodelled.append(f"{check.where}: {exc}")
                bad_checks.add(i)
                break
            got = per_host[host.name]
            if original is RAISES:
                raises[host.name] += 1
                bad_checks.add(i)
                continue
            if got[check.requirement] != original or got[check.run_if] == original:
                changed[host.name] += 1
                bad_checks.add(i)
                if len(examples) < 20:
                    examples.append(f"{check.where} on {host.name}: {check.requirement!r}")
    platform = [i for i, f in enumerate(findings) if f.kind == "platform"]
    identical = {i for i in check_of if check_of[i] not in bad_checks}
    stated = [i for i, f in enumerate(findings) if f.replacement]
    deciding = [
        i for i, f in enumerate(findings)
        if f.use in ("skipif", "skip") and f.kind not in _DECIDING
    ]  # fmt: skip
    fused = [c for c in bad_checks if "test_fused_deepseek_v32_norm_rope" in checks[c].where]

    def share(part: int, whole: int) -> float:
        return round(100 * part / whole, 1) if whole else 0.0

    builtin = sum(1 for i in platform if i in identical)
    return {
        "files": len({f.path for f in findings}),
        "predicates": len(findings),
        "platform_predicates": len(platform),
        "platform_replaceable_builtin": builtin,
        "platform_replaceable_builtin_pct": share(builtin, len(platform)),
        "platform_replaceable_overall_pct": share(builtin, len(platform)),
        "conditions_checked": len(checks),
        "hosts": {h.name: sources[h.name] for h in modelled.ALL},
        "decision_changes": sum(changed.values()),
        "decision_changes_by_host": dict(changed),
        "original_raises_by_host": dict(raises),
        "unmodelled": unmodelled,
        "examples": examples,
        "scan_stated": len(stated),
        "scan_precision_pct": share(sum(1 for i in stated if i in identical), len(stated)),
        "scan_recall_pct": share(sum(1 for i in deciding if i in identical), len(deciding)),
        "migration_mismatched_files": mismatches,
        "skipped_files": skipped,
        "fused_deepseek_v32_norm_rope_changes": len(fused),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the figures; with ``--check``, fail below the bars."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("tests", type=Path, help="vLLM's tests/ directory")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--bundles", type=Path, default=modelled.BUNDLES, help="replay bundles (tests/hosts)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 below the bars")
    args = parser.parse_args(argv)
    figures = prove(args.tests, args.bundles)
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        f = figures
        print(
            f"{f['platform_predicates']} platform predicates; "
            f"{f['platform_replaceable_builtin']} ({f['platform_replaceable_builtin_pct']} %) "
            "replaceable with identical decisions on every host through the built-in "
            f"vocabulary alone (overall, project tables included: "
            f"{f['platform_replaceable_overall_pct']} %)"
        )
        print(f"{f['conditions_checked']} translated conditions x {len(modelled.ALL)} hosts:")
        for name, source in f["hosts"].items():  # type: ignore[attr-defined]
            print(f"  {name:<14} {source}")
        print(f"decision changes: {f['decision_changes']} {f['decision_changes_by_host']}")
        raises = f["original_raises_by_host"]
        print(f"original raises on a host (not identical; fails --check): {raises}")
        print(f"scan: {f['scan_stated']} stated replacements, precision "
              f"{f['scan_precision_pct']} %, recall {f['scan_recall_pct']} %")  # fmt: skip
        print(f"migration output differing from the checked requirements: "
              f"{len(f['migration_mismatched_files'])} files")  # type: ignore[arg-type]  # fmt: skip
        print(f"files left out: {len(f['skipped_files'])}")  # type: ignore[arg-type]
        print(f"test_fused_deepseek_v32_norm_rope.py changes: "
              f"{f['fused_deepseek_v32_norm_rope_changes']}")  # fmt: skip
        for line in [*f["skipped_files"], *f["unmodelled"], *f["examples"]][:40]:  # type: ignore[misc]
            print(f"  {line}")
    ok = (
        figures["decision_changes"] == 0
        and not figures["original_raises_by_host"]
        and not figures["unmodelled"]
        and not figures["migration_mismatched_files"]
        and float(figures["scan_precision_pct"]) >= 95  # type: ignore[arg-type]
        and float(figures["platform_replaceable_builtin_pct"]) >= 55  # type: ignore[arg-type]
    )
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
