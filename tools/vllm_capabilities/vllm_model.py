"""vLLM 0.33's platform predicates, modelled per host from vLLM's source (not from accelplat).

:func:`evaluate` decides a condition's syntax tree on a :class:`Host` the way vLLM would there:
each predicate is written from the vLLM 0.33.0 source line cited next to it, independently of
``accelplat/_translate.py`` (which it checks). A predicate it does not know raises
:class:`UnmodelledError`; a call that raises in vLLM or torch on that host yields :data:`RAISES`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass


class UnmodelledError(Exception):
    """The condition holds something this model does not know."""


class _Raises:
    def __repr__(self) -> str:
        return "RAISES"


RAISES = _Raises()  # the value of an expression that raises on the host
Value = object


@dataclass(frozen=True)
class Host:
    """What vLLM's predicates read on one host."""

    name: str
    platform: str  # vLLM's PlatformEnum, lower case: cuda, rocm, xpu, cpu
    device: str  # the marketing name
    arch: str | None  # as accelplat names it: sm_90, gfx942, pvc, bmg, x86-64-v4
    nvml_capability: tuple[int, int] | None = None  # nvmlDeviceGetCudaComputeCapability
    gcn_arch: str = ""  # amdsmi's / torch's gcnArchName, e.g. "gfx942:sramecc+:xnack-"
    bundles: tuple[str, ...] = ()  # glob patterns of its replay bundle in tests/hosts
    # A host setting: the platform vLLM itself picks ("" : the hardware's), with what makes it
    # pick so, for accelplat's side: the installed vLLM version and the environment.
    vllm_platform: str = ""
    vllm_version: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def chosen(self) -> str:
        """``current_platform``'s platform: ``vllm/platforms/__init__.py``'s choice."""
        return self.vllm_platform or self.platform


def gcn_capability(gcn_arch: str) -> tuple[int, int] | None:
    """vllm/platforms/rocm.py:236-304 ``_capability_from_gcn_arch``: the digits after "gfx"."""
    m = re.match(r"gfx(\d+)", gcn_arch)
    if not m:
        return None
    digits = m.group(1)
    if len(digits) in (2, 3):  # rocm.py:277: one-digit major (gfx90a -> 9.0, gfx942 -> 9.4)
        major, minor = int(digits[0]), int(digits[1])
    elif len(digits) == 4:  # rocm.py:283: two-digit major (gfx1100 -> 11.0)
        major, minor = int(digits[:2]), int(digits[2])
    else:
        raise ValueError(gcn_arch)  # rocm.py:267, 288: vLLM raises on these
    if not 9 <= major <= 12:  # rocm.py:296, 304
        raise ValueError(gcn_arch)
    return major, minor


def capability(host: Host, platform: str | None = None) -> tuple[int, int] | None:
    """``current_platform.get_device_capability()`` (``platform``: the hardware's instead)."""
    on = platform or host.chosen
    if on == "cuda":
        return host.nvml_capability  # cuda.py:764-771 (NVML)
    if on == "rocm":
        return gcn_capability(host.gcn_arch)  # rocm.py:1031-1035
    return None  # xpu.py:319-326, interface.py:517-528 (CPU, Unspecified: the base class)


def _torch_capability(host: Host) -> Value:
    """``torch.cuda.get_device_capability()``: on ROCm, HIP's major/minor from the gfx target.

    rocm.py:236's docstring mirrors that layout; with no CUDA/HIP device torch raises. torch
    reads the hardware whatever vLLM's platform is.
    """
    if host.platform in ("cuda", "rocm"):
        return capability(host, host.platform)
    return RAISES


def _gfx(host: Host, *names: str) -> bool:  # rocm.py:217-233: substring tests of _GCN_ARCH
    # rocm.py:215 reads the arch from amdsmi when the module is imported: the hardware's.
    return host.platform == "rocm" and any(n in host.gcn_arch for n in names)


def _cdna(host: Host) -> bool:
    return _gfx(host, "gfx9", "gfx1250")  # rocm.py:230


def _gfx1x(host: Host) -> bool:
    return _gfx(host, "gfx11", "gfx12")  # rocm.py:217


def _rdna(host: Host) -> bool:
    return _gfx1x(host) and not _cdna(host)  # rocm.py:232


_ROCM_FUNCTIONS = {  # rocm.py:307-360
    "on_gfx1x": _rdna,
    "on_rdna": _rdna,
    "on_gfx11": lambda h: _gfx(h, "gfx11"),
    "on_gfx1100": lambda h: _gfx(h, "gfx1100"),
    "on_gfx1151": lambda h: _gfx(h, "gfx1151"),
    "on_gfx115x": lambda h: _gfx(h, "gfx115"),
    "on_gfx12x": lambda h: _gfx(h, "gfx12") and not _cdna(h),
    "on_gfx1250": lambda h: _gfx(h, "gfx1250"),
    "on_rdna4": lambda h: _gfx(h, "gfx1200", "gfx1201"),
    "on_mi3xx": lambda h: _gfx(h, "gfx942", "gfx950"),
    "on_gfx9": lambda h: _gfx(h, "gfx90a", "gfx942", "gfx950"),
    "on_gfx90a": lambda h: _gfx(h, "gfx90a"),
    "on_gfx942": lambda h: _gfx(h, "gfx942"),
    "on_gfx950": lambda h: _gfx(h, "gfx950"),
    "on_cdna": _cdna,
}


