"""Capabilities: what a device can do, decided in one place from its identity facts.

A test suite asks "can this machine run fp8 kernels?" far more often than it asks "is this
ROCm?". This module answers the first question from facts, so tests can state what they *need*:

* **Facts** come from the backend, read without a device context: the platform's name and torch
  device type, and per device :attr:`~accelplat._types.DeviceInfo.arch` and
  :attr:`~accelplat._types.DeviceInfo.compute_capability`.
* **Built-in capabilities** (:data:`BUILTIN`: ``bf16``, ``fp8`` with its format, ``fp4``,
  ``mxfp4``, ``graphs`` with its API, ``cuda-api``, ``accelerator``) are decided here by one
  evaluator from those facts and each backend's *data*: a backend class lists, per capability,
  the :class:`~accelplat._types.FeatureRule` s under which it is available (``FEATURES``). No
  platform is named in this module.
* **Project capabilities** are data too: ``[tool.accelplat.capabilities]`` in ``pyproject.toml``
  or :func:`define_capability` in a ``conftest.py``, as conditions on platform, arch, compute
  capability, other capabilities and installed package versions. A callable is the escape
  hatch. An unknown name anywhere is a :class:`~accelplat.errors.ConfigurationError`.

Every :class:`Capability` carries a reason naming the fact it was decided from, e.g.
``"needs sm_89+; this is NVIDIA A100-SXM4-80GB (sm_80)"``.

Side effects: none at import; imports no framework and creates no device context.
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelplat._types import DeviceInfo, FeatureRule
from accelplat._vendor.graphs import distribution_version
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:
    from accelplat._platform import Platform

__all__ = [
    "BUILTIN",
    "Capability",
    "ProjectCapability",
    "capabilities",
    "clear_project_capabilities",
    "define_capability",
    "generation",
    "has",
    "known_names",
    "load_pyproject",
    "parse_arch_pattern",
    "project_capabilities",
    "table_lines",
    "validate",
]


@dataclass(frozen=True)
class Capability:
    """Whether a device can do one thing, and why.

    Attributes:
        available: ``True`` when it can.
        reason: One sentence naming the fact the answer came from.
        value: The variant where there are several: the fp8 format (``"e4m3fn"``, the OCP
            format, or ``"e4m3fnuz"``), the graph API (``"torch.cuda.CUDAGraph"``), the fp4
            formats; ``None`` otherwise or when unavailable.
    """

    available: bool
    reason: str
    value: str | None = None

    def __bool__(self) -> bool:
        return self.available


BUILTIN: dict[str, str] = {
    "accelerator": "a device other than the host CPU",
    "bf16": "bfloat16 arithmetic on the device",
    "cuda-api": "torch's torch.cuda namespace drives the device (CUDA and ROCm)",
    "fp4": "4-bit floating point (NVFP4/MXFP4) in hardware",
    "fp8": "8-bit floating point (e4m3) in hardware; value: e4m3fn (OCP) or e4m3fnuz",
    "graphs": "device graph capture; value: the torch API",
    "mxfp4": "OCP microscaling MXFP4 in hardware",
}
"""The built-in capability names and what each means."""

# --------------------------------------------------------------------------------------------
# arch patterns

_SM_RE = re.compile(r"^sm_(\d{2,3})(\+?)$")
_GFX_RE = re.compile(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])(\+?)$")
_GFX_FAMILY_RE = re.compile(r"^gfx(\d{1,2})([0-9a-f]?)\*$")
_MAX_SM_MAJOR = 15
"""Highest compute-capability major accepted in a pattern (12 is Blackwell, in 2025)."""
_KNOWN_OTHER_ARCHS = frozenset(
    {
        "pvc",
        "dg2",
        "bmg",
        "lnl",
        "mtl",
        "arl",
        "x86_64",
        "x86-64-v2",
        "x86-64-v3",
        "x86-64-v4",
        "aarch64",
        "arm64",
        "ppc64le",
        "s390x",
        "riscv64",
    }
)


@dataclass(frozen=True)
class _ArchPattern:
    text: str
    min_cc: tuple[int, int] | None = None  # sm_80+
    exact: str | None = None  # sm_90, gfx942, pvc
    prefix: str | None = None  # gfx9*


def parse_arch_pattern(text: object, *, where: str = "arch") -> _ArchPattern:
    """Check and parse one arch pattern of a project capability.

    Accepted: ``"sm_90"`` (exactly), ``"sm_80+"`` (compute capability 8.0 or newer),
    ``"gfx942"``, ``"gfx9*"``/``"gfx94*"`` (a family), an Intel architecture (``"pvc"``,
    ``"bmg"`` …) or a CPU instruction set (``"x86-64-v4"``, ``"aarch64"``).

    Args:
        text: The pattern.
        where: Names the entry in error messages.

    Returns:
        The parsed pattern.

    Raises:
        ConfigurationError: For anything else, including impossible values (``"sm_999"``,
            ``"gfx"``).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(f"{where}: an arch must be a non-empty string, got {text!r}")
    t = text.strip().lower()
    m = _SM_RE.match(t)
    if m:
        digits = m.group(1)
        major, minor = int(digits[:-1]), int(digits[-1])
        if not 1 <= major <= _MAX_SM_MAJOR:
            raise ConfigurationError(
                f"{where}: {text!r} is no NVIDIA architecture (compute capability "
                f"{major}.{minor}; majors run from 1 to {_MAX_SM_MAJOR})"
            )
        if m.group(2):
            return _ArchPattern(t, min_cc=(major, minor))
        return _ArchPattern(t, exact=t)
    m = _GFX_RE.match(t)
    if m and not m.group(4):
        return _ArchPattern(t, exact=t)
    if _GFX_FAMILY_RE.match(t):
        return _ArchPattern(t, prefix=t[:-1])
    if t in _KNOWN_OTHER_ARCHS:
        return _ArchPattern(t, exact=t)
    raise ConfigurationError(
        f"{where}: unknown arch {text!r}; use sm_XY or sm_XY+ (NVIDIA), gfxNNN or gfxN* (AMD), "
        f"or one of {', '.join(sorted(_KNOWN_OTHER_ARCHS))}"
    )


