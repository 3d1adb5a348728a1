"""Capabilities: what a device can do, decided in one place from its identity facts.

Built-ins come from ``arch``, ``compute_capability``, each backend's ``FEATURES`` and the
installed kernel libraries; project ones from ``[tool.accelplat.capabilities]`` or
:func:`define_capability`. Each answer has a reason (``docs/capabilities.md`` also says which
vLLM predicate each built-in equals). The table is untrusted: every shape is checked, every pass
is linear.
"""

from __future__ import annotations

import dataclasses
import functools
import graphlib
import inspect
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelplat import _files
from accelplat._platform import optional
from accelplat._requirement import (
    MAX_SM_MAJOR,
    OTHER_PLATFORMS,
    ArchIs,
    Capability,
    Requirement,
    atom,
    named,
    parse,
    parse_arch,
    sm_number,
)
from accelplat._types import DeviceInfo, FeatureRule
from accelplat._util import shorten, shown
from accelplat._validate import NAME_RE, device_index
from accelplat._vendor.versions import distribution_version, satisfies
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:
    from accelplat._platform import Platform

_shown = functools.partial(shown, limit=80)  # a table's values, quoted briefly


_TABLE = json.loads(resources.files(__package__).joinpath("_capabilities.json").read_text("utf-8"))
BUILTIN: dict[str, str] = _TABLE["builtin"]  # the built-in names and what each means
_FEATURE_NAMES = ("bf16", "fp8", "fp8-native", "fp4", "mxfp4")  # decided by backend FEATURES

# Optional kernel libraries vLLM's tests probe, by capability name: the distributions that
# provide each (the first installed one answers) and vLLM's probe. Decided from installed
# metadata, never by importing them: some initialise a device when imported.
LIBRARIES: dict[str, dict[str, Any]] = _TABLE["libraries"]
BUILTIN.update(
    (name, f"the {name} kernel library is installed (vLLM: {lib['probe']})")
    for name, lib in LIBRARIES.items()
)


def _this(info: DeviceInfo | None) -> str:
    return "no device is visible" if info is None else f"this is {named(info)}"


def _rule_need(rule: FeatureRule) -> str:
    cc = rule.min_compute_capability
    parts = [] if cc is None else [f"sm_{cc[0]}{cc[1]}+"]
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
    cc = info.compute_capability
    for rule in rules:
        low = rule.min_compute_capability
        if low is not None and (cc is None or cc < low):
            continue
        if not rule.archs or any(parse_arch(a).matches(info) for a in rule.archs):
            how = f" ({rule.note})" if rule.note else ""
            return Capability(True, f"{named(info)} has {name}{how}", rule.value)
    needs = "; or ".join(_rule_need(r) + (f" ({r.value})" if r.value else "") for r in rules)
    return Capability(False, f"needs {needs}; {_this(info)}")


def _library(name: str) -> Capability:
    distributions, probe = LIBRARIES[name]["distributions"], LIBRARIES[name]["probe"]
    for dist in distributions:
        version = distribution_version(dist)
        if version is not None:
            return Capability(True, f"{dist} {version} is installed (vLLM: {probe})", version)
    looked = f" (looked for {', '.join(distributions)})" if len(distributions) > 1 else ""
    return Capability(False, f"{name} is not installed{looked}; vLLM: {probe}")


def _builtin(platform: Platform, info: DeviceInfo | None) -> dict[str, Capability]:
    features = optional(platform, "FEATURES")
    if not isinstance(features, Mapping):
        features = {}
    out = {
        name: _from_rules(name, platform, info, tuple(features.get(name, ())))
        for name in _FEATURE_NAMES
    }
    fp8 = out["fp8"]
    # vLLM's is_fp8_fnuz(): the device's fp8 is e4m3fnuz (MI300's own format)
    fnuz = fp8.available and fp8.value == "e4m3fnuz"
    out["fp8-fnuz"] = fp8 if fnuz else Capability(False, f"its fp8 is not e4m3fnuz: {fp8.reason}")
    g = platform.graph
    out["graphs"] = Capability(g.available, g.reason, g.api if g.available else None)
    # Capabilities that mean "torch addresses these devices under this device type" (torch.cuda
    # serves CUDA and ROCm alike): decided by the platform's device_type, which is backend data.
    device_type = platform.device_type
    says = f"the {platform.name} platform's torch device type is {device_type!r}"
    for name, wanted in _TABLE["device_type_apis"].items():
        offered = device_type == wanted
        out[name] = Capability(offered, says, f"torch.{wanted}" if offered else None)
    if optional(platform, "is_accelerator") is False:
        out["accelerator"] = Capability(False, f"the {platform.name} platform is the host CPU")
    elif info is None:
        out["accelerator"] = Capability(False, f"{platform.name} has no visible device")
    else:
        out["accelerator"] = Capability(True, f"{info.name} ({platform.name})", device_type)
    return {**dict(sorted(out.items())), **{name: _library(name) for name in sorted(LIBRARIES)}}


