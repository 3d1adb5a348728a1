"""pytest plugin for accelplat: markers, fixtures and options (the ``pytest11`` entry point).

Markers (each skips the test, with a reason saying what was needed and what was found):

* ``accelplat_requires(*capabilities, devices=, device_memory=, platforms=, shm=)`` — the one
  general marker: every named capability (built-in or project-defined, see
  :mod:`accelplat.capabilities`) is available on each of the first ``devices`` devices, at least
  ``devices`` devices are visible, each has ``device_memory`` (a size such as ``"40GiB"``) in
  total, the platform is one of ``platforms``, and ``shm`` is free on ``/dev/shm``. The skip
  reason lists every unmet requirement. An unknown capability name stops the session at
  collection with an error naming the test and the name.

The markers below are special cases of it, kept for their spelling:

* ``accelplat_requires_graph`` — the platform can capture device graphs;
* ``accelplat_requires_device_memory(gib, *, devices=1)`` — each of the first ``devices``
  visible devices has at least ``gib`` GiB of memory in total (``bytes=`` instead of ``gib``
  takes an exact byte count);
* ``accelplat_requires_devices(n)`` — at least ``n`` visible devices;
* ``accelplat_requires_shm(gib, *, path="/dev/shm")`` — at least ``gib`` GiB free on the
  shared-memory mount;
* ``accelplat_platforms("cuda", "rocm", …)`` — the current platform is one of those named.

Fixtures: ``accel_platform`` (the current platform) and ``settled_device_memory`` (waits with
:func:`accelplat._memory.wait_for_memory_to_settle` before the test and returns its result).

Project capabilities come from ``[tool.accelplat.capabilities]`` in the rootdir's
``pyproject.toml`` (loaded at start-up; a malformed entry is a usage error naming it) and from
:func:`accelplat._capabilities.define_capability` calls in ``conftest.py`` files.

Options: ``--accelplat-capabilities`` prints the capability table of device 0 in the header;
``--accelplat-platform NAME`` forces the platform for the whole session;
``--accelplat-leak-check`` reports, in the terminal summary, tests after which device memory
stayed above what it was before the test by more than ``--accelplat-leak-tolerance`` (ini
``accelplat_leak_tolerance``, default 256 MiB).

``--accelplat-lease`` gives each test process (each pytest-xdist worker) its own devices
through :func:`accelplat.lease`; see :mod:`accelplat.pytest_plugin._lease`.

Importing this module imports nothing from accelplat beyond this file and never imports torch.
A session that uses no marker, fixture or option of the plugin never detects a platform.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from accelplat.errors import MarkerError

if TYPE_CHECKING:
    from accelplat._capabilities import Capability
    from accelplat._platform import Platform
    from accelplat._usage import SettleResult
    from accelplat.timeline._trace import DeviceTrack

__all__ = [
    "DEFAULT_LEAK_TOLERANCE",
    "MARKERS",
    "LeakChecker",
    "MarkerError",
    "accel_platform",
    "settled_device_memory",
    "share_after_teardown",
    "skip_reason",
]

MARKERS: dict[str, str] = {
    "accelplat_requires": (
        "accelplat_requires(*capabilities, devices=None, device_memory=None, platforms=None, "
        "shm=None): skip unless every named accelplat capability is available and every "
        "resource requirement is met; the reason lists each unmet one"
    ),
    "accelplat_requires_graph": (
        "accelplat_requires_graph: skip unless the accelerator platform can capture device "
        "graphs (CUDA/HIP/XPU graphs)"
    ),
    "accelplat_requires_device_memory": (
        "accelplat_requires_device_memory(gib, *, devices=1, bytes=None): skip unless each of "
        "the first `devices` visible devices has at least `gib` GiB of memory in total"
    ),
    "accelplat_requires_devices": (
        "accelplat_requires_devices(n): skip unless at least n devices are visible"
    ),
    "accelplat_requires_shm": (
        "accelplat_requires_shm(gib, *, path='/dev/shm'): skip unless at least `gib` GiB are "
        "free on the shared-memory mount"
    ),
    "accelplat_platforms": (
        "accelplat_platforms(*names): skip unless the current accelplat platform is one of names"
    ),
}
"""Marker name to the line registered with pytest (shown by ``pytest --markers``)."""

DEFAULT_LEAK_TOLERANCE = "256MiB"
"""Growth of used device memory across one test that is not a leak (as text; the bytes are
:data:`accelplat._leaks.DEFAULT_LEAK_TOLERANCE_BYTES`, checked equal by the tests)."""

_GIB = 1024**3
_FORCED_KEY = pytest.StashKey[str]()
_PREVIOUS_ENV_KEY = pytest.StashKey["str | None"]()
_BASELINE_KEY = pytest.StashKey[dict[int, int]]()
_AFTER_TEARDOWN_KEY = pytest.StashKey[dict[int, int]]()
_LEAK_PROPERTY = "accelplat_leak"
_LEAK_PLUGIN_NAME = "accelplat-leak-check"
_ENV_PLATFORM = "ACCELPLAT_PLATFORM"


@dataclass
class _Leak:
    nodeid: str
    device: int
    before: int
    after: int


# --------------------------------------------------------------------------------------------
# options and configuration


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--accelplat-platform``, the leak check, and ``--accelplat-lease`` options."""
    group = parser.getgroup("accelplat", "accelplat accelerator platform")
    group.addoption(
        "--accelplat-platform",
        metavar="NAME",
        default=None,
        help="force the accelplat platform for the whole session (e.g. cuda, rocm, xpu, cpu, "
        "simulated, or a plugin's name); also exported as ACCELPLAT_PLATFORM to child processes",
    )
    group.addoption(
        "--accelplat-capabilities",
        action="store_true",
        default=False,
        help="print the accelplat capability table of device 0 (built-in and project "
        "capabilities, with reasons) in the session header",
    )
    group.addoption(
        "--accelplat-leak-check",
        action="store_true",
        default=None,
        help="after each test, report in the terminal summary the tests that left device "
        "memory held beyond the tolerance",
    )
    group.addoption(
        "--accelplat-leak-tolerance",
        metavar="SIZE",
        default=None,
        help="growth of used device memory across one test that is not reported, e.g. 512MiB "
        f"(default: ini accelplat_leak_tolerance, else {DEFAULT_LEAK_TOLERANCE})",
    )
    group.addoption(
        "--accelplat-leak-wait",
        metavar="SECONDS",
        default=None,
        help="how long to wait for memory to come back before a test counts as leaking "
        "(default: ini accelplat_leak_wait, else 4 x the platform's stability window on "
        "lazily releasing platforms and 0 elsewhere)",
    )
    group.addoption(
        "--accelplat-lease",
        action="store_true",
        default=False,
        help="give each test process (each pytest-xdist worker) its own device(s) through "
        "accelplat device leases, before any test can start a device runtime; a test that "
        "declares more devices gets that many for its duration",
    )
    group.addoption(
        "--accelplat-lease-count",
        type=_lease_count,
        default=1,
        metavar="N",
        help="devices each test process holds with --accelplat-lease (default 1)",
    )
    group.addoption(
        "--accelplat-lease-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long --accelplat-lease waits for devices (default 600)",
    )
    group.addoption(
        "--accelplat-lease-min-free",
        default=None,
        metavar="SIZE",
        help="free memory each leased device must have, e.g. 40GiB",
    )
    parser.addini(
        "accelplat_leak_check",
        type="bool",
        default=False,
        help="enable the accelplat device-memory leak check (as --accelplat-leak-check)",
    )
    parser.addini(
        "accelplat_leak_tolerance",
        default=DEFAULT_LEAK_TOLERANCE,
        help=f"leak-check tolerance, a size such as 256MiB (default {DEFAULT_LEAK_TOLERANCE})",
    )
    parser.addini(
        "accelplat_leak_wait",
        default="auto",
        help="seconds to wait for memory to come back before reporting a leak, or 'auto'",
    )