def _arch_matches(pattern: _ArchPattern, info: DeviceInfo) -> bool:
    if pattern.min_cc is not None:
        return info.compute_capability is not None and info.compute_capability >= pattern.min_cc
    arch = (info.arch or "").lower()
    if pattern.prefix is not None:
        return arch.startswith(pattern.prefix)
    return arch == pattern.exact


def _describe(info: DeviceInfo | None) -> str:
    if info is None:
        return "no device is visible"
    return f"this is {info.name} ({info.arch or 'architecture unknown'})"


# --------------------------------------------------------------------------------------------
# built-in capabilities


def _rule_matches(rule: FeatureRule, info: DeviceInfo) -> bool:
    if rule.min_compute_capability is not None:
        cc = info.compute_capability
        if cc is None or cc < rule.min_compute_capability:
            return False
    if rule.archs:
        arch = (info.arch or "").lower()
        if not any(arch.startswith(a[:-1]) if a.endswith("*") else arch == a for a in rule.archs):
            return False
    return True


def _rule_need(rule: FeatureRule) -> str:
    parts = []
    if rule.min_compute_capability is not None:
        major, minor = rule.min_compute_capability
        parts.append(f"sm_{major}{minor}+")
    if rule.archs:
        parts.append(" or ".join(rule.archs))
    return " ".join(parts) or "any device"


