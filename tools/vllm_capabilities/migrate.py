"""Rewrite vLLM test files' platform skip conditions as accelplat requirements.

Usage::

    python tools/vllm_capabilities/migrate.py VLLM_SOURCE_ROOT [--files LIST | --all] [--dry-run]

Every condition is translated by ``accelplat/_translate.py``, the translator ``accelplat scan``
uses, so a rewrite is made only where the requirement is true exactly where the condition is:

* ``pytest.mark.skipif(<condition>, reason=...)`` whose whole condition translates becomes
  ``accelplat.testing.requires("<run if>")``, a plain skipif mark decided when the module is
  imported (it skips correctly with or without accelplat's pytest plugin);
* a module-level ``if <condition>: pytest.skip(..., allow_module_level=True)`` becomes
  ``accelplat.testing.skip_module_unless("<run if>")``;
* in any other skip decision (a ``skipif`` or ``xfail`` condition, an ``if`` that skips) the
  widest part that translates becomes ``accelplat.has("<requirement>")``, the rest unchanged.

Nothing else changes, except one ``import accelplat.testing`` line; no capability table is
needed (the built-in vocabulary expresses every rewrite). Files are edited in place: run it on a
copy. ``--all`` rewrites every test file; ``--files`` takes a list such as ``files.txt`` (paths
relative to ``tests/``, ``#`` comments allowed). Prints one line per file rewritten.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from accelplat import _files, _scan  # noqa: E402  (the checkout's accelplat, next to this tool)
from accelplat._util import shown  # noqa: E402

IMPORT = "import accelplat.testing  # migrated to accelplat requirements\n"


def edits(tree: ast.Module) -> list[tuple[ast.AST, ast.AST, str]]:
    """``(first node, last node, replacement text)`` for every rewrite of a parsed file."""
    out: list[tuple[ast.AST, ast.AST, str]] = []
    seen: set[int] = set()
    for p in _scan.placed(tree):
        if p.decision is None or p.site is None or id(p.site) in seen:
            continue
        seen.add(id(p.site))
        text = _scan.replacement(p.decision, p.site)
        if p.site.whole and p.decision.form in ("requires", "skip_module_unless"):
            out.append((p.place, p.place, text))  # the skipif call, or the whole if statement
        else:
            first, last = p.site.span
            out.append((first, last, text))
    return out


def _offsets(source: bytes) -> list[int]:
    starts = [0]
    for i, byte in enumerate(source):
        if byte == 0x0A:
            starts.append(i + 1)
    return starts


def _insert_at(tree: ast.Module) -> int:
    """The line before which the import goes: after the docstring and ``__future__`` imports."""
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and stmt is tree.body[0]
        ):
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        return stmt.lineno
    return (len(tree.body) and (tree.body[-1].end_lineno or 0) + 1) or 1


def rewrite(source: str) -> tuple[str, int]:
    """Return ``source`` with every translatable skip condition rewritten, and how many."""
    tree = ast.parse(source)
    changes = edits(tree)
    if not changes:
        return source, 0
    data = source.encode("utf-8")
    starts = _offsets(data)
    spans = []
    for first, last, text in changes:
        begin = starts[first.lineno - 1] + first.col_offset  # type: ignore[attr-defined]
        end = starts[last.end_lineno - 1] + last.end_col_offset  # type: ignore[attr-defined]
        spans.append((begin, end, text.encode("utf-8")))
    for begin, end, text in sorted(spans, reverse=True):
        data = data[:begin] + text + data[end:]
    lines = data.decode("utf-8").splitlines(keepends=True)
    at = _insert_at(tree) - 1
    lines[at:at] = [IMPORT]
    return "".join(lines), len(changes)


def test_files(tests: Path, listing: Path | None) -> tuple[list[Path], list[str]]:
    """The files to read (every ``*.py``, or ``listing``'s), and why others were left out.

    As ``accelplat scan`` walks: no links, no hidden directories, at most ``_scan.MAX_DEPTH``
    deep; a listed name outside ``tests`` or not a regular file is left out, named.
    """
    errors: list[str] = []
    if listing is None:
        return sorted(_scan._python_files(tests, errors)), errors
    names = [
        line.strip()
        for line in listing.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    root, found = tests.resolve(), []
    for name in names:
        path = tests / name
        if not path.resolve().is_relative_to(root):
            errors.append(f"{shown(name)}: outside {shown(str(tests))}, not read")
        elif path.is_symlink() or not path.is_file():
            errors.append(f"{shown(name)}: not a regular file")
        else:
            found.append(path)
    return found, errors


def read_source(path: Path) -> str:
    """A test file's text, read as ``accelplat scan`` reads it (bounded, regular files only).

    Raises:
        OSError: Unreadable, too large, not a regular file; ``UnicodeError`` for bytes.
    """
    return _files.read_live(path, limit=_scan.MAX_FILE_BYTES).decode("utf-8")


# what a hostile file raises while read or parsed: it is left out, named, and the rest goes on
UNREADABLE = (OSError, UnicodeError, SyntaxError, ValueError, RecursionError, MemoryError)


def main(argv: list[str] | None = None) -> int:
    """Run the migration; see the module docstring."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("root", type=Path, help="vLLM source root (holds tests/)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--files", type=Path, default=HERE / "files.txt")
    group.add_argument("--all", action="store_true", help="every test file")
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
    args = parser.parse_args(argv)
    tests = args.root / "tests"
    total = 0
    paths, errors = test_files(tests, None if args.all else args.files)
    for error in errors:
        print(f"{error}: skipped", file=sys.stderr)
    for path in paths:
        name = shown(str(path.relative_to(tests)))  # a name may hold terminal escapes
        try:
            new, count = rewrite(read_source(path))
        except UNREADABLE as exc:
            print(f"{name}: skipped ({type(exc).__name__})", file=sys.stderr)
            continue
        if count and not args.dry_run:
            path.write_text(new, encoding="utf-8")
        if count or not args.all:
            print(f"{name}: {count} condition(s) rewritten")
        total += count
    print(f"total: {total} condition(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
