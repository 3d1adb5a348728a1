"""accelplat's pytest plugin, the ``pytest11`` entry point ``accelplat`` (docs/pytest-plugin.md).

Its parts register only when their option is on: a session using none never detects a platform.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from accelplat import _validate
from accelplat._util import format_bytes
from accelplat.errors import AccelplatError, MarkerError
from accelplat.pytest_plugin._requires import MARKER, parse, skip_reason
from accelplat.pytest_plugin._shared import (
    DEFAULT_LEAK_TOLERANCE,
    FORCED_KEY,
    LEAK_PLUGIN_NAME,
    auto_seconds,
    current,
    reapply_forced,
    skip_at_test,
    usage_errors,
)
from accelplat.timeline._defaults import DEFAULT_HZ, DEFAULT_LEAK_GRACE_S

if TYPE_CHECKING:
    from accelplat._platform import Platform
    from accelplat._types import SettleResult

__all__: list[str] = []  # a plugin: its marker, fixtures and options are reached through pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the plugin's options, all in the ``accelplat`` group, and its ini settings."""
    tol, hz, grace = DEFAULT_LEAK_TOLERANCE, DEFAULT_HZ, DEFAULT_LEAK_GRACE_S
    add = parser.getgroup("accelplat", "accelplat accelerator platform").addoption
    # fmt: off
    add("--accelplat-platform", metavar="NAME", help="force the platform for the session "
        "(cuda, rocm, xpu, cpu, simulated, a plugin's name); exported as ACCELPLAT_PLATFORM")
    add("--accelplat-capabilities", action="store_true",
        help="print the capability table of device 0 in the header")
    add("--accelplat-leak-check", action="store_true", default=None,
        help="report the tests that left device memory held beyond the tolerance")
    add("--accelplat-leak-tolerance", metavar="SIZE", help="growth of used device memory "
        f"across one test that is not a leak (default: ini accelplat_leak_tolerance, {tol})")
    add("--accelplat-leak-wait", metavar="SECONDS", help="how long to wait for memory to come "
        "back before a test counts as leaking (default: 4 x the stability window if lazy)")
    add("--accelplat-timeline", metavar="PATH",
        help="sample device memory during the session; write an HTML timeline to PATH")
    add("--accelplat-timeline-hz", metavar="N", type=float, default=hz,
        help=f"timeline samples per second (default {hz:g})")
    add("--accelplat-timeline-json", metavar="PATH",
        help="also save the raw trace as JSON (render it later with `accelplat report`)")
    add("--accelplat-timeline-leak-tolerance", metavar="SIZE",
        help=f"the timeline's leak tolerance (default: --accelplat-leak-tolerance, {tol})")
    add("--accelplat-timeline-leak-grace", metavar="SECONDS", type=float, default=grace,
        help=f"seconds after the last test for memory to come back (default {grace:g})")
    add("--accelplat-lease", action="store_true", help="give each test process (xdist worker) "
        "its own devices; a test that declares more devices gets them for its duration")
    add("--accelplat-lease-count", metavar="N", type=_lease_count, default=1,
        help="devices each test process holds with --accelplat-lease (default 1)")
    add("--accelplat-lease-timeout", metavar="SECONDS", type=_seconds, default=600.0,
        help="how long a lease (--accelplat-lease, --accelplat-pack) waits (default 600)")
    add("--accelplat-lease-min-free", metavar="SIZE",
        help="free memory each leased device must have, e.g. 40GiB")
    add("--accelplat-pack", action="store_true", help="lease each test the memory it needs "
        "(accelplat_requires(device_memory=), else its learned footprint, else a whole device), "
        "so that xdist workers share devices; bodies run in new processes")
    add("--accelplat-footprints", metavar="PATH", help="where --accelplat-pack learns each "
        "test's peak memory (default: in pytest's cache directory)")
    add("--accelplat-enforce", metavar="MODE", help="how packed tests are held to budgets: auto "
        "(default, or $ACCELPLAT_ENFORCE), mps (started if none runs), torch or none")
    ini = parser.addini
    ini("accelplat_platform", "force the platform, as --accelplat-platform (which wins)")
    ini("accelplat_leak_check", "turn the leak check on", "bool", False)
    ini("accelplat_leak_tolerance", f"leak tolerance (default {tol})", default=tol)
    ini("accelplat_leak_wait", "seconds to wait before reporting a leak, or 'auto'", default="auto")
    ini("accelplat_timeline", "write an HTML timeline there, as --accelplat-timeline; relative "
        "to the ini file's directory")
    ini("accelplat_timeline_json", "save the raw trace there too, as --accelplat-timeline-json")
    ini("accelplat_settle_timeout", "settled_device_memory's time limit in seconds, or 'auto' "
        f"({FIXTURE_SETTLE_TIMEOUT_EAGER_S:g} s where release is eager, else the platform's "
        f"settle timeout up to {FIXTURE_SETTLE_TIMEOUT_LAZY_MAX_S:g} s)", default="auto")
    ini("accelplat_settle_owners", "whose memory settled_device_memory waits for: 'ours' (this "
        "process and its descendants; co-tenants are named, not waited for) or 'all'",
        default="ours")
    ini("accelplat_timeline_wait_fixtures", "fixtures the timeline shows as memory waits",
        "linelist", ["settled_device_memory"])
    ini("accelplat_lease", "lease each test process its own devices, as --accelplat-lease",
        "bool", False)
    # fmt: on


