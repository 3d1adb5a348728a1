"""Inventory a test tree's platform predicates, and name the exact replacement of each.

``accelplat scan PATH`` parses each ``*.py`` under ``PATH`` with :mod:`ast` (importing nothing)
and finds platform predicates (``is_rocm()``, ``on_gfx9()`` …). A predicate inside a condition
that decides whether tests run (a ``skipif``, an ``if`` that skips) is replaced by the
requirement :mod:`accelplat._translate` computes from the condition's syntax tree — true exactly
where the original is — or is listed with the kind of knowledge that has no exact replacement.
Nothing is chosen from the words around it. Every pass is linear in the file's size.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelplat import _files, _translate, _util
from accelplat._translate import dotted_name as _dotted
from accelplat._util import shown
from accelplat.errors import ConfigurationError, FileTooLargeError

MAX_FILE_BYTES = 2 * 1024**2  # larger files are listed as skipped, not parsed
MAX_DEPTH = 64  # directories deeper below the root are listed as skipped, not walked
_SCAN = _translate.VOCABULARY["scan"]  # the predicates and their kinds (_vllm_predicates.toml)
_DOTTED_CALLS: dict[str, str] = _SCAN["dotted_calls"]  # a dotted call -> its kind
_CALLS: dict[str, str] = _SCAN["calls"]  # a call by its own name -> its kind
_NAMES: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in _SCAN["names"].items()}
_TORCH_DEVICE_MODULES = _NAMES["torch_device_modules"]  # hasattr(torch, "xpu") in scanned code
_COUNT_FUNCTIONS, _MARKER_HELPERS = _NAMES["count_functions"], _NAMES["marker_helpers"]
_ROCM_ARCH_RE = re.compile(r"^on_(gfx\w+|mi\d\w*|cdna\d*|rdna\d*)$")  # these are "arch" too
_MAX_LITERAL = 40  # longer literal arguments are shown as "…"
_Where = tuple[str, ast.AST] | None  # ("skipif"|"if"|"marker"|"expression", node), or None
_GIT_TIMEOUT_S = 120  # one git call; a huge history reads a tree in seconds
FORMS = ("requires", "skip_module_unless", "has")  # the replacements, in report order


@dataclass(frozen=True)
class Finding:  # one platform predicate in one file
    path: str  # relative to the scanned root
    line: int  # 1-based
    predicate: str  # normalised: "is_rocm()", "has_device_capability(90)"
    kind: str  # platform, arch, dtype, graphs, count, memory or quant
    use: str  # skipif, skip, branch, expression or marker
    replacement: str | None  # accelplat.testing.requires("…"), accelplat.has("…") …, or None
    missing: str | None = None  # without a replacement: the kind of knowledge that has none
    source: str = ""  # the line, whitespace collapsed: what --diff compares


@dataclass
class ScanReport:
    root: str
    files_scanned: int = 0  # Python files parsed
    findings: list[Finding] = field(default_factory=list)  # in file and line order
    errors: list[str] = field(default_factory=list)  # "path: why", files or directories

    def summary(self) -> dict[str, Any]:
        """Return counts by predicate, use, replacement and missing kind, JSON-ready."""
        found = self.findings
        forms = Counter(
            f.replacement.partition("(")[0].rpartition(".")[2] for f in found if f.replacement
        )
        return {
            "root": self.root,
            "files_scanned": self.files_scanned,
            "files_with_predicates": len({f.path for f in found}),
            "predicates": len(found),
            "replaceable": sum(forms.values()),
            "by_predicate": dict(Counter(_family(f.predicate) for f in found).most_common()),
            "by_use": dict(Counter(f.use for f in found).most_common()),
            "by_replacement": {form: forms[form] for form in FORMS if forms[form]},
            "without_replacement": dict(
                Counter(f.missing for f in found if f.missing).most_common()
            ),
            "errors": list(self.errors),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "findings": [asdict(f) for f in self.findings]}


def _family(predicate: str) -> str:  # has_device_capability(90) -> has_device_capability(…)
    name, paren, rest = predicate.partition("(")
    return f"{name}(…)" if paren and rest != ")" and name != "hasattr" else predicate


def _literal(node: ast.AST) -> str:
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, str) and len(value) <= _MAX_LITERAL:
        return repr(value)
    if isinstance(value, int) and value.bit_length() <= 64:  # str() of a huge int raises
        return str(value)
    return "…"


def _predicate(node: ast.AST) -> tuple[str, str] | None:
    """Return ``(normalised predicate, kind)`` when ``node`` is a platform predicate."""
    if isinstance(node, ast.Attribute):
        hip = _dotted(node) == "torch.version.hip"  # a bounded walk down the attribute chain
        return ("torch.version.hip", "platform") if hip else None
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    dotted = _dotted(func) or ""
    if dotted in _DOTTED_CALLS:
        return f"{dotted}()", _DOTTED_CALLS[dotted]
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name == "hasattr" and len(node.args) == 2 and _dotted(node.args[0]) == "torch":
        attr = node.args[1]
        if isinstance(attr, ast.Constant) and attr.value in _TORCH_DEVICE_MODULES:
            return f'hasattr(torch, "{attr.value}")', "platform"
    kind = _CALLS.get(name) or ("arch" if _ROCM_ARCH_RE.match(name) else None)
    if kind is None:
        return None
    if name in _COUNT_FUNCTIONS and not (isinstance(func, ast.Name) or "platform" in dotted):
        return None  # a count only called bare or on a platform object
    args = [_literal(a) for a in node.args] if name in _NAMES["with_args"] else []
    if name in _MARKER_HELPERS:
        args += [f"{k.arg}={_literal(k.value)}" for k in node.keywords if k.arg]
    return f"{name}({', '.join(args)})", kind


def _is_skip_call(node: ast.AST, names: tuple[str, ...]) -> bool:  # pytest.skip(), skip() …
    return isinstance(node, ast.Call) and (_dotted(node.func) or "").rpartition(".")[2] in names


def _skips(block: list[ast.stmt]) -> ast.Call | None:
    """The skip call a block makes at its own level (``pytest.skip(...)``, ``raise SkipTest``)."""
    for stmt in block:
        call = stmt.value if isinstance(stmt, ast.Expr) else getattr(stmt, "exc", None)
        if isinstance(call, ast.Call) and _is_skip_call(call, ("skip", "SkipTest")):
            return call
    return None


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, _Where]]:
    """Yield each node in :func:`ast.walk`'s order and where it sits (the nearest)."""
    todo: deque[tuple[ast.AST, _Where]] = deque([(tree, None)])
    while todo:
        node, where = todo.popleft()
        yield node, where
        if _is_skip_call(node, ("skipif", "xfail")) and getattr(node, "args", None):
            where = ("skipif", node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
            where = ("expression", node)
        elif hasattr(node, "decorator_list"):  # a def or a class: its body says nothing yet
            where = None
        apart = {id(d): ("marker", d) for d in getattr(node, "decorator_list", ())}  # children
        if isinstance(node, ast.If):  # that sit apart: decorators, an if's test
            apart[id(node.test)] = ("if", node)
        todo.extend((c, apart.get(id(c), where)) for c in ast.iter_child_nodes(node))


# Kinds of a predicate that decides nothing about running (it picks a value or a path): no
# requirement replaces it, whatever it asks.
TOLERANCES = "tolerances chosen by platform"
VALUE_LISTS = "backend/kernel lists chosen by platform"
VALUES = "value chosen by platform"
CODE_PATH = "platform-specific code path"
COUNT = "device count or memory (not a platform condition)"
QUANT = "quantization-method support (project knowledge)"
_TOLERANCE_NAMES = ("atol", "rtol", "tol", "tolerance")


def _constant_like(node: ast.AST | None) -> bool:  # "FLASH_ATTN", ["A", "B"], ("x",) …
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_constant_like(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _context_kind(use: str, node: ast.AST) -> str:
    """Why a predicate outside a skip decision has no replacement, from what its place does."""
    branch = use == "branch" and isinstance(node, ast.If)
    if isinstance(node, ast.If) and branch:
        stores = [
            s for s in (*node.body, *node.orelse) if isinstance(s, (ast.Assign, ast.AugAssign))
        ]
        targets = [t for s in stores for t in getattr(s, "targets", [getattr(s, "target", None)])]
        keywords: list[str] = []
        values = [s.value for s in stores]
    else:
        targets = getattr(node, "targets", [getattr(node, "target", None)])
        keywords = [k.arg or "" for k in ast.walk(node) if isinstance(k, ast.keyword)]
        values = [v for x in ast.walk(node) if isinstance(x, ast.IfExp) for v in (x.body, x.orelse)]
    names = [_dotted(t) or "" for t in targets if t is not None] + keywords
    if any(n.rpartition(".")[2].lower().endswith(_TOLERANCE_NAMES) for n in names if n):
        return TOLERANCES  # atol = 1e-2 if is_rocm() else 1e-3; assert_close(..., atol=...)
    if values and all(_constant_like(v) for v in values):
        return VALUE_LISTS
    return CODE_PATH if branch else VALUES


def _own_kind(predicate: ast.AST) -> str | None:
    """The kind when the predicate alone has no replacement (a value, a torch build …)."""
    try:
        _translate.translate(predicate)
    except _translate.UnexpressibleError as exc:
        return None if exc.kind == _translate.NOT_A_PLATFORM else exc.kind
    return None


@dataclass(frozen=True)
class _Decision:  # a condition that decides whether tests run
    form: str  # "requires" (a skipif), "skip_module_unless" (a module-level skip) or "has"
    kinds: dict[int, str]  # an untranslated predicate (by identity) -> why
    owners: dict[int, _translate.Site]  # a node inside a site (by identity) -> the site
    reason: ast.expr | None = None  # the skip's own reason, kept by the replacement


def _decision(use: str, node: ast.AST, top: frozenset[int]) -> _Decision | None:
    """The decision ``node`` makes (``top``: the ids of the module's own statements)."""
    if use == "skipif" and isinstance(node, ast.Call) and node.args:
        skipif = _is_skip_call(node, ("skipif",)) and len(node.args) == 1
        condition, form = node.args[0], "requires" if skipif else "has"
        reason = _keyword(node, "reason")
    elif use == "if" and isinstance(node, ast.If):
        skip = _skips(node.body)
        if skip is None and _skips(node.orelse) is None:
            return None
        module = id(node) in top and not node.orelse
        whole_skip = module and skip is not None and len(node.body) == 1
        allowed = any(k.arg == "allow_module_level" for k in getattr(skip, "keywords", ()))
        condition, form = node.test, "skip_module_unless" if whole_skip and allowed else "has"
        said = skip.args[0] if skip is not None and skip.args else None
        reason = said or (None if skip is None else _keyword(skip, "reason"))
    else:
        return None
    found, kinds = _translate.sites(condition)
    # each node inside a site (by identity) -> that site: one walk of each
    owners = {id(n): site for site in found for part in site.parts for n in ast.walk(part)}
    return _Decision(form, kinds, owners, reason)


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def replacement(decision: _Decision, site: _translate.Site) -> str:
    """The code that replaces ``site`` of ``decision`` (a mark, a module skip or a ``has``)."""
    # the skip's own reason is kept, as written (a literal, an f-string, a name)
    said = "" if decision.reason is None else f", reason={ast.unparse(decision.reason)}"
    if site.whole and decision.form != "has":  # requires() or skip_module_unless()
        return f'accelplat.testing.{decision.form}("{site.run_if}"{said})'
    return f'accelplat.has("{site.requirement}")'


@dataclass(frozen=True)
class Placed:
    """One predicate with where it sits: what scan reports and the migration rewrites."""

    node: ast.AST
    predicate: str
    kind: str
    use: str
    place: ast.AST  # the skipif call, the if, the statement … it sits in
    decision: _Decision | None
    site: _translate.Site | None


def placed(tree: ast.Module) -> list[Placed]:
    """Every predicate of a parsed file, in :func:`ast.walk` order, with its decision and site."""
    top = frozenset(id(stmt) for stmt in tree.body)
    decide = functools.cache(_decision)  # once per place: a place holds many predicates
    out = []
    for node, where in _walk(tree):
        if (hit := _predicate(node)) is None:
            continue
        predicate, kind = hit
        use, place = where if where is not None else ("expression", tree)
        decision = decide(use, place, top)
        if use == "if":
            use = "branch" if decision is None else "skip"
        site = None
        if decision is not None and kind not in ("count", "memory", "quant"):
            site = decision.owners.get(id(node))  # the translated part that holds it
        out.append(Placed(node, predicate, kind, use, place, decision, site))
    return out


_MAX_SOURCE = 240  # characters of a finding's line kept (what --diff compares)


def scan_source(source: str, path: str = "<source>") -> list[Finding]:
    """Return one file's platform predicates in line order (``SyntaxError``, ``RecursionError``)."""
    tree = ast.parse(source, filename=path)
    lines = source.splitlines()
    found: list[Finding] = []
    context_kind = functools.cache(_context_kind)  # once per place
    for p in placed(tree):
        text, missing = None, None
        if p.kind in ("count", "memory", "quant"):
            missing = QUANT if p.kind == "quant" else COUNT
        elif p.decision is not None and p.site is not None:
            text = replacement(p.decision, p.site)
        elif p.decision is not None:
            missing = p.decision.kinds.get(id(p.node), _translate.NOT_A_PLATFORM)
        else:
            missing = _own_kind(p.node) or context_kind(p.use, p.place)
        line = getattr(p.node, "lineno", 0)
        said = _util.clip(lines[line - 1], 4 * _MAX_SOURCE) if 0 < line <= len(lines) else ""
        source_line = " ".join(said.split())[:_MAX_SOURCE]
        found.append(Finding(path, line, p.predicate, p.kind, p.use, text, missing, source_line))
    return sorted(found, key=lambda f: f.line)


def _python_files(base: Path, errors: list[str]) -> Iterator[Path]:
    """Yield ``base``'s ``*.py`` files in :func:`os.walk`'s order (no hidden dirs, no links).

    A link is never followed; one that could hold tests (a ``.py`` name, a directory, a loop)
    is listed in ``errors``.
    """

    def unreadable(exc: OSError) -> None:
        where = Path(exc.filename).relative_to(base)
        errors.append(f"{where}: unreadable ({exc.strerror or exc})")

    for top, dirs, files in os.walk(base, onerror=unreadable):
        here = Path(top)
        links = {name for name in dirs + files if os.path.islink(here / name)}
        for name in sorted(links):
            if name.endswith(".py") or not os.path.isfile(here / name):
                errors.append(f"{(here / name).relative_to(base)}: a link, not followed")
        yield from (here / n for n in sorted(files) if n.endswith(".py") and n not in links)
        dirs[:] = sorted(
            d for d in dirs if d not in links and not d.startswith((".", "__pycache__"))
        )
        if dirs and len(here.relative_to(base).parts) >= MAX_DEPTH:
            errors.append(
                f"{here.relative_to(base)}: more than {MAX_DEPTH} directories deep; "
                "its subdirectories are not scanned"
            )
            dirs.clear()


def scan_path(root: str | os.PathLike[str]) -> ScanReport:
    """Scan a ``.py`` file or a directory tree (``ConfigurationError`` if it is neither)."""
    base = Path(root)
    if not base.exists():
        raise ConfigurationError(f"path {shown(str(base))} does not exist")
    if not (base.is_dir() or base.is_file()):
        raise ConfigurationError(f"path {shown(str(base))} is neither a file nor a directory")
    report = ScanReport(str(base))
    for path in [base] if base.is_file() else _python_files(base, report.errors):
        rel = str(path.relative_to(base)) if base.is_dir() else path.name
        if path.is_symlink() or not path.is_file():
            report.errors.append(f"{rel}: not a regular file")
            continue
        try:
            # the user's test tree, not a host file: the live reader, never a replayed host's
            data = _files.read_live(path, limit=MAX_FILE_BYTES)
            found = scan_source(data.decode("utf-8"), rel)
        except FileTooLargeError:
            report.errors.append(f"{rel}: larger than {MAX_FILE_BYTES} bytes")
        except OSError as exc:
            report.errors.append(f"{rel}: unreadable ({exc.strerror or exc})")
        except (SyntaxError, UnicodeError, ValueError) as exc:
            report.errors.append(f"{rel}: does not parse ({type(exc).__name__})")
        except (RecursionError, MemoryError) as exc:  # the parser's answer to deep nesting
            report.errors.append(f"{rel}: does not parse (nested too deeply: {type(exc).__name__})")
        else:
            report.files_scanned += 1
            report.findings.extend(found)
    return report


def _git(root: Path, *args: str, data: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(  # no shell; the revision is one argument, never a pathspec
            ["git", "-C", str(root), *args], input=data, capture_output=True, check=False,
            timeout=_GIT_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"scan --diff: git could not run ({exc})") from exc
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["failed"]
        raise ConfigurationError(f"scan --diff: git {args[0]}: {why[0]}")
    return done.stdout


def _revision_sources(root: Path, base: str) -> Iterator[tuple[str, str]]:
    """``(path relative to root, text)`` of every ``*.py`` under ``root`` in revision ``base``."""
    directory = root if root.is_dir() else root.parent
    prefix = _git(directory, "rev-parse", "--show-prefix").decode().strip()
    where = prefix + ("" if root.is_dir() else root.name)
    listing = _git(directory, "ls-tree", "-r", "-z", "--full-name", "--name-only", base, "--", ".")
    names = [n for n in listing.decode("utf-8", "surrogateescape").split("\0") if n]
    names = [n for n in names if n.endswith(".py") and n.startswith(where)]
    if not names:
        return
    batch = "".join(f"{base}:{n}\n" for n in names).encode("utf-8", "surrogateescape")
    out = _git(directory, "cat-file", "--batch", data=batch)
    at = 0
    for name in names:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if len(header) != 3 or header[1] != b"blob":
            continue  # a link or a submodule: not a file of the tree
        size = int(header[2])
        blob, at = out[at : at + size], at + size + 1
        if size <= MAX_FILE_BYTES:
            rel = name[len(prefix) :] if root.is_dir() else root.name
            yield rel, blob.decode("utf-8", "replace")


def added_since(root: str | os.PathLike[str], base: str) -> tuple[ScanReport, list[Finding]]:
    """Scan ``root`` and return the predicates added since git revision ``base``.

    A predicate counts as added when its (predicate, source line) pair occurs more often now
    than in ``base``'s files under the same path, wherever in the tree: a moved line, or a
    file renamed, adds nothing. ``base`` is read with ``git cat-file``; nothing is checked out.

    Raises:
        ConfigurationError: ``root`` is not in a git work tree, or ``base`` is not a revision.
    """
    report = scan_path(root)
    if base.startswith("-"):
        raise ConfigurationError(f"scan --diff: {base!r} is not a revision")
    before: Counter[tuple[str, str]] = Counter()
    for rel, text in _revision_sources(Path(root), base):
        try:
            before.update((f.predicate, f.source) for f in scan_source(text, rel))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # a file that did not parse then adds nothing now
    added = []
    for finding in report.findings:
        key = (finding.predicate, finding.source)
        if before[key] > 0:
            before[key] -= 1
        else:
            added.append(finding)
    return report, added
