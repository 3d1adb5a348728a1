"""Print the package's shape: lines by kind, module sizes, public names, the import graph.

Run from the repository root: ``python tools/package_figures.py``. The figures are the ones the
redesign reports (docs/architecture.md); the import graph is the one
``tests/contracts/test_architecture.py`` checks, string imports included.
"""

from __future__ import annotations

import ast
import graphlib
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.contracts import test_architecture as layers  # noqa: E402
from tests.contracts.test_exported_members import PUBLIC  # noqa: E402


def _kinds(text: str) -> tuple[int, int, int]:
    """Return (docstring, comment, blank) line counts of one module."""
    doc: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        owner = isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        for before, stmt in zip([None, *body], body, strict=False):
            documents = (before is None and owner) or isinstance(
                before, (ast.Assign, ast.AnnAssign)
            )
            value = getattr(stmt, "value", None)
            is_text = isinstance(value, ast.Constant) and isinstance(value.value, str)
            if documents and isinstance(stmt, ast.Expr) and is_text:
                doc.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    lines = list(enumerate(text.splitlines(), 1))
    comments = sum(1 for i, line in lines if line.strip().startswith("#") and i not in doc)
    blank = sum(1 for i, line in lines if not line.strip() and i not in doc)
    return len(doc), comments, blank


def main() -> None:
    """Print the figures."""
    sources = sorted((ROOT / "accelplat").rglob("*.py"))
    total = doc = comments = blank = 0
    sizes = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        d, c, b = _kinds(text)
        total, doc, comments, blank = total + n, doc + d, comments + c, blank + b
        sizes.append((n, str(path.relative_to(ROOT))))
    code = total - doc - comments - blank
    print(
        f"modules {len(sources)}, lines {total}: docstrings {doc}, comments {comments}, "
        f"blank {blank}, code {code}"
    )
    sizes.sort()
    print(f"median module {sizes[len(sizes) // 2][0]} lines; largest:")
    for n, name in sizes[-5:][::-1]:
        print(f"  {n:5d} {name}")
    names = {name: len(importlib.import_module(name).__all__) for name in PUBLIC}
    print(
        f"public names: {sum(names.values())} in {len(names)} public modules "
        f"(top level {names['accelplat']}): " + ", ".join(f"{k} {v}" for k, v in names.items())
    )
    graph = layers._graph()
    arrows = sum(len(v) for v in graph.values())
    up = [
        (m, t) for m, ts in graph.items() for t in ts if layers._layer_of(t) > layers._layer_of(m)
    ]
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
        circle = "no circle"
    except graphlib.CycleError as exc:
        circle = "a circle: " + " -> ".join(exc.args[1])
    print(
        f"import graph: {len(graph)} modules, {arrows} arrows, {len(up)} running up a layer, "
        f"{circle}"
    )


if __name__ == "__main__":
    main()
