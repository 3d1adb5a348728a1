"""Capabilities: what a device can do, decided in one place from its identity facts.

Built-ins (:data:`BUILTIN`) are decided by one evaluator from the device's facts
(:class:`~accelplat._types.DeviceInfo` ``arch`` and ``compute_capability``) and each backend's
``FEATURES`` rules (data, see :class:`~accelplat._types.FeatureRule`); project capabilities come
from ``[tool.accelplat.capabilities]`` in ``pyproject.toml`` or :func:`define_capability`. Every
:class:`Capability` carries a reason naming the fact, e.g. ``"needs sm_89+; this is NVIDIA
A100-SXM4-80GB (sm_80)"``. See ``docs/capabilities.md``.
"""

from __future__ import annotations

import dataclasses
import graphlib
import inspect
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelplat._platform import optional
from accelplat._types import DeviceInfo, FeatureRule
from accelplat._validate import NAME_RE, device_index
from accelplat._vendor.versions import distribution_version, satisfies
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:
    from accelplat._platform import Platform


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

_TORCH_NAMESPACES = {"cuda-api": "cuda"}
"""Built-ins that ask for a torch device type: the platform's declared type must equal it."""

# --------------------------------------------------------------------------------------------
# arch patterns: one grammar for backend rules and project tables

_SM_RE = re.compile(r"^sm_(\d{2,3})(\+?)$")
_GFX_RE = re.compile(r"^gfx\d{1,2}[0-9a-f]{2}$")
_GFX_FAMILY_RE = re.compile(r"^gfx\d{1,2}[0-9a-f]?\*$")
_MAX_SM_MAJOR = 15  # 12 is Blackwell (2025); higher is a typo
_KNOWN_OTHER_ARCHS = frozenset(
    {"pvc", "dg2", "bmg", "lnl", "mtl", "arl"}  # Intel GPUs (Level Zero device ids)
    | {"x86_64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64", "arm64", "ppc64le", "s390x"}
    | {"riscv64"}
)


def _sm(digits: str) -> tuple[int, int]:
    return int(digits[:-1]), int(digits[-1])


def _arch_matches(pattern: str, info: DeviceInfo) -> bool:
    """The one arch grammar: ``sm_80+`` (that or newer), ``gfx9*`` (a family), else exact."""
    pattern = pattern.lower()
    m = _SM_RE.match(pattern)
    if m and m.group(2):
        cc = info.compute_capability
        return cc is not None and cc >= _sm(m.group(1))
    arch = (info.arch or "").lower()
    if pattern.endswith("*"):
        return arch.startswith(pattern[:-1])
    return arch == pattern


