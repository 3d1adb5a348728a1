"""Migrate a vLLM source tree's tests/utils.py and tests/conftest.py to accelplat's helpers.

This is the migration a vLLM maintainer would make, and nothing more:

* ``tests/utils.py``: the definitions of the helpers accelplat provides under the same names
  (:data:`REPLACED`) are deleted and one import line brings accelplat's in their place, so every
  ``from tests.utils import …`` / ``from ...utils import …`` in the test tree keeps working.
* ``tests/conftest.py``: its function-level ``from tests.utils import <helper>`` lines for those
  helpers import from ``accelplat.integrations.vllm`` instead.

No call site changes: vLLM's runners, fixtures and tests call the helpers exactly as before.
Definitions are found with the ``ast`` module, so the script fails loudly (exit 1) when a name
is missing instead of silently leaving vLLM's version in place.

Usage: python migrate.py VLLM_TREE
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MODULE = "accelplat.integrations.vllm"

REPLACED = (
    "record_gpu_memory_usage_stats",
    "wait_for_gpu_memory_to_clear",
    "wait_for_memory_to_settle",
    "requires_spawn_multiprocessing",
    "fork_new_process_for_each_test",
    "spawn_new_process_for_each_test",
    "create_new_process_for_each_test",
    "large_gpu_mark",
    "large_gpu_test",
    "multi_gpu_marks",
    "multi_gpu_test",
)


def migrate_utils(path: Path) -> None:
    """Delete the replaced definitions from ``path`` and import accelplat's instead."""
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    spans: list[tuple[int, int]] = []
    found: set[str] = set()
    last_import = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.end_lineno is not None:
            last_import = max(last_import, node.end_lineno)
        if isinstance(node, ast.FunctionDef) and node.name in REPLACED:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            spans.append((first, node.end_lineno))
            found.add(node.name)
    missing = sorted(set(REPLACED) - found)
    if missing:
        sys.exit(f"migrate: {path} does not define {missing}; refusing a partial migration")
    for first, last in sorted(spans, reverse=True):
        del lines[first - 1 : last]
    names = "".join(f"    {name},\n" for name in REPLACED)
    lines.insert(last_import, f"from {MODULE} import (  # migrated to accelplat\n{names})\n")
    path.write_text("".join(lines))


def migrate_conftest(path: Path) -> int:
    """Point ``from tests.utils import <helper>`` lines at accelplat; return how many changed."""
    text = path.read_text()
    pattern = re.compile(r"^(\s*)from tests\.utils import ([\w, ]+)$", re.MULTILINE)
    changed = 0

    def repoint(match: re.Match[str]) -> str:
        nonlocal changed
        names = [n.strip() for n in match.group(2).split(",")]
        if not all(n in REPLACED for n in names):
            return match.group(0)
        changed += 1
        return f"{match.group(1)}from {MODULE} import {', '.join(names)}"

    path.write_text(pattern.sub(repoint, text))
    return changed


def main() -> None:
    """Migrate the tree named on the command line."""
    root = Path(sys.argv[1])
    migrate_utils(root / "tests" / "utils.py")
    changed = migrate_conftest(root / "tests" / "conftest.py")
    print(
        f"migrate: tests/utils.py imports {len(REPLACED)} helpers from {MODULE}; "
        f"tests/conftest.py: {changed} import lines repointed"
    )


if __name__ == "__main__":
    main()