_PYPROJECT_LIMIT = 1024**2  # bytes of pyproject.toml read at most
_REQUIRED_REASON = 120  # characters of a requirement's own reason quoted: no growth along chains
_DIST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_CONDITION_KEYS = frozenset(
    {"platforms", "arch", "min_compute_capability", "requires", "packages", "reason"}
)


@dataclass(frozen=True)
class _PackageNeed:
    name: str
    specifier: str
    text: str


def _parse_packages(value: object, where: str) -> tuple[_PackageNeed, ...]:
    if isinstance(value, (list, tuple)):
        items: dict[object, object] = {}
        for entry in value:
            if not isinstance(entry, str):
                raise ConfigurationError(f"{where}: packages entries must be strings")
            text = entry.strip()
            m = _DIST_RE.match(text)  # no backtracking: a greedy name, then the rest as is
            if m is None:
                raise ConfigurationError(f"{where}: malformed package requirement {_shown(entry)}")
            items[m.group()] = text[m.end() :]
    elif isinstance(value, Mapping):
        items = dict(value)
    else:
        raise ConfigurationError(
            f"{where}: packages must be a table {{name = '>=1.2'}} or a list, got {_shown(value)}"
        )
    from packaging.specifiers import InvalidSpecifier, Specifier

    needs = []
    for name, spec in items.items():
        if not isinstance(name, str) or not isinstance(spec, str):
            raise ConfigurationError(f"{where}: package {_shown(name)} needs a version string")
        clauses = []
        for clause in (c.strip() for c in spec.split(",") if c.strip()):
            try:  # a bare version means ==, as it always has here
                clauses.append(str(Specifier("==" + clause if clause[0].isdigit() else clause)))
            except InvalidSpecifier:
                raise ConfigurationError(
                    f"{where}: package {_shown(name)}: malformed version condition "
                    f"{_shown(clause)} (use >=, <=, ==, !=, >, <, ~= and a PEP 440 version)"
                ) from None
        needs.append(_PackageNeed(name, ",".join(clauses), f"{name}{spec.strip()}"))
    return tuple(needs)


def _parse_cc(value: object, where: str) -> tuple[int, int]:
    text = str(value).strip() if isinstance(value, (str, int, float)) else ""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        text = f"{value[0]}.{value[1]}"
    m = re.match(r"^(\d{1,2})\.?(\d)$", text)  # "8.9", "89", "100"
    if isinstance(value, bool) or m is None:
        raise ConfigurationError(
            f"{where}: min_compute_capability must be like '8.0' or 89, got {_shown(value)}"
        )
    try:
        return sm_number(m.group(1) + m.group(2))
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc} (majors run from 1 to {MAX_SM_MAJOR})") from None


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
    """A project capability: :func:`define_capability`'s arguments parsed (empty: no condition)."""

    name: str
    source: str  # where it was defined: "conftest.py:12"
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
    where = f"{source}: capability {_shown(name)}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigurationError(
            f"{where}: a capability name is lower case letters, digits, '-', '_', '.' "
            "(at most 64 characters)"
        )
    if name in BUILTIN:
        raise ConfigurationError(f"{where}: {name!r} is a built-in capability")
    if name in platform_words():  # a requirement's word must mean one thing
        raise ConfigurationError(f"{where}: {name!r} is a platform name")
    if isinstance(atom(name), ArchIs):
        raise ConfigurationError(f"{where}: {name!r} is an arch pattern")
    if unknown := sorted(set(conditions) - _CONDITION_KEYS):
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
        arch=tuple(parse_arch(a, f"{where}: ").text for a in strings("arch")),
        min_compute_capability=None if cc is None else _parse_cc(cc, where),
        requires=requires,
        packages=_parse_packages(conditions["packages"], where) if "packages" in conditions else (),
        reason=reason,
    )