def _lease_count(text: str) -> int:
    # the same rule as `accelplat lease -n`: ASCII digits, 1..999999
    from accelplat import _validate

    return _validate.integer(
        text,
        "",
        minimum=1,
        maximum=999_999,
        expected="a number of devices >= 1",
        from_text=True,
        error=ValueError,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """With ``--accelplat-lease``, lease this process's devices before conftests are imported."""
    namespace = early_config.known_args_namespace
    if getattr(namespace, "accelplat_lease", False):
        from accelplat.pytest_plugin._lease import start

        start(early_config, namespace)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers; apply ``--accelplat-platform``; set up the leak check."""
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    name = config.getoption("--accelplat-platform", default=None)
    if name:
        _force_platform(config, str(name))
    _load_project_capabilities(config)
    if _leak_check_enabled(config):
        checker = LeakChecker(config, _leak_tolerance(config), _leak_wait(config))
        config.pluginmanager.register(checker, _LEAK_PLUGIN_NAME)


def _load_project_capabilities(config: pytest.Config) -> None:
    """Register ``[tool.accelplat.capabilities]`` of the rootdir's ``pyproject.toml``."""
    path = config.rootpath / "pyproject.toml"
    if not path.is_file():
        return
    from accelplat._capabilities import load_pyproject
    from accelplat.errors import ConfigurationError

    try:
        load_pyproject(path)
    except ConfigurationError as exc:
        raise pytest.UsageError(f"accelplat capabilities: {exc}") from None


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """With ``--accelplat-capabilities``, the capability table of device 0."""
    if not config.getoption("--accelplat-capabilities", default=False):
        return None
    from accelplat._capabilities import capabilities, table_lines
    from accelplat.errors import AccelplatError

    try:
        platform = _current(config)
        table = capabilities(0, platform=platform)
    except AccelplatError as exc:
        return [f"accelplat capabilities: unavailable ({exc})"]
    devices = platform.devices()
    head = f"accelplat capabilities of {platform.name} device 0"
    if devices:
        d = devices[0]
        head += f" ({d.name}, {d.arch or 'architecture unknown'})"
    return [head + ":", *("  " + line for line in table_lines(table))]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Check every ``accelplat_requires`` marker's names and arguments at collection time.

    Raises:
        pytest.UsageError: Listing each test with an unknown capability name or malformed
            arguments, so a typo never turns into a silent skip.
    """
    errors: list[str] = []
    for item in items:
        for mark in item.iter_markers("accelplat_requires"):
            try:
                _parse_requires(mark)
            except MarkerError as exc:
                errors.append(f"{item.nodeid}: {exc}")
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise pytest.UsageError("accelplat_requires: " + "\n  ".join(["", *shown]).lstrip("\n"))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Undo ``--accelplat-platform`` and forget the project capabilities of this session."""
    _TABLES.clear()
    if "accelplat._capabilities" in sys.modules:
        from accelplat._capabilities import clear_project_capabilities

        clear_project_capabilities()
    name = config.stash.get(_FORCED_KEY, None)
    if name is None:
        return
    from accelplat import _registry as registry

    previous = config.stash.get(_PREVIOUS_ENV_KEY, None)
    if previous is None:
        os.environ.pop(_ENV_PLATFORM, None)
    else:
        os.environ[_ENV_PLATFORM] = previous
    if _forced_override() == name:
        registry.set_current_platform(None)


def _force_platform(config: pytest.Config, raw: str) -> None:
    from accelplat import _registry as registry
    from accelplat.errors import AccelplatError

    name = raw.strip().lower()
    try:
        registry.set_current_platform(name)
        registry.current_platform()
    except AccelplatError as exc:
        registry.set_current_platform(None)
        raise pytest.UsageError(f"--accelplat-platform {raw}: {exc}") from None
    config.stash[_FORCED_KEY] = name
    config.stash[_PREVIOUS_ENV_KEY] = os.environ.get(_ENV_PLATFORM)
    os.environ[_ENV_PLATFORM] = name


def _forced_override() -> object:
    from accelplat import _registry as registry

    return registry.forced_platform()


def _reapply_forced(config: pytest.Config) -> None:
    """Put ``--accelplat-platform`` back if something (e.g. ``registry.reset()``) cleared it.

    A platform a test or fixture forced itself is left alone.
    """
    name = config.stash.get(_FORCED_KEY, None)
    if name is None or _forced_override() is not None:
        return
    from accelplat import _registry as registry

    registry.set_current_platform(name)


def _current(config: pytest.Config) -> Platform:
    _reapply_forced(config)
    from accelplat._registry import current_platform

    return current_platform()


def _leak_check_enabled(config: pytest.Config) -> bool:
    flag = config.getoption("--accelplat-leak-check", default=None)
    if flag is not None:
        return bool(flag)
    return bool(config.getini("accelplat_leak_check"))


def _leak_tolerance(config: pytest.Config) -> int:
    from accelplat._leaks import parse_leak_tolerance
    from accelplat.errors import ConfigurationError

    raw = config.getoption("--accelplat-leak-tolerance", default=None)
    argument = "--accelplat-leak-tolerance"
    if raw is None:
        raw = config.getini("accelplat_leak_tolerance") or DEFAULT_LEAK_TOLERANCE
        argument = "accelplat_leak_tolerance"
    try:
        return parse_leak_tolerance(str(raw), argument=argument)
    except ConfigurationError as exc:
        raise pytest.UsageError(str(exc)) from None


def _leak_wait(config: pytest.Config) -> float | None:
    raw = config.getoption("--accelplat-leak-wait", default=None)
    argument = "--accelplat-leak-wait"
    if raw is None:
        raw = config.getini("accelplat_leak_wait") or "auto"
        argument = "accelplat_leak_wait"
    text = str(raw)
    if text.strip().lower() == "auto":
        return None
    from accelplat import _validate

    return _validate.number(
        text,
        argument,
        minimum=0,
        expected="'auto' or seconds >= 0",
        from_text=True,
        error=pytest.UsageError,
    )


# --------------------------------------------------------------------------------------------
# markers


def _fmt_gib(n: float) -> str:
    return f"{n / _GIB:.1f} GiB"


def _number(value: object, what: str) -> float:
    from accelplat import _validate

    return _validate.number(value, what, minimum=0, not_a_number="a number", error=MarkerError)


def _count(value: object, what: str) -> int:
    from accelplat import _validate

    return _validate.integer(value, what, minimum=1, error=MarkerError)


def _one_arg(mark: pytest.Mark, keyword: str) -> object:
    if mark.args:
        if len(mark.args) > 1 or keyword in mark.kwargs:
            raise MarkerError(f"{mark.name} takes one {keyword} argument, got {mark.args!r}")
        return mark.args[0]
    if keyword not in mark.kwargs:
        raise MarkerError(f"{mark.name} needs its {keyword} argument")
    return mark.kwargs[keyword]


# Requirements: each answers "met" (None) or why not. The markers only parse their arguments
# into these; ``accelplat_requires`` combines any of them.


def _need_platforms(platform: Platform, names: list[str]) -> str | None:
    if platform.name in names:
        return None
    return f"runs only on {', '.join(names)}; the current platform is {platform.name}"


def _need_devices(platform: Platform, needed: int) -> str | None:
    found = platform.device_count()
    if found >= needed:
        return None
    return f"needs {needed} devices, {platform.name} has {found} visible"


_TABLES: dict[tuple[int, int, int], tuple[Platform, Mapping[str, Capability]]] = {}
"""Capability tables already decided this session, by (platform, device, project generation);
each entry keeps its platform alive, so that its ``id`` cannot be reused while cached."""


def _table(platform: Platform, device: int) -> Mapping[str, Capability]:
    """The capability table of ``device``, decided once per session and project table."""
    from accelplat._capabilities import capabilities, generation

    key = (id(platform), device, generation())
    entry = _TABLES.get(key)
    if entry is None:
        entry = _TABLES[key] = (platform, capabilities(device, platform=platform))
    return entry[1]


def _need_capability(platform: Platform, name: str, devices: int) -> str | None:
    for device in range(min(devices, platform.device_count()) or 1):
        cap = _table(platform, device)[name]
        if not cap.available:
            where = f" on device {device}" if device else ""
            return f"needs {name}{where}: {cap.reason}"
    return None


def _need_device_memory(platform: Platform, need: int, text: str, devices: int) -> str | None:
    count = platform.device_count()
    if count < devices:
        what = "device" if devices == 1 else f"{devices} devices"
        return f"needs {text} device memory on {what}, {platform.name} has {count} visible"
    for device in range(devices):
        total = platform.memory_info(device).total
        if total < need:
            return (
                f"needs {text} device memory, {platform.name} device {device} has "
                f"{_fmt_gib(total)} total"
            )
    return None


def _need_shm(need: int, path: str) -> str | None:
    from accelplat._host import shm_info
    from accelplat.errors import ConfigurationError

    try:
        info = shm_info(path)
    except ConfigurationError as exc:
        return f"needs {_fmt_gib(need)} free in {path}: {exc}"
    if info.free >= need:
        return None
    return (
        f"needs {_fmt_gib(need)} free in {info.path}, found {_fmt_gib(info.free)} free of "
        f"{_fmt_gib(info.total)}"
    )


def _platform_names(value: object, what: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise MarkerError(f'{what} takes one or more platform names, e.g. ("cuda", "rocm")')
    names = []
    for n in items:
        if not isinstance(n, str) or not n.strip():
            raise MarkerError(f'{what} takes one or more platform names, e.g. ("cuda", "rocm")')
        names.append(n.strip().lower())
    return names


def _size(value: object, what: str) -> int:
    from accelplat._sizing import parse_size
    from accelplat.errors import ConfigurationError

    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise MarkerError(f"{what} must be a size such as '40GiB', got {value!r}")
    try:
        return parse_size(value, argument=what)
    except ConfigurationError as exc:
        raise MarkerError(str(exc)) from None


@dataclass(frozen=True)
class _Requires:
    names: tuple[str, ...]
    devices: int | None
    device_memory: int | None
    platforms: tuple[str, ...]
    shm: int | None


_REQUIRES_KEYWORDS = ("devices", "device_memory", "platforms", "shm")


def _parse_requires(mark: pytest.Mark) -> _Requires:
    """Check an ``accelplat_requires`` marker and return what it asks for.

    Raises:
        MarkerError: For an unknown capability name, an unknown keyword or a bad value.
    """
    from accelplat._capabilities import BUILTIN, known_names, project_capabilities

    names = []
    project = project_capabilities()
    for raw in mark.args:
        if not isinstance(raw, str) or not raw.strip():
            raise MarkerError(f"capability names must be strings, got {raw!r}")
        name = raw.strip().lower()
        if name not in BUILTIN and name not in project:
            raise MarkerError(
                f"unknown capability {raw!r} (known: {', '.join(known_names())}); define "
                "project capabilities in [tool.accelplat.capabilities] or with "
                "accelplat._capabilities.define_capability"
            )
        names.append(name)
    unknown = sorted(set(mark.kwargs) - set(_REQUIRES_KEYWORDS))
    if unknown:
        raise MarkerError(
            f"unknown keyword(s) {', '.join(unknown)}; known: {', '.join(_REQUIRES_KEYWORDS)}"
        )
    kw = mark.kwargs
    devices = _count(kw["devices"], "accelplat_requires(devices=)") if "devices" in kw else None
    memory = (
        _size(kw["device_memory"], "accelplat_requires(device_memory=)")
        if kw.get("device_memory") is not None
        else None
    )
    platforms = (
        tuple(_platform_names(kw["platforms"], "accelplat_requires(platforms=)"))
        if "platforms" in kw
        else ()
    )
    shm = _size(kw["shm"], "accelplat_requires(shm=)") if kw.get("shm") is not None else None
    if not (names or devices or memory is not None or platforms or shm is not None):
        raise MarkerError("accelplat_requires needs at least one capability or requirement")
    return _Requires(tuple(names), devices, memory, platforms, shm)


def _check_requires(mark: pytest.Mark, platform: Platform) -> str | None:
    from accelplat._host import DEFAULT_SHM_PATH

    need = _parse_requires(mark)
    unmet: list[str | None] = []
    if need.platforms:
        unmet.append(_need_platforms(platform, list(need.platforms)))
    if need.devices is not None:
        unmet.append(_need_devices(platform, need.devices))
    for name in need.names:
        unmet.append(_need_capability(platform, name, need.devices or 1))
    if need.device_memory is not None:
        text = _fmt_gib(need.device_memory)
        unmet.append(_need_device_memory(platform, need.device_memory, text, need.devices or 1))
    if need.shm is not None:
        unmet.append(_need_shm(need.shm, DEFAULT_SHM_PATH))
    reasons = [r for r in unmet if r is not None]
    return "; ".join(reasons) if reasons else None


def _check_platforms(mark: pytest.Mark, platform: Platform) -> str | None:
    if mark.kwargs:
        raise MarkerError(
            'accelplat_platforms takes one or more platform names, e.g. ("cuda", "rocm")'
        )
    names = [str(n).strip().lower() for n in mark.args]
    if not names:
        raise MarkerError(
            'accelplat_platforms takes one or more platform names, e.g. ("cuda", "rocm")'
        )
    return _need_platforms(platform, names)


def _check_devices(mark: pytest.Mark, platform: Platform) -> str | None:
    return _need_devices(platform, _count(_one_arg(mark, "n"), "accelplat_requires_devices(n)"))


def _check_graph(mark: pytest.Mark, platform: Platform) -> str | None:
    if mark.args or mark.kwargs:
        raise MarkerError("accelplat_requires_graph takes no arguments")
    graphs = _table(platform, 0)["graphs"]
    if graphs.available:
        return None
    return f"needs device graph capture; {platform.name} has none: {graphs.reason}"


def _device_memory_need(mark: pytest.Mark) -> tuple[int, str, int]:
    kwargs = dict(mark.kwargs)
    devices = _count(kwargs.pop("devices", 1), "accelplat_requires_device_memory(devices=)")
    label = kwargs.pop("label", None)
    if "bytes" in kwargs:
        if mark.args or "gib" in kwargs:
            raise MarkerError("accelplat_requires_device_memory takes gib or bytes=, not both")
        need = math.ceil(_number(kwargs.pop("bytes"), "accelplat_requires_device_memory(bytes=)"))
    else:
        gib = _number(_one_arg(mark, "gib"), "accelplat_requires_device_memory(gib)")
        kwargs.pop("gib", None)
        need = math.ceil(gib * _GIB)
    if kwargs:
        raise MarkerError(
            f"accelplat_requires_device_memory got unknown arguments {sorted(kwargs)}"
        )
    text = _fmt_gib(need) + (f" ({label})" if label else "")
    return need, text, devices


def _check_device_memory(mark: pytest.Mark, platform: Platform) -> str | None:
    need, text, devices = _device_memory_need(mark)
    return _need_device_memory(platform, need, text, devices)


def _check_shm(mark: pytest.Mark, platform: Platform) -> str | None:
    from accelplat._host import DEFAULT_SHM_PATH

    kwargs = dict(mark.kwargs)
    path = kwargs.pop("path", DEFAULT_SHM_PATH)
    gib = _number(_one_arg(mark, "gib"), "accelplat_requires_shm(gib)")
    kwargs.pop("gib", None)
    if kwargs:
        raise MarkerError(f"accelplat_requires_shm got unknown arguments {sorted(kwargs)}")
    return _need_shm(math.ceil(gib * _GIB), str(path))


_CHECKS = (
    ("accelplat_requires", _check_requires),
    ("accelplat_platforms", _check_platforms),
    ("accelplat_requires_devices", _check_devices),
    ("accelplat_requires_graph", _check_graph),
    ("accelplat_requires_device_memory", _check_device_memory),
    ("accelplat_requires_shm", _check_shm),
)


_CHECK_ORDER = {name: (i, check) for i, (name, check) in enumerate(_CHECKS)}


def _marks(item: pytest.Item) -> list[tuple[pytest.Mark, Any]]:
    """The item's accelplat marks with their checks, in the order of ``_CHECKS``.

    Within one marker name the closest mark comes first, as ``item.iter_markers(name)`` gives
    them; the node chain is walked once for all names (this runs before every test).
    """
    found = []
    for mark in item.iter_markers():
        known = _CHECK_ORDER.get(mark.name)
        if known is not None:
            found.append((known[0], mark, known[1]))
    if not found:
        return []
    found.sort(key=lambda entry: entry[0])  # stable: keeps closest-first within a name
    return [(mark, check) for _, mark, check in found]


def skip_reason(item: pytest.Item) -> str | None:
    """Return why ``item`` must be skipped by its accelplat markers, or ``None``.

    Every accelplat marker on the item (from the function, class, module or ``pytestmark``)
    must be satisfied; every one that is not adds its reason (joined with ``"; "``).

    Args:
        item: A collected test.

    Returns:
        The reason, or ``None`` when the test may run (or has no accelplat marker).

    Raises:
        MarkerError: For a marker with malformed arguments.

    Side effects:
        Detects the platform on the first marker found; reads memory figures for the memory
        markers (no device context on context-free platforms).
    """
    found = _marks(item)
    if not found:
        return None
    platform = _current(item.config)
    reasons: list[str] = []
    for mark, check in found:
        reason: str | None = check(mark, platform)
        if reason is not None and reason not in reasons:
            reasons.append(reason)
    return "; ".join(reasons) if reasons else None


# --------------------------------------------------------------------------------------------
# per-test hooks


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip tests whose accelplat markers are not met."""
    _reapply_forced(item.config)
    error: str | None = None
    reason: str | None = None
    try:
        reason = skip_reason(item)
    except MarkerError as exc:  # failed outside the except block: no chained traceback
        error = str(exc)
    if error is not None:
        pytest.fail(error, pytrace=False)
    if reason is not None:
        _skip_at_item(reason)


def _skip_at_item(reason: str) -> None:
    """Skip, reported at the test's location (as pytest's own skip markers are)."""
    try:
        exc = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword: reported at this line instead
        exc = pytest.skip.Exception(reason)
    raise exc


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Put ``--accelplat-platform`` back before the test body if a fixture reset the registry."""
    _reapply_forced(item.config)


def _used_bytes(platform: Platform) -> dict[int, int]:
    return {d: platform.memory_info(d).used for d in range(platform.device_count())}


def share_after_teardown(
    item: pytest.Item, devices: Sequence[DeviceTrack], reading: Sequence[int | None]
) -> None:
    """Offer the leak check a reading of used memory taken as ``item``'s teardown ended.

    The timeline samples every device at that point to close the test's span; the leak check
    compares memory at the same point, so it takes this reading instead of reading again. A
    reading that misses a device (a failed query) is not offered, nor is anything kept when
    the leak check is off.

    Args:
        item: The test.
        devices: The sampled devices, in reading order.
        reading: Used bytes per device, ``None`` where the query failed.
    """
    if item.config.pluginmanager.get_plugin(_LEAK_PLUGIN_NAME) is None:
        return  # no leak check to read it
    if any(used is None for used in reading):
        return
    item.stash[_AFTER_TEARDOWN_KEY] = {
        d.index: used for d, used in zip(devices, reading, strict=True) if used is not None
    }


def _used_after_teardown(item: pytest.Item, platform: Platform) -> dict[int, int]:
    """Used bytes per visible device now, at the end of ``item``'s teardown.

    Takes the timeline's reading of this same moment when it covers every visible device.
    """
    shared = item.stash.get(_AFTER_TEARDOWN_KEY, None)
    if shared is not None:
        del item.stash[_AFTER_TEARDOWN_KEY]
        if sorted(shared) == list(range(platform.device_count())):
            return shared
    return _used_bytes(platform)


def _fmt_size(n: int) -> str:
    if abs(n) >= _GIB:
        return f"{n / _GIB:.2f} GiB"
    return f"{n / 1024**2:.0f} MiB"


class LeakChecker:
    """The ``--accelplat-leak-check`` plugin object, registered only when the check is on.

    Before each test that is not skipped it records used memory of every visible device; after
    the test's teardown it samples again, and a device whose usage grew by more than the
    tolerance is a finding. On lazily releasing platforms it first waits up to ``wait_s`` (by
    default 4 x the platform's stability window) for the memory to come back. Findings travel
    in the teardown report's ``user_properties`` (so pytest-xdist workers report them too) and
    are listed in the terminal summary. Memory held by fixtures of a wider scope than the test
    counts against the first test that sets them up.

    Args:
        config: The pytest config.
        tolerance: Bytes of growth that are not reported.
        wait_s: Seconds to wait for memory to come back, or ``None`` for the default.
    """

    def __init__(self, config: pytest.Config, tolerance: int, wait_s: float | None) -> None:
        from accelplat._leaks import is_leak  # the one leak rule, loaded once with the check

        self.config = config
        self.tolerance = tolerance
        self.wait_s = wait_s
        self.leaks: list[_Leak] = []
        self.checked = 0
        self._is_leak = is_leak

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Record the baseline (after the marker checks, which run first)."""
        item.stash[_BASELINE_KEY] = _used_bytes(_current(item.config))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """After teardown, compare device memory with the baseline and attach what leaked."""
        if call.when == "teardown":
            baseline = item.stash.get(_BASELINE_KEY, None)
            if baseline is not None:
                item.user_properties.append((_LEAK_PROPERTY, self._leaks_after(item, baseline)))
        report: pytest.TestReport = yield
        return report

    def _leaks_after(self, item: pytest.Item, baseline: dict[int, int]) -> list[list[int]]:
        """Return ``[device, before, after]`` for each device above baseline + tolerance."""
        is_leak = self._is_leak
        platform = _current(item.config)
        after = _used_after_teardown(item, platform)
        over = sorted(
            d for d, used in after.items() if is_leak(baseline.get(d), used, self.tolerance)
        )
        if not over:
            return []
        wait_s = self.wait_s
        if wait_s is None:
            profile = platform.release
            wait_s = 4 * profile.stable_duration_s if profile.lazy else 0.0
        if wait_s > 0:
            # the waiting machinery loads with the first test that needs it
            from accelplat._memory import wait_for_memory_to_clear
            from accelplat.errors import MemoryNotSettledError

            targets = {d: baseline[d] + self.tolerance for d in over}
            try:
                result = wait_for_memory_to_clear(
                    over,
                    threshold_bytes=targets,
                    timeout_s=wait_s,
                    stable_duration_s=0,
                    platform=platform,
                )
                snap = result.snapshot
            except MemoryNotSettledError as exc:
                snap = exc.snapshot
            after.update({d: m.used for d, m in snap.memory.items()})
        return [
            [d, baseline[d], after[d]]
            for d in sorted(after)
            if is_leak(baseline.get(d), after[d], self.tolerance)
        ]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect findings from teardown reports (also those sent back by xdist workers)."""
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key != _LEAK_PROPERTY:
                continue
            self.checked += 1
            findings: list[list[int]] = list(value) if isinstance(value, list) else []
            for device, before, after in findings:
                self.leaks.append(_Leak(report.nodeid, int(device), int(before), int(after)))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Write the findings."""
        tolerance = _fmt_size(self.tolerance)
        if not self.leaks:
            terminalreporter.write_line(
                f"accelplat leak check: no test left device memory held beyond {tolerance} "
                f"({self.checked} checked)"
            )
            return
        tests = sorted({leak.nodeid for leak in self.leaks})
        terminalreporter.section("accelplat leak check", sep="=", yellow=True, bold=True)
        terminalreporter.write_line(
            f"{len(tests)} test(s) left device memory held beyond {tolerance} "
            f"({self.checked} checked):"
        )
        for leak in self.leaks:
            terminalreporter.write_line(
                f"  {leak.nodeid}: device {leak.device} +{_fmt_size(leak.after - leak.before)} "
                f"({_fmt_size(leak.before)} -> {_fmt_size(leak.after)} used)"
            )


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def accel_platform(request: pytest.FixtureRequest) -> Platform:
    """The current accelplat platform (``--accelplat-platform`` when given, else detected).

    Returns:
        The :class:`~accelplat._platform.Platform` instance.
    """
    return _current(request.config)


@pytest.fixture
def settled_device_memory(request: pytest.FixtureRequest) -> SettleResult:
    """Wait before the test until device memory freed by earlier tests has come back.

    Calls :func:`accelplat._memory.wait_for_memory_to_settle` with its defaults (at most 10 %
    of each device used; the platform's stability window on lazy platforms, one sample on eager
    ones when memory is already back).

    Returns:
        The :class:`~accelplat._usage.SettleResult`.
    """
    from accelplat._memory import wait_for_memory_to_settle

    return wait_for_memory_to_settle(platform=_current(request.config))
