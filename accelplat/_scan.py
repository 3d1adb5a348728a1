"""Inventory a test tree's platform predicates, and name what replaces each.

``accelplat scan PATH`` parses each ``*.py`` under ``PATH`` with :mod:`ast` (importing nothing),
finds predicates (``is_rocm()``, ``on_gfx9()`` …) and, from where each sits and the words around
it, what it asks and what replaces it. Every pass is linear in the file's size.
"""

from __future__ import annotations

import ast
import os
import re
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelplat import _files
from accelplat._util import shown
from accelplat.errors import ConfigurationError, FileTooLargeError

MAX_FILE_BYTES = 2 * 1024**2  # larger files are listed as skipped, not parsed
MAX_DEPTH = 64  # directories deeper below the root are listed as skipped, not walked
_FEATURE = "feature/kernel/dtype support"
GROUPS = (  # what a predicate asks, in report order
    _FEATURE, "device count", "large memory", "memory waits", "graphs", "start method",
    "utilization", "tolerances", "other",
)  # fmt: skip
_PLATFORM_METHODS = frozenset({"is_rocm", "is_cuda", "is_cuda_alike", "is_xpu", "is_cpu", "is_tpu"})
_TORCH_DEVICE_MODULES = frozenset({"xpu", "hpu", "npu"})  # hasattr(torch, "xpu") in scanned code
_CAPABILITY_METHODS = frozenset(
    {"has_device_capability", "is_device_capability", "is_device_capability_family"}
    | {"get_device_capability"}
)
_DTYPE_METHODS = {
    "supports_fp8": "fp8", "is_fp8_fnuz": "fp8", "fp8_dtype": "fp8", "supports_mx": "mxfp4"
}  # fmt: skip
_COUNT_FUNCTIONS = frozenset({"cuda_device_count_stateless", "device_count"})
_MARKER_HELPERS = frozenset({"multi_gpu_test", "large_gpu_mark"})
_DOTTED_CALLS = {  # a dotted call -> its kind
    "torch.cuda.is_available": "platform", "torch.cuda.get_device_capability": "arch",
    "torch.cuda.device_count": "count", "torch.xpu.device_count": "count",
}  # fmt: skip
_CALLS = {  # a call by its own name -> its kind
    **dict.fromkeys(_PLATFORM_METHODS, "platform"),
    **dict.fromkeys(_CAPABILITY_METHODS, "arch"),
    **dict.fromkeys(_DTYPE_METHODS, "dtype"),
    **dict.fromkeys(_COUNT_FUNCTIONS, "count"),
    "is_quant_method_supported": "quant", "multi_gpu_test": "count", "large_gpu_mark": "memory",
}  # fmt: skip
_WITH_ARGS = _CAPABILITY_METHODS | _MARKER_HELPERS | {"is_quant_method_supported"}  # with arguments
_ROCM_ARCH_RE = re.compile(r"^on_(gfx\w+|mi\d\w*|cdna\d*)$")  # these are "arch" too
_SKIPPING = ("skipif", "skip", "marker")
_MAX_DOTTED = 32  # parts of a dotted name looked at: bounds the walk down an attribute chain
_MAX_LITERAL = 40  # longer literal arguments are shown as "…"
_Where = tuple[str, ast.AST] | None  # ("skipif"|"if"|"marker"|"expression", node), or None


@dataclass(frozen=True)
class Finding:  # one platform predicate in one file
    path: str  # relative to the scanned root
    line: int  # 1-based
    predicate: str  # normalised: "is_rocm()", "has_device_capability(90)"
    kind: str  # platform, arch, dtype, count, memory or quant
    use: str  # skipif, skip, branch, expression or marker
    group: str  # what it asks: one of GROUPS
    replacement: str | None  # the accelplat requirement or drop-in that replaces it


@dataclass
class ScanReport:
    root: str
    files_scanned: int = 0  # Python files parsed
    findings: list[Finding] = field(default_factory=list)  # in file and line order
    errors: list[str] = field(default_factory=list)  # "path: why", files or directories

    def summary(self) -> dict[str, Any]:
        """Return counts by predicate, group and replacement kind, JSON-ready."""
        found = self.findings
        by_group = Counter(f.group for f in found)
        replaceable = Counter(f.group for f in found if f.replacement)
        how = ("none" if f.replacement is None else f.replacement.split(":", 1)[0] for f in found)
        return {
            "root": self.root,
            "files_scanned": self.files_scanned,
            "files_with_predicates": len({f.path for f in found}),
            "predicates": len(found),
            "replaceable": replaceable.total(),
            "by_predicate": dict(Counter(_family(f.predicate) for f in found).most_common()),
            "by_group": {g: by_group[g] for g in GROUPS if by_group[g]},
            "by_group_replaceable": {g: replaceable[g] for g in GROUPS if by_group[g]},
            "by_replacement": dict(Counter(how).most_common()),
            "errors": list(self.errors),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "findings": [asdict(f) for f in self.findings]}