def _from_rules(
    name: str, platform: Platform, info: DeviceInfo | None, rules: Sequence[FeatureRule]
) -> Capability:
    if not rules:
        return Capability(False, f"the {platform.name} platform has no {name} support")
    if info is None:
        return Capability(False, f"needs a device; {platform.name} has none visible")
    for rule in rules:
        if _rule_matches(rule, info):
            how = f" ({rule.note})" if rule.note else ""
            fact = f"{info.name} ({info.arch or 'architecture unknown'})"
            return Capability(True, f"{fact} has {name}{how}", rule.value)
    needs = "; or ".join(_rule_need(r) + (f" ({r.value})" if r.value else "") for r in rules)
    return Capability(False, f"needs {needs}; {_describe(info)}")


def _features(platform: Platform) -> Mapping[str, Sequence[FeatureRule]]:
    table = getattr(type(platform), "FEATURES", None)
    if table is None:
        table = getattr(platform, "FEATURES", None)
    return table if isinstance(table, Mapping) else {}


def _builtin(platform: Platform, info: DeviceInfo | None) -> dict[str, Capability]:
    features = _features(platform)
    out: dict[str, Capability] = {}
    for name in ("bf16", "fp8", "fp4", "mxfp4"):
        out[name] = _from_rules(name, platform, info, tuple(features.get(name, ())))
    graph = platform.graph
    out["graphs"] = Capability(
        graph.available, graph.reason, graph.api if graph.available else None
    )
    device_type = platform.device_type
    if device_type == "cuda":
        out["cuda-api"] = Capability(
            True, f"the {platform.name} platform's torch device type is 'cuda'", "torch.cuda"
        )
    else:
        out["cuda-api"] = Capability(
            False, f"the {platform.name} platform's torch device type is {device_type!r}"
        )
    if device_type == "cpu":
        out["accelerator"] = Capability(False, f"the {platform.name} platform is the host CPU")
    elif info is None:
        out["accelerator"] = Capability(False, f"{platform.name} has no visible device")
    else:
        out["accelerator"] = Capability(True, f"{info.name} ({platform.name})", device_type)
    return out


# --------------------------------------------------------------------------------------------
# project capabilities


_PYPROJECT_LIMIT = 1024**2
"""Largest ``pyproject.toml`` (or table file) read, in bytes."""

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_SPEC_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)\s*$")
_CONDITION_KEYS = frozenset(
    {"platforms", "arch", "min_compute_capability", "requires", "packages", "reason"}
)


def _version_tuple(text: str) -> tuple[int, ...]:
    nums = []
    for part in re.split(r"[.+-]", text):
        m = re.match(r"\d+", part)
        if m is None:
            break
        nums.append(int(m.group()))
    return tuple(nums)


def _compare(installed: tuple[int, ...], op: str, wanted: tuple[int, ...]) -> bool:
    width = max(len(installed), len(wanted))
    a = installed + (0,) * (width - len(installed))
    b = wanted + (0,) * (width - len(wanted))
    return {
        ">=": a >= b,
        "<=": a <= b,
        "==": a == b,
        "!=": a != b,
        ">": a > b,
        "<": a < b,
    }[op]


@dataclass(frozen=True)
class _PackageNeed:
    name: str
    clauses: tuple[tuple[str, tuple[int, ...]], ...]
    text: str


def _parse_packages(value: object, where: str) -> tuple[_PackageNeed, ...]:
    if isinstance(value, (list, tuple)):
        items: dict[str, object] = {}
        for entry in value:
            if not isinstance(entry, str):
                raise ConfigurationError(f"{where}: packages entries must be strings")
            m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(.*)$", entry)
            if m is None:
                raise ConfigurationError(f"{where}: malformed package requirement {entry!r}")
            items[m.group(1)] = m.group(2)
    elif isinstance(value, Mapping):
        items = dict(value)
    else:
        raise ConfigurationError(
            f"{where}: packages must be a table {{name = '>=1.2'}} or a list, got {value!r}"
        )
    needs = []
    for name, spec in items.items():
        if not isinstance(name, str) or not isinstance(spec, str):
            raise ConfigurationError(f"{where}: package {name!r} needs a version string")
        clauses = []
        for clause in (c for c in spec.split(",") if c.strip()):
            m = _SPEC_RE.match(clause)
            if m is None:
                raise ConfigurationError(
                    f"{where}: package {name!r}: malformed version condition {clause.strip()!r} "
                    "(use >=, <=, ==, !=, >, < and a numeric version)"
                )
            clauses.append((m.group(1) or "==", _version_tuple(m.group(2))))
        needs.append(_PackageNeed(name, tuple(clauses), f"{name}{spec.strip()}"))
    return tuple(needs)