def parse_arch_pattern(text: object, *, where: str = "arch") -> str:
    """Check one arch pattern of a project capability and return it normalised.

    Accepted: ``"sm_90"`` (exactly), ``"sm_80+"`` (compute capability 8.0 or newer),
    ``"gfx942"``, ``"gfx9*"``/``"gfx94*"`` (a family), an Intel architecture (``"pvc"``,
    ``"bmg"`` …) or a CPU instruction set (``"x86-64-v4"``, ``"aarch64"``).

    Args:
        text: The pattern.
        where: Names the entry in error messages.

    Returns:
        The pattern, stripped and lower-cased.

    Raises:
        ConfigurationError: For anything else, including impossible values (``"sm_999"``,
            ``"gfx"``).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(f"{where}: an arch must be a non-empty string, got {text!r}")
    t = text.strip().lower()
    m = _SM_RE.match(t)
    if m:
        major, minor = _sm(m.group(1))
        if not 1 <= major <= _MAX_SM_MAJOR:
            raise ConfigurationError(
                f"{where}: {text!r} is no NVIDIA architecture (compute capability "
                f"{major}.{minor}; majors run from 1 to {_MAX_SM_MAJOR})"
            )
        return t
    if _GFX_RE.match(t) or _GFX_FAMILY_RE.match(t) or t in _KNOWN_OTHER_ARCHS:
        return t
    raise ConfigurationError(
        f"{where}: unknown arch {text!r}; use sm_XY or sm_XY+ (NVIDIA), gfxNNN or gfxN* (AMD), "
        f"or one of {', '.join(sorted(_KNOWN_OTHER_ARCHS))}"
    )


def _this(info: DeviceInfo | None) -> str:
    if info is None:
        return "no device is visible"
    return f"this is {_named(info)}"


def _named(info: DeviceInfo) -> str:
    return f"{info.name} ({info.arch or 'architecture unknown'})"


# --------------------------------------------------------------------------------------------
# built-in capabilities


def _rule_matches(rule: FeatureRule, info: DeviceInfo) -> bool:
    cc = info.compute_capability
    if rule.min_compute_capability is not None and (cc is None or cc < rule.min_compute_capability):
        return False
    return not rule.archs or any(_arch_matches(a, info) for a in rule.archs)


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
            return Capability(True, f"{_named(info)} has {name}{how}", rule.value)
    needs = "; or ".join(_rule_need(r) + (f" ({r.value})" if r.value else "") for r in rules)
    return Capability(False, f"needs {needs}; {_this(info)}")


def _builtin(platform: Platform, info: DeviceInfo | None) -> dict[str, Capability]:
    features = optional(platform, "FEATURES")
    if not isinstance(features, Mapping):
        features = {}
    out = {
        name: _from_rules(name, platform, info, tuple(features.get(name, ())))
        for name in ("bf16", "fp8", "fp4", "mxfp4")
    }
    graph = platform.graph
    out["graphs"] = Capability(
        graph.available, graph.reason, graph.api if graph.available else None
    )
    device_type = platform.device_type
    says = f"the {platform.name} platform's torch device type is {device_type!r}"
    for name, wanted in _TORCH_NAMESPACES.items():
        ok = device_type == wanted
        out[name] = Capability(ok, says, f"torch.{wanted}" if ok else None)
    if optional(platform, "is_accelerator") is False:
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

_CONDITION_KEYS = frozenset(
    {"platforms", "arch", "min_compute_capability", "requires", "packages", "reason"}
)


@dataclass(frozen=True)
class _PackageNeed:
    name: str
    specifier: str
    text: str


def _specifier(name: str, spec: str, where: str) -> str:
    from packaging.specifiers import InvalidSpecifier, Specifier

    clauses = []
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        try:  # a bare version means ==, as it always has here
            clauses.append(str(Specifier("==" + clause if clause[0].isdigit() else clause)))
        except InvalidSpecifier:
            raise ConfigurationError(
                f"{where}: package {name!r}: malformed version condition {clause!r} "
                "(use >=, <=, ==, !=, >, <, ~= and a PEP 440 version)"
            ) from None
    return ",".join(clauses)


def _parse_packages(value: object, where: str) -> tuple[_PackageNeed, ...]:
    if isinstance(value, (list, tuple)):
        items: dict[object, object] = {}
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
        needs.append(_PackageNeed(name, _specifier(name, spec, where), f"{name}{spec.strip()}"))
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
    if not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigurationError(f"{where}: {key} entries must be non-empty strings")
    return tuple(v.strip().lower() for v in value)


@dataclass(frozen=True)
class ProjectCapability:
    """A capability a project defines, as conditions that must all hold.

    The fields are :func:`define_capability`'s arguments (empty or ``None``: no condition),
    parsed, plus ``source``: where it was defined (``"conftest.py:12"``, ``"pyproject.toml:
    [tool.accelplat.capabilities] flash-attn"``), for error messages.
    """

    name: str
    source: str
    platforms: tuple[str, ...] = ()
    arch: tuple[str, ...] = ()
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
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigurationError(
            f"{where}: a capability name is lower case letters, digits, '-', '_', '.' "
            "(at most 64 characters)"
        )
    if name in BUILTIN:
        raise ConfigurationError(f"{where}: {name!r} is a built-in capability")
    unknown = sorted(set(conditions) - _CONDITION_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown condition(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_CONDITION_KEYS))}"
        )

    def strings(key: str) -> tuple[str, ...]:
        return _str_list(conditions[key], key, where) if key in conditions else ()

    cc = conditions.get("min_compute_capability")
    requires = strings("requires")
    if name in requires:
        raise ConfigurationError(f"{where}: a capability cannot require itself")
    reason = conditions.get("reason", "")
    if not isinstance(reason, str):
        raise ConfigurationError(f"{where}: reason must be a string")
    return ProjectCapability(
        name,
        source,
        platforms=strings("platforms"),
        arch=tuple(parse_arch_pattern(a, where=where) for a in strings("arch")),
        min_compute_capability=None if cc is None else _parse_cc(cc, where),
        requires=requires,
        packages=_parse_packages(conditions["packages"], where) if "packages" in conditions else (),
        reason=reason,
    )


def _register(capability: ProjectCapability) -> None:
    global _generation
    with _lock:
        old = _project.get(capability.name)
        if old is not None and old.source != capability.source:
            raise ConfigurationError(
                f"{capability.source}: capability {capability.name!r} is already defined at "
                f"{old.source}"
            )
        _project[capability.name] = capability
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

    Args:
        name: The capability's name, used by ``accelplat_requires`` and :func:`has`.
        platforms: Platform names it is limited to.
        arch: Arch patterns (``"sm_80+"``, ``"gfx942"``, ``"gfx9*"``, ``"pvc"`` …).
        min_compute_capability: Lowest NVIDIA compute capability (``"8.9"``).
        requires: Other capabilities that must be available.
        packages: Distributions that must be installed, with PEP 440 version conditions
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
    frame = inspect.stack(context=0)[1]
    source = f"{Path(frame.filename).name}:{frame.lineno}"
    given = {
        "platforms": platforms,
        "arch": arch,
        "min_compute_capability": min_compute_capability,
        "requires": requires,
        "packages": packages,
    }
    conditions: dict[str, object] = {
        key: value if isinstance(value, (str, Mapping)) else list(value)
        for key, value in given.items()
        if value is not None
    }
    capability = _build(name, {**conditions, "reason": reason}, source)
    if check is not None:
        if not callable(check):
            raise ConfigurationError(f"{source}: capability {name!r}: check must be callable")
        capability = dataclasses.replace(capability, check=check)
    _register(capability)
    return capability


def load_pyproject(path: str | Path) -> list[ProjectCapability]:
    """Register the capabilities of a ``pyproject.toml``'s ``[tool.accelplat.capabilities]``.

    Each entry is a table of conditions (``flash-attn = { platforms = ["cuda"], arch =
    ["sm_80+"] }``); the file is untrusted input, checked entry by entry.

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


def _unknown(name: str) -> ConfigurationError:
    return ConfigurationError(f"unknown capability {name!r} (known: {', '.join(known_names())})")


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

    try:
        graphlib.TopologicalSorter({n: c.requires for n, c in table.items()}).prepare()
    except graphlib.CycleError as exc:
        cycle = [str(n) for n in exc.args[1]][::-1]  # graphlib lists it against the arrows
        raise ConfigurationError(
            f"{table[cycle[0]].source}: requirement cycle {' -> '.join(cycle)}"
        ) from None


def _evaluate_project(
    cap: ProjectCapability,
    platform: Platform,
    info: DeviceInfo | None,
    resolve: Callable[[str], Capability],
) -> Capability:
    unmet: list[str] = []
    if cap.platforms and platform.name not in cap.platforms:
        unmet.append(f"runs on {', '.join(cap.platforms)}; this is {platform.name}")
    if cap.min_compute_capability is not None:
        cc = info.compute_capability if info is not None else None
        if cc is None or cc < cap.min_compute_capability:
            major, minor = cap.min_compute_capability
            unmet.append(f"needs sm_{major}{minor}+; {_this(info)}")
    if cap.arch and (info is None or not any(_arch_matches(p, info) for p in cap.arch)):
        unmet.append(f"needs {' or '.join(cap.arch)}; {_this(info)}")
    for other in cap.requires:
        got = resolve(other)
        if not got.available:
            unmet.append(f"needs {other}: {got.reason}")
    for need in cap.packages:
        version = distribution_version(need.name)
        if version is None:
            unmet.append(f"needs {need.text}; {need.name} is not installed")
        elif not satisfies(version, need.specifier):  # 2.6.0a0 meets >=2.5, not >=2.6
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
    return Capability(True, f"all conditions hold on {_named(info) if info else platform.name}")


# --------------------------------------------------------------------------------------------
# public API


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
        Detects the platform if needed and lists its devices.
    """
    if platform is None:
        from accelplat._registry import current_platform

        platform = current_platform()
    devices = platform.devices()
    info = devices[device_index(device, len(devices), platform.name)] if devices else None
    out = _builtin(platform, info)
    table = project_capabilities()

    def resolve(name: str) -> Capability:
        if name not in out:
            if name not in table:
                raise _unknown(name)
            out[name] = _evaluate_project(table[name], platform, info, resolve)
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
        raise _unknown(name)
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
