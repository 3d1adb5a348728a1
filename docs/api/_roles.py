"""MkDocs hook: turn reST roles left in rendered docstrings into cross-references.

Docstrings in accelplat name other objects the Sphinx way, e.g.
``:class:`~accelplat.errors.DeviceNotFoundError```. Markdown renders that as the text
``:class:`` followed by inline code. This hook, run on every page's HTML, replaces the pair with
an optional mkdocs-autorefs reference: a link where the object is documented, plain code where it
is not. A leading ``~`` shows only the last component, as in Sphinx; functions and methods get
``()``. A name that is not fully qualified (``:meth:`stop```) is looked up among the objects
documented on the same page, nearest to where it is used first.
"""

from __future__ import annotations

import html
import re
from typing import Any

_ROLE = re.compile(
    r":(?P<role>class|func|meth|mod|attr|data|exc|obj|const|py:\w+):"
    r"<code>(?P<tilde>~?)(?P<target>[A-Za-z_][\w.]*)(?:\(\))?</code>"
)
_ANCHOR = re.compile(r'<h\d id="(?P<id>accelplat[\w.]*)"')


def _resolve(target: str, anchors: list[tuple[int, str]], pos: int) -> str:
    if target.startswith("accelplat"):
        return target
    suffix = "." + target
    here = next((ident for start, ident in reversed(anchors) if start < pos), "")
    candidates = [ident for _, ident in anchors if ident.endswith(suffix)]
    if not candidates:
        return target
    return max(candidates, key=lambda c: (_shared(c, here), -len(c)))


def _shared(a: str, b: str) -> int:
    """Count the leading dotted components ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        n += 1
    return n


def on_page_content(html_text: str, **kwargs: Any) -> str:
    """Rewrite the roles in one page's HTML (MkDocs ``on_page_content`` event)."""
    anchors = [(m.start(), m.group("id")) for m in _ANCHOR.finditer(html_text)]

    def replace(match: re.Match[str]) -> str:
        role = match.group("role").removeprefix("py:")
        target = _resolve(match.group("target"), anchors, match.start())
        shown = match.group("target")
        title = shown.rsplit(".", 1)[-1] if match.group("tilde") else shown
        if role in ("func", "meth"):
            title += "()"
        ident = html.escape(target, quote=True)
        return f'<autoref identifier="{ident}" optional><code>{html.escape(title)}</code></autoref>'

    return _ROLE.sub(replace, html_text)