def _parse_cc(value: object, where: str) -> tuple[int, int]:
    text = str(value).strip() if isinstance(value, (str, int, float)) else ""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        text = f"{value[0]}.{value[1]}"
    m = re.match(r"^(\d{1,2})\.(\d)$", text) or re.match(r"^(\d{1,2})(\d)$", text)
    if isinstance(value, bool) or m is None:
        raise ConfigurationError(
            f"{where}: min_compute_capability must be like '8.0' or 89, got {value!r}"
        )
    major, minor = int(m.group(1)), int(m.group(2))
    if not 1 <= major <= _MAX_SM_MAJOR:
        raise ConfigurationError(
            f"{where}: compute capability {major}.{minor} does not exist "
            f"(majors run from 1 to {_MAX_SM_MAJOR})"
        )
    return major, minor


def _str_list(value: object, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigurationError(f"{where}: {key} must be a non-empty list of strings")
    out = []
    for v in value:
        if not isinstance(v, str) or not v.strip():
            raise ConfigurationError(f"{where}: {key} entries must be non-empty strings")
        out.append(v.strip().lower())
    return tuple(out)


@dataclass(frozen=True)
class ProjectCapability:
    """A capability a project defines, as conditions that must all hold.

    Attributes:
        name: Its name (lower case; letters, digits, ``-``, ``_``, ``.``).
        source: Where it was defined (``"pyproject.toml: [tool.accelplat.capabilities]
            flash-attn"`` or ``"conftest.py:12"``), for error messages.
        platforms: Platform names it is limited to; empty for any.
        arch: Arch patterns (see :func:`parse_arch_pattern`); empty for any.
        min_compute_capability: Lowest NVIDIA compute capability, or ``None``.
        requires: Other capabilities (built-in or project) that must be available.
        packages: Installed distributions and version conditions.
        check: Escape hatch: ``check(platform, device_info) -> bool | str`` (``True`` or an empty
            string when met, ``False`` or a reason when not).
        reason: A sentence added to the reason when unavailable.
    """

    name: str
    source: str
    platforms: tuple[str, ...] = ()
    arch: tuple[_ArchPattern, ...] = ()
    min_compute_capability: tuple[int, int] | None = None
    requires: tuple[str, ...] = ()
    packages: tuple[_PackageNeed, ...] = ()
    check: Callable[[Any, DeviceInfo | None], bool | str] | None = None
    reason: str = ""


_lock = threading.Lock()
_project: dict[str, ProjectCapability] = {}
_generation = 0


def _build(name: object, conditions: Mapping[str, object], source: str) -> ProjectCapability:
    where = f"{source}: capability {name!r}"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigurationError(
            f"{where}: a capability name is lower case letters, digits, '-', '_', '.'"
        )
    if name in BUILTIN:
        raise ConfigurationError(f"{where}: {name!r} is a built-in capability")
    unknown = sorted(set(conditions) - _CONDITION_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown condition(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_CONDITION_KEYS))}"
        )
    platforms = (
        _str_list(conditions["platforms"], "platforms", where) if "platforms" in conditions else ()
    )
    raw_arch = _str_list(conditions["arch"], "arch", where) if "arch" in conditions else ()
    arch = tuple(parse_arch_pattern(a, where=where) for a in raw_arch)
    cc = (
        _parse_cc(conditions["min_compute_capability"], where)
        if "min_compute_capability" in conditions
        else None
    )
    requires = (
        _str_list(conditions["requires"], "requires", where) if "requires" in conditions else ()
    )
    if name in requires:
        raise ConfigurationError(f"{where}: a capability cannot require itself")
    packages = _parse_packages(conditions["packages"], where) if "packages" in conditions else ()
    reason = conditions.get("reason", "")
    if not isinstance(reason, str):
        raise ConfigurationError(f"{where}: reason must be a string")
    return ProjectCapability(name, source, platforms, arch, cc, requires, packages, None, reason)


