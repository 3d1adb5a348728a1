"""Translate a vLLM platform condition into the accelplat requirement with the same truth.

One translator, read by ``accelplat scan`` and by the vLLM migration tool: from a condition's
syntax tree (``not``/``and``/``or`` over vLLM's platform predicates) it builds the requirement
expression (``docs/capabilities.md``) that is true on exactly the hosts where the condition is,
or says which kind of knowledge has no exact replacement. It never guesses: a predicate whose
vLLM meaning differs from every accelplat word on some host is refused, with the reason.

The meaning of each predicate is vLLM 0.33's (``vllm/platforms/interface.py``, ``cuda.py``,
``rocm.py``, ``xpu.py``, ``cpu.py``), tabled with its source line in ``_vllm_predicates.toml``;
``docs/migrating-vllm-tests.md`` lists each mapping.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from importlib import resources
from typing import Any

from accelplat import _files
from accelplat._requirement import (
    Compare,
    Join,
    Node,
    Not,
    joined,
    negate,
    render,
    word,
)


def _numbered(tree: Node) -> bool:
    """Whether ``tree`` holding means the device has a capability number (CUDA or ROCm)."""
    if isinstance(tree, Compare):
        return True
    if isinstance(tree, Join):
        numbered = (_numbered(o) for o in tree.operands)
        return any(numbered) if tree.op == "and" else all(numbered)
    return tree in _NUMBERED


# -- what is translated ------------------------------------------------------------------------


class UnexpressibleError(Exception):
    """A condition (or part) with no exact accelplat replacement; ``kind`` says why."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


# Kinds of knowledge with no exact replacement (``UnexpressibleError.kind``), one spelling each.
CAPABILITY_VALUE = "device-capability value"
FP8_DTYPE_VALUE = "fp8 dtype value"
TORCH_BUILD = "torch build (torch.version.*), not the device"
LIBRARY_PROBE = "library probe stricter than an install check"
NOT_A_PLATFORM = "a condition on something other than the platform"
UNMODELLED_PLATFORM = "a platform accelplat has no model of"


# Words that hold only where the device has a capability number: CUDA and ROCm devices.
_NUMBERED = frozenset(word(w) for w in ("cuda", "rocm"))


# The predicates' table (``_vllm_predicates.toml``: each with its vLLM source line)
VOCABULARY: dict[str, Any] = _files.parse_toml(
    resources.files(__package__).joinpath("_vllm_predicates.toml").read_text("utf-8")
)
_PLATFORM_METHODS: dict[str, str] = VOCABULARY["platform_methods"]
_ROCM_ARCH: dict[str, str] = VOCABULARY["rocm_arch"]
_TORCH_CALLS: dict[str, str] = VOCABULARY["torch_calls"]
_CAPABILITY_CALLS, _LIBRARY_PROBES, _CAPABILITY_VALUE_CALLS, _TORCH_BUILD = (
    frozenset(VOCABULARY["unexpressible"][key])
    for key in ("capability_calls", "library_probes", "capability_value_calls", "torch_build")
)
_OPS: dict[type[ast.cmpop], str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
}  # fmt: skip
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain on a name (at most 32 parts looked at), else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute) and len(parts) < 32:
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _platform_call(node: ast.AST) -> str | None:
    """``is_rocm`` for ``current_platform.is_rocm()`` (any ``….current_platform``), else None."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    owner = dotted_name(node.func.value) or ""
    return node.func.attr if owner.rpartition(".")[2] == "current_platform" else None


def _int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value < 10_000:
        return node.value
    return None


def _capability_number(node: ast.AST) -> int | None:
    """VLLM's ``<major><minor>`` from ``90`` or ``(9, 0)`` (``DeviceCapability.to_int``)."""
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        major, minor = (_int(e) for e in node.elts)
        if major is not None and minor is not None and minor < 10:
            return major * 10 + minor
        return None
    return _int(node)


def _capability_value(node: ast.AST) -> str | None:
    """The form when ``node`` reads the device's capability: ``tuple``, ``major`` or ``int``.

    Of ``torch.cuda.get_device_capability()`` (which raises off CUDA and ROCm) or vLLM's
    ``current_platform.get_device_capability()`` (``None`` there).
    """
    form = "tuple"
    if (isinstance(node, ast.Subscript) and _int(node.slice) == 0) or (
        isinstance(node, ast.Attribute) and node.attr == "major"
    ):
        form, node = "major", node.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "to_int"
        and not node.args
    ):
        form, node = "int", node.func.value
    if not isinstance(node, ast.Call) or node.args or node.keywords:
        return None
    torch = dotted_name(node.func) == "torch.cuda.get_device_capability"
    return form if torch or _platform_call(node) == "get_device_capability" else None