def _family(predicate: str) -> str:  # has_device_capability(90) -> has_device_capability(…)
    name, paren, rest = predicate.partition("(")
    return f"{name}(…)" if paren and rest != ")" and name != "hasattr" else predicate


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute) and len(parts) < _MAX_DOTTED:
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


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
        hip = _dotted(node) == "torch.version.hip"  # at most _MAX_DOTTED steps per attribute
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
    args = [_literal(a) for a in node.args] if name in _WITH_ARGS else []
    if name in _MARKER_HELPERS:
        args += [f"{k.arg}={_literal(k.value)}" for k in node.keywords if k.arg]
    return f"{name}({', '.join(args)})", kind


_WORDS: dict[str, re.Pattern[bytes]] = {  # one search per file each, on its UTF-8 bytes
    "memory waits": re.compile(rb"wait_for_gpu_memory|wait_for_memory|memory_to_clear", re.I),
    "utilization": re.compile(rb"gpu_memory_utilization", re.I),
    "start method": re.compile(rb"\bspawn\b|\bfork\b|start_method|multiproc_method", re.I),
    "graphs": re.compile(rb"cuda ?graph|cudagraph|\bgraphs?\b|enforce_eager", re.I),
    "tolerances": re.compile(rb"\batol\b|\brtol\b|toleran|assert_close|allclose", re.I),
    "device count": re.compile(rb"\b(\d+|two|four|eight|multiple|multi)[- ]?gpus?\b|"
                               rb"device_count|num_gpus|tensor_parallel", re.I),
    "large memory": re.compile(rb"\b\d+ ?gi?b\b|large gpu|not enough memory|\bOOM\b", re.I),
    "mxfp4": re.compile(rb"mxfp4|\bmx\b|microscal", re.I),
    "fp4": re.compile(rb"nvfp4|\bfp4\b|float4", re.I),
    "fp8": re.compile(rb"\bfp8|float8|e4m3|e5m2", re.I),
    "bf16": re.compile(rb"bf16|bfloat16", re.I),
}  # fmt: skip
_TEXT_GROUPS = tuple(_WORDS)[:7]  # tried in this order: the first match wins
_DTYPES = ("mxfp4", "fp4", "fp8", "bf16")