def _register(capability: ProjectCapability) -> None:
    with _lock:
        old = _project.get(capability.name)
        if old is not None and old.source != capability.source:
            raise ConfigurationError(
                f"{capability.source}: capability {capability.name!r} is already defined at "
                f"{old.source}"
            )
        _project[capability.name] = capability
        global _generation
        _generation += 1


def define_capability(
    name: str,
    *,
    platforms: Iterable[str] | None = None,
    arch: Iterable[str] | None = None,
    min_compute_capability: str | tuple[int, int] | None = None,
    requires: Iterable[str] | None = None,
    packages: Mapping[str, str] | Iterable[str] | None = None,
    check: Callable[[Any, DeviceInfo | None], bool | str] | None = None,
    reason: str = "",
) -> ProjectCapability:
    """Define a project capability, typically in a ``conftest.py``.

    Example:
        ``define_capability("flash-attn", platforms=["cuda"], arch=["sm_80+"],
        packages={"flash-attn": ">=2.5"})``

    Args:
        name: The capability's name, used by ``accelplat_requires`` and :func:`has`.
        platforms: Platform names it is limited to.
        arch: Arch patterns (``"sm_80+"``, ``"gfx942"``, ``"gfx9*"``, ``"pvc"`` …).
        min_compute_capability: Lowest NVIDIA compute capability (``"8.9"``).
        requires: Other capabilities that must be available.
        packages: Distributions that must be installed, with version conditions
            (``{"flash-attn": ">=2.5"}`` or ``["flash-attn>=2.5"]``).
        check: Escape hatch, ``check(platform, device_info) -> bool | str``; a string is the
            reason it is unavailable (an empty string means available).
        reason: A sentence added when unavailable.

    Returns:
        The registered :class:`ProjectCapability`.

    Raises:
        ConfigurationError: For a malformed name or condition, an impossible arch, or a name
            already defined elsewhere; the message names the caller's file and line.
    """
    frame = inspect.stack()[1]
    source = f"{Path(frame.filename).name}:{frame.lineno}"
    conditions: dict[str, object] = {"reason": reason}
    for key, value in (
        ("platforms", platforms),
        ("arch", arch),
        ("min_compute_capability", min_compute_capability),
        ("requires", requires),
        ("packages", packages),
    ):
        if value is not None:
            conditions[key] = value if isinstance(value, (str, Mapping)) else list(value)
    capability = _build(name, conditions, source)
    if check is not None:
        if not callable(check):
            raise ConfigurationError(f"{source}: capability {name!r}: check must be callable")
        capability = ProjectCapability(**{**capability.__dict__, "check": check})
    _register(capability)
    return capability


