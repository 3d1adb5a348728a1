"""Inventory a test tree's platform predicates, and name what replaces each.

``accelplat scan PATH`` parses every ``*.py`` file under ``PATH`` with :mod:`ast`, finds the
platform predicates test suites use (``is_rocm()``, ``torch.cuda.is_available()``,
``has_device_capability(90)``, ``on_gfx9()`` …), decides from where each sits (a ``skipif``, an
``if … pytest.skip``, another branch) and from the skip reason or branch body what it asks, and
names the accelplat requirement or drop-in that replaces it (``docs/capabilities.md``). Files
are read through the bounded reader (regular files up to 2 MiB, no symbolic links); nothing
scanned is imported.
"""

from __future__ import annotations

import ast
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelplat import _files
from accelplat.errors import ConfigurationError, FileTooLargeError

MAX_FILE_BYTES = 2 * 1024**2
"""Larger files are listed as skipped, not parsed."""

GROUPS = (
    "feature/kernel/dtype support",
    "device count",
    "large memory",
    "memory waits",
    "graphs",
    "start method",
    "utilization",
    "tolerances",
    "other",
)
"""What a predicate asks, in report order."""

_PLATFORM_METHODS = {
    "is_rocm": "rocm",
    "is_cuda": "cuda",
    "is_cuda_alike": "cuda-api",
    "is_xpu": "xpu",
    "is_cpu": "cpu",
    "is_tpu": "tpu",
}
_TORCH_DEVICE_MODULES = frozenset({"xpu", "hpu", "npu"})  # hasattr(torch, "xpu") in scanned code
_CAPABILITY_METHODS = frozenset(
    {"has_device_capability", "is_device_capability", "is_device_capability_family"}
    | {"get_device_capability"}
)
_DTYPE_METHODS = {
    "supports_fp8": "fp8",
    "is_fp8_fnuz": "fp8",
    "fp8_dtype": "fp8",
    "supports_mx": "mxfp4",
}
_COUNT_FUNCTIONS = frozenset({"cuda_device_count_stateless", "device_count"})
_ROCM_ARCH_RE = re.compile(r"^on_(gfx\w+|mi\d\w*|cdna\d*)$")
_MARKER_HELPERS = {"multi_gpu_test": "device count", "large_gpu_mark": "large memory"}


@dataclass(frozen=True)
class Finding:
    """One platform predicate in one file.

    Attributes:
        path: File, relative to the scanned root.
        line: 1-based line.
        predicate: Normalised spelling, e.g. ``"is_rocm()"``, ``"has_device_capability(90)"``.
        kind: ``platform``, ``arch``, ``dtype``, ``count``, ``memory``, ``quant``.
        use: ``skipif``, ``skip``, ``branch``, ``expression`` or ``marker``.
        group: What it asks (one of :data:`GROUPS`).
        replacement: The accelplat requirement or drop-in that replaces it, or ``None``.
    """

    path: str
    line: int
    predicate: str
    kind: str
    use: str
    group: str
    replacement: str | None


@dataclass
class ScanReport:
    """Everything a scan found.

    Attributes:
        root: The scanned path.
        files_scanned: Python files parsed.
        findings: Every predicate found, in file and line order.
        errors: ``"path: why"`` for files that could not be read or parsed.
    """

    root: str
    files_scanned: int = 0
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def files_with_predicates(self) -> int:
        """Return how many files hold at least one predicate."""
        return len({f.path for f in self.findings})

    def summary(self) -> dict[str, Any]:
        """Return counts by predicate, group and replacement kind, JSON-ready."""
        by_group = Counter(f.group for f in self.findings)
        replaceable = sum(1 for f in self.findings if f.replacement)
        return {
            "root": self.root,
            "files_scanned": self.files_scanned,
            "files_with_predicates": self.files_with_predicates(),
            "predicates": len(self.findings),
            "replaceable": replaceable,
            "by_predicate": dict(
                Counter(_family(f.predicate) for f in self.findings).most_common()
            ),
            "by_group": {g: by_group[g] for g in GROUPS if by_group[g]},
            "by_group_replaceable": {
                g: sum(1 for f in self.findings if f.group == g and f.replacement)
                for g in GROUPS
                if by_group[g]
            },
            "by_replacement": dict(
                Counter(_replacement_family(f.replacement) for f in self.findings).most_common()
            ),
            "errors": list(self.errors),
        }

    def to_json(self) -> dict[str, Any]:
        """Return the summary plus every finding."""
        return {**self.summary(), "findings": [asdict(f) for f in self.findings]}


def _family(predicate: str) -> str:  # has_device_capability(90) -> has_device_capability(…)
    name, paren, rest = predicate.partition("(")
    if paren and rest != ")" and name != "hasattr":
        return f"{name}(…)"
    return predicate


def _replacement_family(replacement: str | None) -> str:
    return "none" if replacement is None else replacement.split(":", 1)[0]