def _register(cap: ProjectCapability) -> None:
    global _generation
    with _lock:
        old = _project.get(cap.name)
        if old is not None and old.source != cap.source:
            raise ConfigurationError(
                f"{cap.source}: capability {cap.name!r} is already defined at {old.source}"
            )
        _project[cap.name] = cap
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
    """Define and register a project capability, typically in a ``conftest.py``.

    Args:
        name: Used by ``accelplat_requires`` and :func:`has`.
        platforms: Platform names it is limited to.
        arch: Arch patterns (``"sm_80+"``, ``"gfx942"``, ``"gfx9*"``, ``"pvc"`` …).
        min_compute_capability: Lowest NVIDIA compute capability (``"8.9"``).
        requires: Other capabilities that must be available.
        packages: Distributions with PEP 440 conditions: ``{"flash-attn": ">=2.5"}`` or a list.
        check: ``check(platform, device_info) -> bool | str``; a non-empty string is why not.
        reason: A sentence added when unavailable.

    Raises:
        ConfigurationError: A malformed name or condition, or one defined elsewhere (file:line).
    """
    frame = inspect.stack(context=0)[1]
    source = f"{Path(frame.filename).name}:{frame.lineno}"
    given = {"platforms": platforms, "arch": arch, "requires": requires, "packages": packages}
    conditions: dict[str, object] = {
        key: value if isinstance(value, (str, Mapping)) else list(value)
        for key, value in {**given, "min_compute_capability": min_compute_capability}.items()
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
    """Register and return a ``pyproject.toml``'s ``[tool.accelplat.capabilities]`` entries."""
    p = Path(path)
    try:
        # the project's own file, not a host file: the live reader, never a replayed host's
        data = _files.read_live(p, limit=_PYPROJECT_LIMIT)
    except OSError as exc:  # missing, unreadable, not a regular file, too large
        raise ConfigurationError(f"{p}: cannot read the capability table: {exc}") from None
    try:
        table = _files.parse_toml(data.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, or TOMLDecodeError
        raise ConfigurationError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ConfigurationError(f"{p}: not valid TOML: nested too deeply") from None
    for key in ("tool", "tool.accelplat", "tool.accelplat.capabilities"):
        value = table.get(key.rpartition(".")[2])
        if value is None:
            return []
        if not isinstance(value, dict):
            raise ConfigurationError(f"{p}: [{key}] must be a table, not {_shown(value)}")
        table = value
    out = []
    for name, conditions in table.items():
        source = f"{p.name}: [tool.accelplat.capabilities] {shorten(name, 64)}"
        if not isinstance(conditions, dict):
            raise ConfigurationError(f"{source}: must be a table of conditions")
        out.append(_build(name, conditions, source))
    for capability in out:
        _register(capability)
    validate()
    return out


def clear_project_capabilities() -> None:
    global _generation
    with _lock:
        _project.clear()
        _generation += 1


def generation() -> int:
    """Return a number that changes whenever the project capabilities change (for caches)."""
    return _generation


def project_capabilities() -> dict[str, ProjectCapability]:
    with _lock:
        return dict(_project)


def platform_words() -> frozenset[str]:
    """The platform names a requirement may use: every usable platform and vLLM's others."""
    from accelplat._registry import available_platforms

    return frozenset(available_platforms()) | OTHER_PLATFORMS


@functools.lru_cache(maxsize=1)
def _names(generation: int) -> frozenset[str]:
    """The capability names of ``generation``: built once per change (every check stays linear)."""
    with _lock:
        return frozenset(BUILTIN) | frozenset(_project)


def requirement(text: object) -> Requirement:
    """Parse a requirement (``"xpu or (cuda and capability>=90)"``) against the known names.

    Raises:
        ConfigurationError: Malformed, or a word that is no capability, platform or arch.
    """
    return parse(text, capabilities=_names(_generation), platforms=platform_words())


def _parsed_requires(cap: ProjectCapability) -> list[Requirement]:
    try:
        return [requirement(text) for text in cap.requires]
    except ConfigurationError as exc:
        raise ConfigurationError(f"{cap.source}: requires: {exc}") from None


def validate() -> list[str]:
    """Check every ``requires`` is known and acyclic; return the names, each after its needs."""
    table = project_capabilities()
    needs = {
        name: {n for r in _parsed_requires(cap) for n in r.names() if n in table}
        for name, cap in table.items()
    }
    try:
        order = graphlib.TopologicalSorter(needs)
        return [n for n in order.static_order() if n in table]
    except graphlib.CycleError as exc:
        cycle = [str(n) for n in exc.args[1]][::-1]  # graphlib lists it against the arrows
        source = table[cycle[0]].source
        raise ConfigurationError(f"{source}: requirement cycle {' -> '.join(cycle)}") from None


def _evaluate_project(
    cap: ProjectCapability, platform: Platform, info: DeviceInfo | None, done: dict[str, Capability]
) -> Capability:
    unmet: list[str] = []
    if cap.platforms and platform.name not in cap.platforms:
        unmet.append(f"runs on {', '.join(cap.platforms)}; this is {platform.name}")
    low = cap.min_compute_capability
    cc = info.compute_capability if info is not None else None
    if low is not None and (cc is None or cc < low):  # vLLM's has_device_capability()
        unmet.append(f"needs capability>={low[0]}{low[1]}; {_this(info)}")
    if cap.arch and (info is None or not any(parse_arch(p).matches(info) for p in cap.arch)):
        unmet.append(f"needs {' or '.join(cap.arch)}; {_this(info)}")
    for required in _parsed_requires(cap):
        held, why = required.evaluate(platform, info, done)
        if not held:
            unmet.append(f"needs {required.text}: {shorten(why, _REQUIRED_REASON)}")
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
    return Capability(True, f"all conditions hold on {named(info) if info else platform.name}")


def _device(platform: Platform | None, device: int) -> tuple[Platform, DeviceInfo | None]:
    """The platform (``None``: the current one) and its visible ``device`` (none visible: None)."""
    if platform is None:
        from accelplat._registry import current_platform

        platform = current_platform()
    devices = platform.devices()
    return platform, devices[device_index(device, len(devices), platform.name)] if devices else None


def capabilities(device: int = 0, *, platform: Platform | None = None) -> Mapping[str, Capability]:
    """Return every capability of one visible device: the built-ins, then the project's, sorted.

    Raises:
        DeviceNotFoundError: For an index not visible (with no device at all: all unavailable).
        ConfigurationError: When the project capabilities are inconsistent.
    """
    platform, info = _device(platform, device)
    out = _builtin(platform, info)
    table = project_capabilities()
    decided = dict(out)
    for name in validate():  # each after what it requires
        decided[name] = _evaluate_project(table[name], platform, info, decided)
    return {**out, **{name: decided[name] for name in sorted(table)}}


def has(name: str, device: int = 0, *, platform: Platform | None = None) -> bool:
    """Return whether ``device`` meets a requirement: a capability name or an expression.

    ``has("fp8")``, ``has("xpu or (cuda and capability>=90)")``; the words are in
    ``docs/capabilities.md``. Creates no device context.

    Raises:
        ConfigurationError: For a malformed requirement or an unknown word.
        DeviceNotFoundError: For an index that is not visible.
    """
    need = requirement(name)
    judge, info = _device(judged_by(_device(platform, device)[0]), device)
    return need.evaluate(judge, info, capabilities(device, platform=judge))[0]


def judged_by(platform: Platform) -> Platform:
    """Return the platform whose words a requirement is judged by (vLLM's own, where installed).

    See ``accelplat.integrations._installed``; without vLLM it is ``platform``.
    """
    from accelplat.integrations._installed import judged_platform

    return judged_platform(platform)


def table_lines(table: Mapping[str, Capability]) -> list[str]:
    """Return aligned lines, ``"fp8          yes  e4m3fn  NVIDIA H200 (sm_90) has fp8"``."""
    width = max((len(n) for n in table), default=0)
    values = {n: c.value or "" for n, c in table.items()}
    vwidth = max((len(v) for v in values.values()), default=0)
    return [
        f"{name:<{width}}  {'yes' if cap.available else 'no ':<3}  {values[name]:<{vwidth}}  "
        f"{cap.reason}".rstrip()
        for name, cap in table.items()
    ]
