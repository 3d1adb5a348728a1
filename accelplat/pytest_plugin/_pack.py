"""``--accelplat-pack``: each test leases the memory it needs, so several tests share a device.

A test's budget is its ``accelplat_requires(device_memory=)``, else its recorded footprint
(``--accelplat-footprints``) with a margin, else a whole device. Its body runs in a new process
that sees only the leased devices and carries the budget; a test that used more is reported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from accelplat._leasing import Lease, lease
from accelplat._types import HolderState
from accelplat._util import format_bytes
from accelplat.errors import AccelplatError, ConfigurationError, MarkerError
from accelplat.pytest_plugin._requires import parse

PLUGIN_NAME = "accelplat-pack"
SUMMARY_PLUGIN_NAME = "accelplat-pack-summary"
PEAK_PROPERTY = "accelplat_peak_bytes"  # user_properties of a test's call report
BUDGET_PROPERTY = "accelplat_budget_bytes"
SAMPLE_INTERVAL_S = 0.05
_OURS = (HolderState.SELF, HolderState.CHILD)


@dataclass(frozen=True)
class Budget:
    """What one test leases: ``memory_bytes`` on each of ``devices`` (``None``: whole ones)."""

    memory_bytes: int | None
    devices: int
    source: str  # where the figure came from, for messages


def budget_of(item: pytest.Item, footprints: dict[str, int]) -> Budget:
    """The test's budget: its marker's ``device_memory``, its footprint, or a whole device."""
    from accelplat.timeline._footprints import budget_for

    devices, memory = 1, None
    for mark in item.iter_markers("accelplat_requires"):
        try:
            need = parse(mark)
        except MarkerError:
            continue  # the marker check reports it
        devices = max(devices, need.devices or 1)
        if need.device_memory is not None:
            memory = max(memory or 0, need.device_memory)
    if memory is not None:
        return Budget(memory, devices, "accelplat_requires(device_memory=)")
    if item.nodeid in footprints:
        peak = footprints[item.nodeid]
        return Budget(budget_for(peak), devices, f"footprint {format_bytes(peak)} + margin")
    return Budget(None, devices, "no budget: a whole device")


class PeakMonitor:
    """Samples, in a thread, the memory this process and its children hold on some devices."""

    def __init__(self, read: Callable[[int], Sequence[Any] | None], devices: Sequence[int]):
        self._read, self._devices = read, tuple(devices)
        self._stop = threading.Event()
        self.peak: int | None = None  # the largest per-device figure seen; None: not told
        self._thread = threading.Thread(target=self._run, name="accelplat-pack-peak", daemon=True)

    def sample(self) -> None:
        """Take one reading now."""
        for device in self._devices:
            try:
                holders = self._read(device)
            except AccelplatError:
                holders = None
            if holders is None:
                continue
            ours = sum(h.used_bytes or 0 for h in holders if h.state in _OURS)
            self.peak = max(self.peak or 0, ours)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self.sample()
        return self.peak


@dataclass(eq=False)  # a plugin object: pluggy keys it by identity
class PackPlugin:
    """The per-test leases of one pytest process (an xdist worker, or the only one)."""

    timeout_s: float
    platform_name: str | None
    footprints: dict[str, int]
    current: Lease | None = None
    budget: Budget | None = None
    _restore: Callable[[], None] | None = None
    _monitor: PeakMonitor | None = None
    _peaks: dict[str, int | None] = field(default_factory=dict)

    def _platform(self) -> Any:
        from accelplat._registry import current_platform, get_platform

        return get_platform(self.platform_name) if self.platform_name else current_platform()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Lease the test's budget (waiting for room) and show the test only its devices."""
        budget = self.budget = budget_of(item, self.footprints)
        platform = self._platform()
        memory = budget.memory_bytes
        what = "whole device(s)" if memory is None else format_bytes(memory)
        try:
            held = lease(
                budget.devices,
                memory=budget.memory_bytes,
                timeout_s=self.timeout_s,
                platform=platform,
            ).acquire()
        except ConfigurationError as exc:
            pytest.skip(f"--accelplat-pack: cannot lease {what} ({budget.source}): {exc}")
        except AccelplatError as exc:
            pytest.fail(f"--accelplat-pack could not lease {what}: {exc}", False)
        self.current = held
        self._restore = held.apply()
        if budget.memory_bytes is not None:
            self._monitor = PeakMonitor(platform.memory_holders, [d.index for d in held.devices])
            self._monitor.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """Run the body in a new process with the lease's environment."""
        from accelplat.pytest_plugin._lease import run_body_in_new_process

        if self.current is None:
            return None
        return run_body_in_new_process(pyfuncitem, self.current.environ)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """After the body, note its peak and budget in the call report's user properties."""
        try:
            return (yield)
        finally:
            self._note_peak(item)

    def _note_peak(self, item: pytest.Item) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is None or self.budget is None or self.budget.memory_bytes is None:
            return
        peak = monitor.stop()
        if peak is not None:
            item.user_properties.append((PEAK_PROPERTY, peak))
            item.user_properties.append((BUDGET_PROPERTY, self.budget.memory_bytes))

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self._monitor is not None:  # the body never ran
            self._monitor.stop()
            self._monitor = None
        if self._restore is not None:
            self._restore()
            self._restore = None
        if self.current is not None:
            self.current.release()
            self.current = None


@dataclass(eq=False)
class OverBudgetSummary:
    """Collects the tests that went over their budget (from every worker) and names them."""

    over: dict[str, tuple[int, int]] = field(default_factory=dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(p for p in report.user_properties if isinstance(p, tuple) and len(p) == 2)
        peak, budget = props.get(PEAK_PROPERTY), props.get(BUDGET_PROPERTY)
        if isinstance(peak, int) and isinstance(budget, int) and peak > budget:
            self.over[report.nodeid] = (peak, budget)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.over:
            return
        terminalreporter.section("accelplat: tests over their memory budget", yellow=True)
        for nodeid, (peak, budget) in sorted(self.over.items()):
            terminalreporter.write_line(
                f"{nodeid}: peak {format_bytes(peak)}, budget {format_bytes(budget)}"
            )


def configure(config: pytest.Config) -> None:
    """Register the per-test leases (where tests run) and the over-budget summary (where shown)."""
    from accelplat.timeline._footprints import load_footprints

    if config.getoption("--accelplat-lease"):
        raise pytest.UsageError(
            "--accelplat-pack leases per test; --accelplat-lease per process: give one"
        )
    path = config.getoption("--accelplat-footprints")
    try:
        footprints = load_footprints(config.invocation_params.dir / path) if path else {}
    except ConfigurationError as exc:
        raise pytest.UsageError(f"--accelplat-footprints: {exc}") from None
    config.pluginmanager.register(OverBudgetSummary(), SUMMARY_PLUGIN_NAME)
    worker = hasattr(config, "workerinput")
    dist = config.getoption("dist", "no") != "no" and not worker
    if dist:
        return  # the xdist controller runs no test
    plugin = PackPlugin(
        timeout_s=float(config.getoption("accelplat_lease_timeout")),
        platform_name=config.getoption("--accelplat-platform"),
        footprints=footprints,
    )
    config.pluginmanager.register(plugin, PLUGIN_NAME)