# --------------------------------------------------------------------------------------------
# recognising predicates


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _literal(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
        return repr(node.value) if isinstance(node.value, str) else str(node.value)
    return "…"


def _predicate(node: ast.AST) -> tuple[str, str] | None:
    """Return ``(normalised predicate, kind)`` when ``node`` is a platform predicate."""
    if isinstance(node, ast.Attribute) and _dotted(node) == "torch.version.hip":
        return "torch.version.hip", "platform"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    dotted = _dotted(func) or ""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    args = ", ".join(_literal(a) for a in node.args)
    if dotted == "torch.cuda.is_available":
        return "torch.cuda.is_available()", "platform"
    if dotted in ("torch.cuda.device_count", "torch.xpu.device_count"):
        return f"{dotted}()", "count"
    if dotted == "torch.cuda.get_device_capability":
        return "torch.cuda.get_device_capability()", "arch"
    if name == "hasattr" and len(node.args) == 2:
        target, attr = node.args
        if (
            isinstance(target, ast.Name)
            and target.id == "torch"
            and isinstance(attr, ast.Constant)
            and attr.value in _TORCH_DEVICE_MODULES
        ):
            return f'hasattr(torch, "{attr.value}")', "platform"
        return None
    if name in _PLATFORM_METHODS:
        return f"{name}()", "platform"
    if name in _CAPABILITY_METHODS:
        return f"{name}({args})", "arch"
    if _ROCM_ARCH_RE.match(name):
        return f"{name}()", "arch"
    if name in _DTYPE_METHODS:
        return f"{name}()", "dtype"
    if name in _COUNT_FUNCTIONS and (isinstance(func, ast.Name) or "platform" in dotted):
        return f"{name}()", "count"
    if name == "is_quant_method_supported":
        return f"is_quant_method_supported({args})", "quant"
    if name in _MARKER_HELPERS:
        kwargs = ", ".join(f"{k.arg}={_literal(k.value)}" for k in node.keywords if k.arg)
        return f"{name}({', '.join(x for x in (args, kwargs) if x)})", (
            "count" if name == "multi_gpu_test" else "memory"
        )
    return None


# --------------------------------------------------------------------------------------------
# context: where a predicate sits and what the surrounding code is about


def _is_skip_call(node: ast.AST, names: tuple[str, ...]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    dotted = _dotted(node.func) or ""
    return any(dotted == n or dotted.endswith("." + n) for n in names)


def _string_args(call: ast.Call) -> str:
    texts = [
        a.value
        for a in (*call.args, *(k.value for k in call.keywords))
        if isinstance(a, ast.Constant) and isinstance(a.value, str)
    ]
    for a in (*call.args, *(k.value for k in call.keywords)):
        if isinstance(a, ast.JoinedStr):
            texts.extend(
                v.value
                for v in a.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
    return " ".join(texts)


def _context(node: ast.AST, parents: dict[ast.AST, ast.AST], source: str) -> tuple[str, str]:
    """Return ``(use, text)``: how the predicate is used and the words that say why."""
    child = node
    parent = parents.get(node)
    while parent is not None:
        if _is_skip_call(parent, ("skipif",)) and isinstance(parent, ast.Call):
            return "skipif", _string_args(parent)
        if isinstance(parent, ast.If) and child is parent.test:
            skips = [
                n
                for stmt in parent.body
                for n in ast.walk(stmt)
                if _is_skip_call(n, ("skip", "xfail", "SkipTest"))
            ]
            if skips and isinstance(skips[0], ast.Call):
                return "skip", _string_args(skips[0])
            body = "\n".join(ast.get_source_segment(source, s) or "" for s in parent.body)
            orelse = "\n".join(ast.get_source_segment(source, s) or "" for s in parent.orelse)
            return "branch", body + "\n" + orelse
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if child in parent.decorator_list:
                return "marker", ast.get_source_segment(source, child) or ""
            break
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
            return "expression", ast.get_source_segment(source, parent) or ""
        child, parent = parent, parents.get(parent)
    return "expression", ""


_TEXT_GROUPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("memory waits", re.compile(r"wait_for_gpu_memory|wait_for_memory|memory_to_clear", re.I)),
    ("utilization", re.compile(r"gpu_memory_utilization", re.I)),
    ("start method", re.compile(r"\bspawn\b|\bfork\b|start_method|multiproc_method", re.I)),
    ("graphs", re.compile(r"cuda ?graph|cudagraph|\bgraphs?\b|enforce_eager", re.I)),
    ("tolerances", re.compile(r"\batol\b|\brtol\b|toleran|assert_close|allclose", re.I)),
    ("device count", re.compile(r"\b(\d+|two|four|eight|multiple|multi)[- ]?gpus?\b|"
                                r"device_count|num_gpus|tensor_parallel", re.I)),
    ("large memory", re.compile(r"\b\d+ ?gi?b\b|large gpu|not enough memory|\bOOM\b", re.I)),
)  # fmt: skip

_DTYPE_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("mxfp4", re.compile(r"mxfp4|\bmx\b|microscal", re.I)),
    ("fp4", re.compile(r"nvfp4|\bfp4\b|float4", re.I)),
    ("fp8", re.compile(r"\bfp8|float8|e4m3|e5m2", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16", re.I)),
)


def _group(kind: str, use: str, text: str) -> str:
    if kind == "count":
        return "device count"
    if kind == "memory":
        return "large memory"
    if kind in ("arch", "dtype", "quant"):
        return "feature/kernel/dtype support"
    for group, pattern in _TEXT_GROUPS:
        if pattern.search(text):
            return group
    if use in ("skipif", "skip", "marker"):
        return "feature/kernel/dtype support"
    return "other"


def _capability_arg(predicate: str) -> str | None:
    m = re.search(r"\((\d+)\)", predicate)
    return None if m is None else f"sm_{m.group(1)}"


def _replacement(kind: str, use: str, group: str, text: str, predicate: str) -> str | None:
    """Name what replaces a predicate: ``"builtin: …"``, ``"project: …"`` or ``"drop-in: …"``."""
    skip = use in ("skipif", "skip", "marker")
    if group == "device count":
        return "requirement: accelplat_requires(devices=N)"
    if group == "large memory":
        return "requirement: accelplat_requires(device_memory=…)"
    if group == "memory waits":
        return "drop-in: accelplat.integrations.vllm.wait_for_gpu_memory_to_clear"
    if group == "utilization":
        return "drop-in: platform.default_memory_utilization"
    if group == "start method":
        return "drop-in: platform.preferred_start_method"
    if group == "graphs":
        return 'builtin: accelplat_requires("graphs")' if skip else 'builtin: has("graphs")'
    if group == "tolerances":
        return None
    dtype = next((name for name, p in _DTYPE_WORDS if p.search(text)), None)
    dtype = dtype or _DTYPE_METHODS.get(predicate.partition("(")[0])
    if kind == "dtype" and not skip:
        return f'builtin: capabilities()["{dtype or "fp8"}"].value'
    if dtype is not None and (skip or kind in ("arch", "dtype")):
        return f'builtin: accelplat_requires("{dtype}")'
    if group != "feature/kernel/dtype support":
        return None
    if kind == "arch":
        sm = _capability_arg(predicate)
        if sm is not None:
            return f"project: capability with arch {sm}+"
        return "project: capability with arch gfx…"
    if kind == "quant":
        return "project: capability per quantization method"
    if predicate in ("torch.cuda.is_available()", "is_cuda_alike()"):
        return 'builtin: accelplat_requires("cuda-api")'
    if predicate == "is_cpu()":
        return 'builtin: accelplat_requires("accelerator")'
    return "project: capability with platforms=[…]"


# --------------------------------------------------------------------------------------------
# scanning


def scan_source(source: str, path: str = "<source>") -> list[Finding]:
    """Return the platform predicates in one file's source.

    Args:
        source: Python source text.
        path: The name findings carry.

    Returns:
        The findings in line order.

    Raises:
        SyntaxError: When the source does not parse.
    """
    tree = ast.parse(source, filename=path)
    parents: dict[ast.AST, ast.AST] = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    found: list[Finding] = []
    for node in ast.walk(tree):
        if (hit := _predicate(node)) is not None:
            predicate, kind = hit
            use, text = _context(node, parents, source)
            group = _group(kind, use, text)
            replacement = _replacement(kind, use, group, text, predicate)
            line = getattr(node, "lineno", 0)
            found.append(Finding(path, line, predicate, kind, use, group, replacement))
    return sorted(found, key=lambda f: f.line)


def _python_files(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def scan_path(root: str | os.PathLike[str]) -> ScanReport:
    """Scan a file or a directory tree.

    Args:
        root: A ``.py`` file or a directory.

    Returns:
        The :class:`ScanReport`; unreadable or unparsable files are listed in ``errors``.

    Raises:
        ConfigurationError: When ``root`` does not exist or is neither a file nor a directory.
    """
    base = Path(root)
    if not base.exists():
        raise ConfigurationError(f"scan: {base} does not exist")
    if not (base.is_dir() or base.is_file()):
        raise ConfigurationError(f"scan: {base} is neither a file nor a directory")
    report = ScanReport(str(base))
    for path in _python_files(base):
        rel = str(path.relative_to(base)) if base.is_dir() else path.name
        if path.is_symlink() or not path.is_file():
            report.errors.append(f"{rel}: not a regular file")
            continue
        try:
            # the user's test tree, not a host file: the live reader, never a replayed host's
            data = _files.read_live(path, limit=MAX_FILE_BYTES)
        except FileTooLargeError:
            report.errors.append(f"{rel}: larger than {MAX_FILE_BYTES} bytes")
            continue
        except OSError as exc:
            report.errors.append(f"{rel}: unreadable ({exc.strerror or exc})")
            continue
        try:
            found = scan_source(data.decode("utf-8"), rel)
        except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
            report.errors.append(f"{rel}: does not parse ({type(exc).__name__})")
            continue
        report.files_scanned += 1
        report.findings.extend(found)
    return report