def _compare_atom(op: str, number: int) -> Node:
    # vLLM's comparisons are integer ones on major * 10 + minor: > n is >= n + 1
    if op in (">", "<="):
        return Compare({">": ">=", "<=": "<"}[op], number + 1, family=False)
    return Compare(op, number, family=False)


def _major_atom(op: str, major: int) -> Node:
    if op in ("==", "!="):
        family = Compare("==", major * 10, family=True)  # vLLM's is_device_capability_family
        return family if op == "==" else Not(family)
    return _compare_atom(op, major * 10 + (9 if op in (">", "<=") else 0))


def _operands(node: ast.BoolOp, first: int, sure: bool, strict: bool = False) -> list[Node]:
    """The trees of ``node``'s operands from ``first`` up to the first that does not translate.

    Each operand runs only when the ones before allow: what they make sure goes on. ``strict``:
    raise the first one's :class:`UnexpressibleError`.
    """
    is_and = isinstance(node.op, ast.And)
    parts: list[Node] = []
    for k in range(first, len(node.values)):  # no slice: a wide "and" stays linear
        try:
            parts.append(_tree(node.values[k], sure))
        except UnexpressibleError:
            if strict:
                raise
            break
        # an operand that ran before a later one of an and (or) may make a number sure
        sure = sure or _numbered(parts[-1] if is_and else negate(parts[-1]))
    return parts


def _tree(node: ast.AST, sure: bool = False) -> Node:
    """Turn one expression into a tree; ``sure``: the device is known to have a number.

    ``sure`` is what the operands that run before an expression established (``is_cuda() and
    get_device_capability() < (9, 0)``), kept as one flag so that a wide ``and`` stays linear.
    """
    if isinstance(node, ast.BoolOp):
        return joined(
            "and" if isinstance(node.op, ast.And) else "or", _operands(node, 0, sure, strict=True)
        )
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return negate(_tree(node.operand, sure))
    if isinstance(node, ast.Compare):
        return _compare(node, sure)
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Name) and node.id in _LIBRARY_PROBES:
        raise UnexpressibleError(LIBRARY_PROBE)
    if dotted_name(node) in _TORCH_BUILD:
        raise UnexpressibleError(TORCH_BUILD)
    raise UnexpressibleError(NOT_A_PLATFORM)


