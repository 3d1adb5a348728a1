"""Compare two pytest runs of the same vLLM tests, test id by test id.

Reads the JUnit XML reports of the run with vLLM's own helpers ("original") and the run with
accelplat's ("migrated") and the allow-list (``allowlist.txt``: ``<test id> <original outcome>
<migrated outcome>`` per line, ``#`` comments; every entry is justified in
docs/migrating-vllm-tests.md). Prints every difference, then as its last line the counts.

Exit status: 0 when every test id ran in both runs and every difference is allowed; 1
otherwise (an unexplained difference, a test id in only one run, or no test at all).

Usage: python compare.py ORIGINAL.xml MIGRATED.xml ALLOWLIST
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(report: Path) -> dict[str, str]:
    """Return ``{test id: outcome}`` from a pytest JUnit XML report."""
    result: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        test_id = f"{classname}::{name}"
        outcome = "passed"
        for child in case:
            if child.tag == "failure":
                outcome = "failed"
            elif child.tag == "error":
                outcome = "error"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        # a test that fails and then errors in teardown has two elements: keep the worst
        if result.get(test_id) in ("failed", "error") and outcome == "passed":
            continue
        result[test_id] = outcome
    return result


def allowed(path: Path) -> set[tuple[str, str, str]]:
    """Return the allowed ``(test id, original, migrated)`` triples."""
    entries: set[tuple[str, str, str]] = set()
    for line in path.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            test_id, original, migrated = entry.split()
            entries.add((test_id, original, migrated))
    return entries


def main() -> int:
    """Compare the two reports named on the command line; return the exit status."""
    original = outcomes(Path(sys.argv[1]))
    migrated = outcomes(Path(sys.argv[2]))
    allow = allowed(Path(sys.argv[3]))
    identical = different = unexplained = 0
    for test_id in sorted(set(original) | set(migrated)):
        before = original.get(test_id, "absent")
        after = migrated.get(test_id, "absent")
        print(f"  {before:>8} -> {after:<8} {test_id}")
        if before == after:
            identical += 1
            continue
        different += 1
        if (test_id, before, after) not in allow:
            unexplained += 1
            print(
                f"UNEXPLAINED DIFFERENCE: {test_id}: {before} with vLLM's helpers, {after} "
                "with accelplat's"
            )
    ok = unexplained == 0 and bool(original) and bool(migrated)
    print(
        f"vllm-suite: tests run original {len(original)} / migrated {len(migrated)}, "
        f"identical {identical}, different {different} "
        f"({different - unexplained} allowed, {unexplained} unexplained)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