class _Source:
    """A file's bytes with each word pattern's matches, for "does it occur in this span"."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.lines = [0] + [m.end() for m in re.finditer(rb"\r\n|\r|\n", data)]
        self._found: dict[str, tuple[list[int], list[int]]] = {}

    def words(self, nodes: Iterable[ast.AST]) -> frozenset[str]:
        """Return the names in :data:`_WORDS` whose pattern occurs wholly inside one node."""
        spans = []
        for node in nodes:  # the parser's columns are UTF-8 offsets
            end_line = getattr(node, "end_lineno", None)
            end_col = getattr(node, "end_col_offset", None)
            if end_line is not None and end_col is not None:
                start = self.lines[getattr(node, "lineno", 1) - 1] + getattr(node, "col_offset", 0)
                spans.append((start, self.lines[end_line - 1] + end_col))
        out = set()
        for name, pattern in _WORDS.items():
            if name not in self._found:
                hits = list(pattern.finditer(self.data))
                self._found[name] = [m.start() for m in hits], [m.end() for m in hits]
            starts, ends = self._found[name]
            for start, end in spans:
                i = bisect_left(starts, start)  # matches do not overlap: the first inside decides
                if i < len(starts) and ends[i] <= end:
                    out.add(name)
                    break
        return frozenset(out)


def _is_skip_call(node: ast.AST, names: tuple[str, ...]) -> bool:  # pytest.skip(), skip() …
    return isinstance(node, ast.Call) and (_dotted(node.func) or "").rpartition(".")[2] in names


def _arg_words(call: ast.Call) -> frozenset[str]:  # words in its literal arguments, f-strings too
    args = (*call.args, *(k.value for k in call.keywords))
    parts = [v for a in args for v in (a.values if isinstance(a, ast.JoinedStr) else [a])]
    texts = [v.value for v in parts if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    data = " ".join(texts).encode("utf-8", "replace")
    return frozenset(name for name, pattern in _WORDS.items() if pattern.search(data))


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, _Where]]:
    """Yield each node in :func:`ast.walk`'s order, its parent and where it sits (the nearest)."""
    todo: deque[tuple[ast.AST, ast.AST | None, _Where]] = deque([(tree, None, None)])
    while todo:
        node, parent, where = todo.popleft()
        yield node, parent, where
        if _is_skip_call(node, ("skipif",)):
            where = ("skipif", node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
            where = ("expression", node)
        elif hasattr(node, "decorator_list"):  # a def or a class: its body says nothing yet
            where = None
        apart = {id(d): ("marker", d) for d in getattr(node, "decorator_list", ())}  # children
        if isinstance(node, ast.If):  # that sit apart: decorators, an if's test
            apart[id(node.test)] = ("if", node)
        todo.extend((c, node, apart.get(id(c), where)) for c in ast.iter_child_nodes(node))


def _why(where: _Where, text: _Source, skips: dict[ast.AST, ast.AST]) -> tuple[str, frozenset[str]]:
    """Return how a predicate is used and the words around it that say why."""
    if where is None:
        return "expression", frozenset()
    use, node = where
    if isinstance(node, ast.Call) and use == "skipif":
        return "skipif", _arg_words(node)
    if isinstance(node, ast.If) and use == "if":
        skip = next((skips[s] for s in node.body if s in skips), None)
        if isinstance(skip, ast.Call):
            return "skip", _arg_words(skip)
        return "branch", text.words((*node.body, *node.orelse))
    return use, text.words([node])


_KIND_GROUPS = {  # what a predicate of this kind asks, whatever the words say
    "count": "device count", "memory": "large memory", "arch": _FEATURE, "dtype": _FEATURE,
    "quant": _FEATURE,
}  # fmt: skip
_FIXED = {  # the groups whose replacement the predicate does not change
    "device count": "requirement: accelplat_requires(devices=N)",
    "large memory": "requirement: accelplat_requires(device_memory=…)",
    "memory waits": "drop-in: accelplat.integrations.vllm.wait_for_gpu_memory_to_clear",
    "utilization": "drop-in: platform.default_memory_utilization",
    "start method": "drop-in: platform.preferred_start_method",
    "tolerances": None,
}


def _classify(kind: str, use: str, words: frozenset[str], pred: str) -> tuple[str, str | None]:
    """Return what a predicate asks and what replaces it (``"builtin: …"``, ``"drop-in: …"`` …)."""
    skip = use in _SKIPPING
    default = _FEATURE if skip else "other"
    group = _KIND_GROUPS.get(kind) or next((g for g in _TEXT_GROUPS if g in words), default)
    if group == "graphs":
        return group, 'builtin: accelplat_requires("graphs")' if skip else 'builtin: has("graphs")'
    if group in _FIXED:
        return group, _FIXED[group]
    dtype = next((d for d in _DTYPES if d in words), _DTYPE_METHODS.get(pred.partition("(")[0]))
    if kind == "dtype" and not skip:
        return group, f'builtin: capabilities()["{dtype or "fp8"}"].value'
    if dtype is not None and (skip or kind in ("arch", "dtype")):
        return group, f'builtin: accelplat_requires("{dtype}")'
    if group != _FEATURE:
        return group, None
    if kind == "arch":
        m = re.search(r"\((\d+)\)", pred)
        arch = "gfx…" if m is None else f"sm_{m.group(1)}+"
        return group, f"project: capability with arch {arch}"
    if kind == "quant":
        return group, "project: capability per quantization method"
    if pred in ("torch.cuda.is_available()", "is_cuda_alike()"):
        return group, 'builtin: accelplat_requires("cuda-api")'
    if pred == "is_cpu()":
        return group, 'builtin: accelplat_requires("accelerator")'
    return group, "project: capability with platforms=[…]"


def scan_source(source: str, path: str = "<source>") -> list[Finding]:
    """Return one file's platform predicates in line order (``SyntaxError``, ``RecursionError``)."""
    tree = ast.parse(source, filename=path)
    text = _Source(source.encode("utf-8", "surrogatepass"))
    parents: dict[ast.AST, ast.AST | None] = {}
    skips: dict[ast.AST, ast.AST] = {}  # each node -> the first skip call under it
    hits: list[tuple[ast.AST, str, str, _Where]] = []
    for node, parent, where in _walk(tree):
        parents[node] = parent
        if _is_skip_call(node, ("skip", "xfail", "SkipTest")):
            up: ast.AST | None = node
            while up is not None and up not in skips:  # breadth first: the first one met wins
                skips[up] = node
                up = parents[up]
        if (hit := _predicate(node)) is not None:
            hits.append((node, *hit, where))
    said: dict[_Where, tuple[str, frozenset[str]]] = {}  # per place: use and words
    found: list[Finding] = []
    for node, predicate, kind, where in hits:
        if where not in said:  # an AST node hashes and compares by identity
            said[where] = _why(where, text, skips)
        use, words = said[where]
        group, replacement = _classify(kind, use, words, predicate)
        line = getattr(node, "lineno", 0)
        found.append(Finding(path, line, predicate, kind, use, group, replacement))
    return sorted(found, key=lambda f: f.line)


def _python_files(base: Path, errors: list[str]) -> Iterator[Path]:
    """Yield ``base``'s ``*.py`` files in :func:`os.walk`'s order (no hidden dirs, no links)."""
    todo = [(base, 0)]
    while todo:
        directory, depth = todo.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            errors.append(f"{directory.relative_to(base)}: unreadable ({exc.strerror or exc})")
            continue
        below = []
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                if not entry.name.startswith((".", "__pycache__")):
                    below.append(Path(entry.path))
            elif entry.name.endswith(".py"):
                yield Path(entry.path)
        if below and depth >= MAX_DEPTH:
            errors.append(
                f"{directory.relative_to(base)}: more than {MAX_DEPTH} directories deep; "
                "its subdirectories are not scanned"
            )
            continue
        todo.extend((d, depth + 1) for d in reversed(below))


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