def load_pyproject(path: str | Path) -> list[ProjectCapability]:
    """Register the capabilities of a ``pyproject.toml``'s ``[tool.accelplat.capabilities]``.

    Each entry is a table of conditions::

        [tool.accelplat.capabilities]
        flash-attn = { platforms = ["cuda"], arch = ["sm_80+"] }
        aiter = { platforms = ["rocm"], arch = ["gfx942", "gfx950"], packages = ["aiter"] }

    Args:
        path: The file; one without the table registers nothing.

    Returns:
        The capabilities registered.

    Raises:
        ConfigurationError: For unreadable TOML, a malformed table or entry, an impossible arch
            or a ``requires`` naming no known capability, naming the file and entry.

    Side effects:
        Reads the file through accelplat's one bounded reader (a regular file, at most 1 MiB).
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    from accelplat import _files

    p = Path(path)
    try:
        # the project's own file, not a host file: the live reader, never a replayed host's
        data = _files.read_live(p, limit=_PYPROJECT_LIMIT)
    except OSError as exc:  # missing, unreadable, not a regular file, too large
        raise ConfigurationError(f"{p}: cannot read the capability table: {exc}") from None
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{p}: not valid TOML: {exc}") from None
    table = doc.get("tool", {}).get("accelplat", {}).get("capabilities")
    if table is None:
        return []
    if not isinstance(table, dict):
        raise ConfigurationError(f"{p}: [tool.accelplat.capabilities] must be a table")
    out = []
    for name, conditions in table.items():
        source = f"{p.name}: [tool.accelplat.capabilities] {name}"
        if not isinstance(conditions, dict):
            raise ConfigurationError(f"{source}: must be a table of conditions")
        out.append(_build(name, conditions, source))
    for capability in out:
        _register(capability)
    validate()
    return out


def clear_project_capabilities() -> None:
    """Forget every project capability (for tests and between pytest sessions)."""
    global _generation
    with _lock:
        _project.clear()
        _generation += 1


def generation() -> int:
    """Return a number that changes whenever the project capabilities change (for caches)."""
    return _generation


def project_capabilities() -> dict[str, ProjectCapability]:
    """Return the project capabilities defined so far, by name."""
    with _lock:
        return dict(_project)


def known_names() -> list[str]:
    """Return every capability name known now: the built-ins, then the project's, sorted."""
    return sorted(BUILTIN) + sorted(project_capabilities())


def validate() -> None:
    """Check that every ``requires`` names a known capability and that none forms a cycle.

    Raises:
        ConfigurationError: Naming the entry and the unknown name or the cycle.
    """
    table = project_capabilities()
    for cap in table.values():
        for other in cap.requires:
            if other not in BUILTIN and other not in table:
                raise ConfigurationError(
                    f"{cap.source}: requires unknown capability {other!r} (known: "
                    f"{', '.join(known_names())})"
                )

    def visit(name: str, path: tuple[str, ...]) -> None:
        cap = table.get(name)
        if cap is None:
            return
        for other in cap.requires:
            if other in path:
                raise ConfigurationError(
                    f"{cap.source}: requirement cycle {' -> '.join((*path, other))}"
                )
            visit(other, (*path, other))

    for name in table:
        visit(name, (name,))


def _evaluate_project(
    cap: ProjectCapability,
    platform: Platform,
    info: DeviceInfo | None,
    decided: Mapping[str, Capability],
    resolve: Callable[[str], Capability],
) -> Capability:
    unmet: list[str] = []
    if cap.platforms and platform.name not in cap.platforms:
        unmet.append(f"runs on {', '.join(cap.platforms)}; this is {platform.name}")
    if cap.min_compute_capability is not None:
        cc = info.compute_capability if info is not None else None
        if cc is None or cc < cap.min_compute_capability:
            major, minor = cap.min_compute_capability
            unmet.append(f"needs sm_{major}{minor}+; {_describe(info)}")
    if cap.arch and (info is None or not any(_arch_matches(p, info) for p in cap.arch)):
        unmet.append(f"needs {' or '.join(p.text for p in cap.arch)}; {_describe(info)}")
    for other in cap.requires:
        got = decided.get(other) or resolve(other)
        if not got.available:
            unmet.append(f"needs {other}: {got.reason}")
    for need in cap.packages:
        version = distribution_version(need.name)
        if version is None:
            unmet.append(f"needs {need.text}; {need.name} is not installed")
            continue
        installed = _version_tuple(version)
        if not all(_compare(installed, op, wanted) for op, wanted in need.clauses):
            unmet.append(f"needs {need.text}; {need.name} {version} is installed")
    if not unmet and cap.check is not None:
        try:
            verdict = cap.check(platform, info)
        except Exception as exc:  # an escape hatch that raises says "no", with why
            verdict = f"its check raised {type(exc).__name__}: {exc}"
        if verdict is False or (isinstance(verdict, str) and verdict):
            unmet.append(verdict if isinstance(verdict, str) else "its check said no")
    if unmet:
        extra = f" ({cap.reason})" if cap.reason else ""
        return Capability(False, "; ".join(unmet) + extra)
    where = f"{info.name} ({info.arch or 'architecture unknown'})" if info else platform.name
    return Capability(True, f"all conditions hold on {where}")