def _supports_fp8(host: Host) -> bool:
    if host.chosen == "cuda":
        cap = capability(host)  # cuda.py:587: has_device_capability(89)
        return cap is not None and cap[0] * 10 + cap[1] >= 89
    if host.chosen == "rocm":
        return _cdna(host) or _rdna(host)  # rocm.py:1255
    return host.chosen == "xpu"  # xpu.py:574 True; interface.py:1253 False (CPU, Unspecified)


def _platform_method(host: Host, name: str, args: list[ast.expr]) -> Value:
    on = host.chosen  # vLLM's platform: a method of current_platform
    if name in ("is_cuda", "is_rocm", "is_xpu", "is_cpu", "is_tpu") and not args:
        return on == name[3:]  # interface.py:196-209 (Unspecified: every one False)
    if name == "is_cuda_alike" and not args:
        return on in ("cuda", "rocm")  # interface.py:227-229
    if name == "supports_fp8" and not args:
        return _supports_fp8(host)
    if name == "is_fp8_fnuz" and not args:  # rocm.py:1259; interface.py:1258 False elsewhere
        return on == "rocm" and _gfx(host, "gfx94")
    if name == "supports_mx" and not args:  # rocm.py:1251; interface.py:1248 False elsewhere
        return on == "rocm" and _gfx(host, "gfx95", "gfx1250")
    if name == "support_static_graph_mode" and not args:
        # cuda.py:687, rocm.py:1393, xpu.py:539 return True; interface.py:1359 False (CPU)
        return on in ("cuda", "rocm", "xpu")
    if name == "get_device_capability" and not args:
        return capability(host)
    if name in ("has_device_capability", "is_device_capability", "is_device_capability_family"):
        want = ast.literal_eval(args[0])
        cap = capability(host)
        if cap is None:  # interface.py:545, 568, 586
            return False
        if name == "is_device_capability_family":  # interface.py:587
            return (cap[0] * 10 + cap[1]) // 10 == want // 10
        have: object = cap if isinstance(want, tuple) else cap[0] * 10 + cap[1]
        return have >= want if name == "has_device_capability" else have == want  # type: ignore[operator]
    raise UnmodelledError(f"current_platform.{name}")


def _call(host: Host, node: ast.Call) -> Value:
    func = node.func
    if isinstance(func, ast.Attribute):
        owner = ast.unparse(func.value)
        if owner.rpartition(".")[2] == "current_platform":
            return _platform_method(host, func.attr, node.args)
        if func.attr == "to_int" and not node.args:  # interface.py:128
            cap = evaluate_value(func.value, host)
            if cap is RAISES:
                return RAISES
            if cap is None:
                return RAISES  # None.to_int(): AttributeError
            assert isinstance(cap, tuple)
            return cap[0] * 10 + cap[1]
        dotted = ast.unparse(func)
        if dotted == "torch.cuda.is_available":
            return host.platform in ("cuda", "rocm")  # a CUDA or ROCm build with a device
        if dotted == "torch.xpu.is_available":
            return host.platform == "xpu"
        if dotted == "torch.cuda.get_device_capability" and not node.args:
            return _torch_capability(host)
        name = func.attr
    else:
        name = func.id if isinstance(func, ast.Name) else ""
    if name in _ROCM_FUNCTIONS and not node.args:
        return _ROCM_FUNCTIONS[name](host)
    raise UnmodelledError(ast.unparse(node))


_COMPARE = {
    ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
}  # fmt: skip


def evaluate_value(node: ast.AST, host: Host) -> Value:
    """The value of ``node`` on ``host`` (a bool, a capability tuple, an int, or RAISES)."""
    if isinstance(node, ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        value: Value = None
        for operand in node.values:  # Python's short circuit: later operands may never run
            value = evaluate_value(operand, host)
            if value is RAISES or (not value if is_and else value):
                return value
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = evaluate_value(node.operand, host)
        return value if value is RAISES else not value
    if isinstance(node, (ast.Constant, ast.Tuple)):
        return ast.literal_eval(node)
    if isinstance(node, ast.Call):
        return _call(host, node)
    if isinstance(node, ast.Subscript):
        value = evaluate_value(node.value, host)
        if value is RAISES or value is None:
            return RAISES  # None[0]: TypeError
        return value[ast.literal_eval(node.slice)]  # type: ignore[index]
    if isinstance(node, ast.Attribute) and node.attr == "major":
        value = evaluate_value(node.value, host)
        return RAISES if value is RAISES or value is None else value[0]  # type: ignore[index]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        left = evaluate_value(node.left, host)
        if left is RAISES:
            return RAISES
        right = evaluate_value(node.comparators[0], host)
        if right is RAISES:
            return RAISES
        try:
            return _COMPARE[type(node.ops[0])](left, right)
        except TypeError:  # None < (9, 0)
            return RAISES
    raise UnmodelledError(ast.unparse(node))


def evaluate(node: ast.AST, host: Host) -> bool | _Raises:
    """Whether the condition ``node`` holds on ``host`` (RAISES where vLLM or torch raises)."""
    value = evaluate_value(node, host)
    return value if value is RAISES else bool(value)  # type: ignore[return-value]
