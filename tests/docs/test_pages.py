"""The documentation's pages render as written: no escaped pipe shown as ``\\|`` in a table."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_table_row_escapes_a_pipe() -> None:
    """Python-Markdown (MkDocs) keeps the backslash of ``\\|`` in a table: ``str \\| None``.

    A pipe inside backticks needs no escape there, but GitHub's renderer splits the cell on it:
    the pages say "or" instead.
    """
    rows = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if line.startswith("|") and "\\|" in line
    ]
    assert rows == []