# ini settings that fill the option of their name (its dest) when the command line does not give
# it, which always wins; the paths are relative to the ini file
_INI_PATHS = ("accelplat_timeline", "accelplat_timeline_json")
_FROM_INI = ("accelplat_platform", "accelplat_lease", *_INI_PATHS)


def _apply_ini(config: pytest.Config, namespace: object) -> None:
    """Fill the options not given on the command line in ``namespace`` from the ini file."""
    for name in _FROM_INI:
        value = config.getini(name)
        if getattr(namespace, name, None) or not value:
            continue
        if name in _INI_PATHS and config.inipath is not None:
            value = str(config.inipath.parent / str(value))
        setattr(namespace, name, value)


def _seconds(text: str) -> float:
    # finite and >= 0: a negative, nan or inf timeout is a usage error, not a skip of every test
    return _validate.number(text, "seconds", minimum=0, from_text=True)


def _lease_count(text: str) -> int:
    # the rule of `accelplat lease -n`: ASCII digits, 1..999999
    return _validate.integer(text, "count", minimum=1, maximum=999_999, from_text=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` with packing or leases: workers from the devices and budgets, not the CPUs."""
    _apply_ini(config, config.option)
    ours = config.option.accelplat_pack or config.option.accelplat_lease
    if not ours or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own count
    from accelplat.pytest_plugin._pack import auto_workers

    return auto_workers(config)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """With ``--accelplat-lease``, lease this process's devices before conftests are imported."""
    namespace = early_config.known_args_namespace
    _apply_ini(early_config, namespace)
    if getattr(namespace, "accelplat_lease", False):
        from accelplat.pytest_plugin._lease import start

        start(early_config, namespace)


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; apply ``--accelplat-platform``; start the parts that are on."""
    config.addinivalue_line("markers", MARKER)
    _apply_ini(config, config.option)
    if name := config.getoption("--accelplat-platform"):
        _force_platform(config, str(name))
    if config.getoption("--accelplat-lease"):
        from accelplat.pytest_plugin._lease import check_workers

        check_workers(config)
    path = config.rootpath / "pyproject.toml"
    if path.is_file():  # [tool.accelplat.capabilities]
        from accelplat._capabilities import load_pyproject

        with usage_errors("accelplat capabilities: "):
            load_pyproject(path)
    flag = config.getoption("--accelplat-leak-check")
    checking = config.getini("accelplat_leak_check") if flag is None else flag
    if checking or config.getoption("--accelplat-timeline"):
        from accelplat.pytest_plugin import _leaks

        # the timeline judges by the leak check's readings by owner (one rule): read them quietly
        _leaks.configure(config, report=bool(checking))
    if config.getoption("--accelplat-timeline"):
        from accelplat.pytest_plugin import _timeline

        _timeline.configure(config)
    if config.getoption("--accelplat-pack"):  # after the timeline: its signal handling comes first
        from accelplat.pytest_plugin import _pack

        _pack.configure(config)


def _force_platform(config: pytest.Config, raw: str) -> None:
    """Force the platform for the session and export it; undone when the session ends."""
    from accelplat import _registry as registry

    name = raw.strip().lower()
    try:
        registry.set_current_platform(name)
        registry.current_platform()
    except AccelplatError as exc:
        registry.set_current_platform(None)
        raise pytest.UsageError(f"--accelplat-platform {raw}: {exc}") from None
    config.stash[FORCED_KEY] = name
    env = pytest.MonkeyPatch()
    env.setenv("ACCELPLAT_PLATFORM", name)
    config.add_cleanup(env.undo)

    @config.add_cleanup
    def _unforce() -> None:
        if registry.forced_platform() == name:  # unless a test forced another
            registry.set_current_platform(None)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """One line naming the platform, its devices and the parts that are on, when any is on.

    With ``--accelplat-capabilities``, the capability table of device 0 follows it.
    """
    lines = [] if (line := _header_line(config)) is None else [line]
    if config.getoption("--accelplat-capabilities"):
        lines += _capability_lines(config)
    return lines


def _header_line(config: pytest.Config) -> str | None:
    # Every part read from its option after _apply_ini, so the ini's parts are named too.
    from accelplat import __version__
    from accelplat.pytest_plugin._shared import PACK_KEY

    parts = []
    if (leak_check := config.pluginmanager.get_plugin(LEAK_PLUGIN_NAME)) is not None:
        parts.append(f"leak check (beyond {format_bytes(leak_check.tolerance)})")
    if timeline := config.getoption("--accelplat-timeline"):
        parts.append(f"timeline ({timeline})")
    if config.getoption("--accelplat-lease"):
        count = config.getoption("--accelplat-lease-count")
        parts.append(f"lease ({count} device{'s' if count != 1 else ''} per test process)")
    if pack := config.stash.get(PACK_KEY, None):
        parts.append(pack)
    if config.getoption("--accelplat-capabilities"):
        parts.append("capabilities")
    forced = config.stash.get(FORCED_KEY, None)
    if not parts and forced is None:
        return None  # a session that uses no part detects no platform
    try:
        platform = current(config)
        devices = platform.devices()
    except AccelplatError as exc:
        where = f"platform unavailable ({exc})"
    else:
        names = Counter(d.name for d in devices)
        listed = ", ".join(name if n == 1 else f"{n} x {name}" for name, n in names.items())
        count = f"{len(devices)} device{'s' if len(devices) != 1 else ''}"
        where = f"platform {platform.name}{' (forced)' if forced else ''}, {count}"
        where += f" ({listed})" if listed else ""
    return f"accelplat {__version__}: {where}" + (f"; on: {', '.join(parts)}" if parts else "")


def _capability_lines(config: pytest.Config) -> list[str]:
    from accelplat._capabilities import capabilities, table_lines

    try:
        platform = current(config)
        table = capabilities(0, platform=platform)
    except AccelplatError as exc:
        return [f"accelplat capabilities: unavailable ({exc})"]
    devices = platform.devices()
    head = f"accelplat capabilities of {platform.name} device 0"
    if devices:
        head += f" ({devices[0].name}, {devices[0].arch or 'architecture unknown'})"
    return [head + ":", *("  " + line for line in table_lines(table))]


_SETTLING_KEY = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check every ``accelplat_requires`` marker at collection, so a typo is never a skip."""
    # settled_device_memory waits for the memory of our children, even those that exited
    # before it ran: note them after each test body (below) where some test asks for it
    config.stash[_SETTLING_KEY] = any(
        "settled_device_memory" in getattr(item, "fixturenames", ()) for item in items
    )
    errors: list[str] = []
    for item in items:
        for mark in item.iter_markers("accelplat_requires"):
            try:
                parse(mark)
            except MarkerError as exc:
                errors.append(f"{item.nodeid}: {exc}")
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise pytest.UsageError("accelplat_requires: " + "\n  ".join(["", *shown]).lstrip("\n"))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Forget the capability tables and project capabilities of this session."""
    if "accelplat._needs" in sys.modules:  # else no table was decided
        sys.modules["accelplat._needs"].forget_tables()
    if "accelplat._capabilities" in sys.modules:  # else it has nothing to forget
        sys.modules["accelplat._capabilities"].clear_project_capabilities()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose ``accelplat_requires`` markers are not met."""
    reapply_forced(item.config)
    try:
        reason = skip_reason(item)
    except MarkerError as exc:  # failed without the chained traceback
        raise pytest.fail.Exception(str(exc), pytrace=False) from None
    if reason is not None:
        skip_at_test(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Put ``--accelplat-platform`` back before the test body if a fixture reset the registry."""
    reapply_forced(item.config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Before teardown ends the test's engines, remember them as our children (see above)."""
    if item.config.stash.get(_SETTLING_KEY, False):
        from accelplat._vendor import procs

        procs.descendants()


@pytest.fixture
def accel_platform(request: pytest.FixtureRequest) -> Platform:
    """The current accelplat platform (``--accelplat-platform`` when given, else detected)."""
    return current(request.config)


# Our own memory is back within a second where release is eager (NVML: 0.2-0.9 s after exit, on
# an H200): a wait much longer than that waits for the wrong thing and should fail, naming whom.
FIXTURE_SETTLE_TIMEOUT_EAGER_S = 15.0
FIXTURE_SETTLE_TIMEOUT_LAZY_MAX_S = 120.0


def _settle_options(config: pytest.Config, platform: Platform) -> tuple[float, str]:
    owners = str(config.getini("accelplat_settle_owners") or "ours").strip().lower()
    if owners not in ("ours", "all"):
        raise pytest.UsageError(f"accelplat_settle_owners must be 'ours' or 'all', got {owners!r}")
    raw = config.getini("accelplat_settle_timeout") or "auto"
    if (timeout := auto_seconds(raw, "accelplat_settle_timeout")) is None:
        profile = platform.release
        cap = FIXTURE_SETTLE_TIMEOUT_LAZY_MAX_S if profile.lazy else FIXTURE_SETTLE_TIMEOUT_EAGER_S
        timeout = min(profile.settle_timeout_s, cap)
    return timeout, owners


@pytest.fixture
def settled_device_memory(request: pytest.FixtureRequest) -> SettleResult:
    """Wait before the test until device memory our earlier tests and children held is back.

    Co-tenants' memory is named in the result's ``note``, not waited for (ini
    ``accelplat_settle_owners = all`` waits on whole devices); the time limit is short
    (ini ``accelplat_settle_timeout``), and a timeout names the holders.
    """
    from accelplat._memory import wait_for_memory_to_settle

    platform = current(request.config)
    timeout_s, owners = _settle_options(request.config, platform)
    return wait_for_memory_to_settle(platform=platform, timeout_s=timeout_s, owners=owners)