# --------------------------------------------------------------------------------------------
# public API


def _device_info(platform: Platform, device: int) -> DeviceInfo | None:
    devices = platform.devices()
    if not devices:
        return None
    from accelplat._validate import device_index

    return devices[device_index(device, len(devices), platform.name)]


def capabilities(device: int = 0, *, platform: Platform | None = None) -> Mapping[str, Capability]:
    """Return every capability (built-in and project) of one visible device.

    Args:
        device: Visible device index.
        platform: The platform to ask; the current one by default.

    Returns:
        Capability name to :class:`Capability`, built-ins first, each sorted by name.

    Raises:
        DeviceNotFoundError: For an index that is not visible (a platform with no device at all
            answers "unavailable, no device" instead).
        ConfigurationError: When the project capabilities are inconsistent.

    Side effects:
        Detects the platform if needed and lists its devices; no device context, no torch.
    """
    if platform is None:
        from accelplat._registry import current_platform

        platform = current_platform()
    info = _device_info(platform, device)
    out = _builtin(platform, info)
    table = project_capabilities()

    def resolve(name: str) -> Capability:
        if name in out:
            return out[name]
        cap = table.get(name)
        if cap is None:
            raise ConfigurationError(
                f"unknown capability {name!r} (known: {', '.join(known_names())})"
            )
        out[name] = _evaluate_project(cap, platform, info, out, resolve)
        return out[name]

    validate()
    for name in sorted(table):
        resolve(name)
    return out


def has(name: str, device: int = 0, *, platform: Platform | None = None) -> bool:
    """Return whether ``device`` has capability ``name``.

    Args:
        name: A built-in or project capability name.
        device: Visible device index.
        platform: The platform to ask; the current one by default.

    Returns:
        ``True`` when available.

    Raises:
        ConfigurationError: For an unknown name.
        DeviceNotFoundError: For an index that is not visible.
    """
    if name not in BUILTIN and name not in project_capabilities():
        raise ConfigurationError(f"unknown capability {name!r} (known: {', '.join(known_names())})")
    return capabilities(device, platform=platform)[name].available


def table_lines(table: Mapping[str, Capability]) -> list[str]:
    """Render a capability table as aligned text lines, one per capability.

    Args:
        table: What :func:`capabilities` returned.

    Returns:
        Lines such as ``"fp8          yes  e4m3fn  NVIDIA H200 (sm_90) has fp8"``.
    """
    width = max((len(n) for n in table), default=0)
    values = {n: c.value or "" for n, c in table.items()}
    vwidth = max((len(v) for v in values.values()), default=0)
    return [
        f"{name:<{width}}  {'yes' if cap.available else 'no ':<3}  {values[name]:<{vwidth}}  "
        f"{cap.reason}".rstrip()
        for name, cap in table.items()
    ]


class _CallableModule(types.ModuleType):
    """This module's type: calling the module is calling :func:`capabilities`.

    ``accelplat.capabilities`` names both this module and the function (the package attribute
    becomes the module once it is imported), so ``accelplat.capabilities(0)`` works either way.
    """

    def __call__(
        self, device: int = 0, *, platform: Platform | None = None
    ) -> Mapping[str, Capability]:
        return capabilities(device, platform=platform)


sys.modules[__name__].__class__ = _CallableModule