def _call(node: ast.Call) -> Node:
    method = _platform_call(node)
    dotted = dotted_name(node.func) or ""
    bare = method or dotted.rpartition(".")[2]  # a method's name, or a function's own
    if method in _PLATFORM_METHODS and not node.args and not node.keywords:
        return word(_PLATFORM_METHODS[method])
    if method in _CAPABILITY_CALLS and len(node.args) == 1 and not node.keywords:
        number = _capability_number(node.args[0])
        if number is None:
            raise UnexpressibleError(CAPABILITY_VALUE)  # a variable: the value decides
        if method == "has_device_capability":
            return Compare(">=", number, family=False)  # interface.py:531
        if method == "is_device_capability":
            return Compare("==", number, family=False)  # interface.py:554
        return _major_atom("==", number // 10)  # interface.py:577: the same major
    if method in ("get_device_capability", "fp8_dtype"):
        raise UnexpressibleError(CAPABILITY_VALUE if method != "fp8_dtype" else FP8_DTYPE_VALUE)
    if method == "is_out_of_tree":
        raise UnexpressibleError(UNMODELLED_PLATFORM)
    arch_call = method is None and (dotted == bare or dotted.endswith(f"rocm.{bare}"))
    if bare in _ROCM_ARCH and arch_call and not node.args and not node.keywords:
        return word(_ROCM_ARCH[bare])
    if dotted in _TORCH_CALLS and not node.args:
        return word(_TORCH_CALLS[dotted])
    if dotted == "hasattr" and len(node.args) == 2 and dotted_name(node.args[0]) == "torch":
        # torch.xpu exists in every torch build since 2.4 (CPU and CUDA builds too), so
        # hasattr(torch, "xpu") says nothing about the device
        raise UnexpressibleError(TORCH_BUILD)
    if bare in _LIBRARY_PROBES:
        raise UnexpressibleError(LIBRARY_PROBE)
    if dotted in _CAPABILITY_VALUE_CALLS:
        raise UnexpressibleError(CAPABILITY_VALUE)
    raise UnexpressibleError(NOT_A_PLATFORM)


def _compare(node: ast.Compare, sure: bool) -> Node:
    left, other = node.left, node.comparators[0]
    if len(node.ops) == 1 and dotted_name(left) in _TORCH_BUILD:
        raise UnexpressibleError(TORCH_BUILD)
    if len(node.ops) != 1 or type(node.ops[0]) not in _OPS:
        raise UnexpressibleError(NOT_A_PLATFORM)
    sign = _OPS[type(node.ops[0])]
    value = _capability_value(left)
    if value is None:
        value, other, sign = _capability_value(other), left, _FLIPPED[sign]
    if value is None:
        if any(_platform_call(n) == "fp8_dtype" for n in ast.walk(node)):
            raise UnexpressibleError(FP8_DTYPE_VALUE)
        raise UnexpressibleError(NOT_A_PLATFORM)
    # Off CUDA and ROCm the value is None (vLLM) or an exception (torch): a comparison is
    # exact only where what runs before it has made sure the device has a number.
    if not sure:
        raise UnexpressibleError(CAPABILITY_VALUE)
    if value == "major":
        major = _int(other)
        if major is None:
            raise UnexpressibleError(CAPABILITY_VALUE)
        return _major_atom(sign, major)
    number = _capability_number(other) if value == "tuple" else _int(other)
    if number is None or (value == "tuple" and not isinstance(other, ast.Tuple)):
        raise UnexpressibleError(CAPABILITY_VALUE)
    return _compare_atom(sign, number)


def translate(node: ast.AST) -> str:
    """Return the requirement that is true exactly where the condition ``node`` is.

    Raises:
        UnexpressibleError: Some part has no exact replacement; ``kind`` names the knowledge.
    """
    return render(_tree(node))


@dataclass(frozen=True)
class Site:
    """The widest part of a condition that translates: ``node`` (or ``operands`` of a run)."""

    node: ast.AST  # the translated expression, or the BoolOp whose operand run it is
    first: int  # the run's operands [first, last] of a BoolOp; 0, 0 for a whole node
    last: int
    requirement: str  # true exactly where the translated part is
    run_if: str  # true exactly where it is false: a skip's "run if"
    whole: bool  # the whole condition translated

    @property
    def parts(self) -> list[ast.AST]:
        """The AST nodes of the translated source text: the node, or the run's operands."""
        if isinstance(self.node, ast.BoolOp) and not (self.first == 0 and self.last == -1):
            return list(self.node.values[self.first : self.last + 1])
        return [self.node]

    @property
    def span(self) -> tuple[ast.AST, ast.AST]:
        """The first and last AST nodes of the translated source text."""
        return self.parts[0], self.parts[-1]


def sites(condition: ast.AST) -> tuple[list[Site], dict[int, str]]:
    """Split ``condition`` into its widest translatable parts and the kinds of the rest.

    Returns:
        The sites, and for each untranslatable predicate call (by ``id`` of its node) the kind
        that stopped it.
    """
    found: list[Site] = []
    kinds: dict[int, str] = {}

    def visit(node: ast.AST, whole: bool) -> None:
        try:
            tree = _tree(node)
        except UnexpressibleError as exc:
            if isinstance(node, ast.BoolOp):
                runs(node)
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                visit(node.operand, False)
            else:
                for inner in ast.walk(node):
                    kinds.setdefault(id(inner), exc.kind)
            return
        found.append(Site(node, 0, -1, render(tree), render(negate(tree)), whole))

    def runs(node: ast.BoolOp) -> None:  # the widest runs of operands that translate
        i = 0
        while i < len(node.values):
            parts = _operands(node, i, False)
            if parts:
                tree = joined("and" if isinstance(node.op, ast.And) else "or", parts)
                last = i + len(parts) - 1
                found.append(Site(node, i, last, render(tree), render(negate(tree)), False))
            else:  # this operand alone does not translate: look inside it
                visit(node.values[i], False)
            i += len(parts) or 1

    visit(condition, True)
    return found, kinds
