"""``--accelplat-pack``: each test leases the memory it needs, so several tests share a device.

A test's budget is its ``accelplat_requires(device_memory=)``, else its learned footprint with a
margin, else a whole device; a test learned to use no device memory takes no lease. Bodies run
in new processes that see only the leased devices, held to the budget where the host can
(``accelplat._enforce``). Every test's peak is measured, and the footprint store learns it.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import pytest

from accelplat import _owners
from accelplat._enforce import Enforcement, choose
from accelplat._leasing import Lease, lease
from accelplat._platform import Platform
from accelplat._util import format_bytes
from accelplat.errors import AccelplatError, LeaseUnsatisfiableError
from accelplat.pytest_plugin import _footprints, _lease, _shared
from accelplat.pytest_plugin._requires import parse, skip_reason

# the call report's user_properties: what the summary, on the xdist controller, learns from
PEAK, BUDGET, SOURCE = "accelplat_peak_bytes", "accelplat_budget_bytes", "accelplat_budget"
LEARN = "accelplat_learn"  # the figure to learn; None: forget the test's figures
SAMPLE_INTERVAL_S = 0.05
MARKER, FOOTPRINT, WHOLE = "accelplat_requires(device_memory=)", "footprint", "a whole device"
_AUTO_KEY = pytest.StashKey[str]()  # how -n auto counted


@dataclass(frozen=True)
class Budget:
    """What one test leases: ``memory_bytes`` on each of ``devices`` (``None``: whole; 0: none)."""

    memory_bytes: int | None
    devices: int
    source: str  # MARKER, FOOTPRINT or WHOLE

    def __str__(self) -> str:  # 12.00 GiB on each of 2 devices (footprint)
        what = "whole device" if self.memory_bytes is None else format_bytes(self.memory_bytes)
        where = f" on each of {self.devices} devices" if self.devices > 1 else ""
        return f"{what}{where} ({self.source})"


def budget_of(item: pytest.Item, footprints: _footprints.Footprints) -> Budget:
    """The test's budget: its marker's ``device_memory``, its footprint, or a whole device."""
    devices, memory = 1, None
    for need in map(parse, item.iter_markers("accelplat_requires")):  # checked at collection
        devices = max(devices, need.devices or 1)
        if need.device_memory is not None:
            memory = max(memory or 0, need.device_memory)
    if memory is not None:
        return Budget(memory, devices, MARKER)
    if peaks := footprints.get(item.nodeid):
        return Budget(_footprints.budget_for(peaks) if peaks[-1] else 0, devices, FOOTPRINT)
    return Budget(None, devices, WHOLE)


class PeakMonitor(threading.Thread):
    """Samples, from its start to :meth:`finish`, what this process and its descendants hold.

    "Ours" is ``accelplat._owners``' one rule; where the driver cannot attribute memory, a test
    alone on whole devices (``whole``) is measured by the growth of their used memory.
    """

    def __init__(self, devices: Sequence[tuple[Platform, int]], *, whole: bool) -> None:
        super().__init__(name="accelplat-pack-peak", daemon=True)
        self._devices = tuple(devices)  # (the platform that reads it, its index there)
        self._base = [p.memory_info(d).used for p, d in self._devices] if whole else []
        self._done = threading.Event()
        self.peak: int | None = None  # the largest per-device figure seen; None: not told
        self.start()

    def sample(self, remember: bool = False) -> None:
        """Take one reading now (``remember``: note this process's children first)."""
        for n, (platform, device) in enumerate(self._devices):
            reading = _owners.sample(  # a device that cannot be read gives no figure
                platform, (device,), remember=remember, on_error=lambda d, e: None
            )
            if device not in reading.memory:
                continue
            ours = reading.attribution[device].ours_bytes
            if ours is None and self._base:
                ours = max(0, reading.memory[device].used - self._base[n])
            if ours is not None:
                self.peak = max(self.peak or 0, ours)

    def run(self) -> None:
        self.sample(remember=True)
        while not self._done.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def finish(self) -> int | None:
        """Stop sampling; the peak, the last reading included."""
        self._done.set()
        self.join(5.0)
        self.sample()
        return self.peak


@dataclass(eq=False)  # a plugin object: pluggy keys it by identity
class PackPlugin(_lease.Holding):
    """The per-test leases of one pytest process (an xdist worker, or the only one)."""

    take: Callable[..., Lease]  # lease() with the session's platform and timeout
    platform: Platform
    footprints: _footprints.Footprints
    enforcement: Enforcement
    budget: Budget = Budget(None, 1, WHOLE)
    _monitor: PeakMonitor | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Lease the test's budget (waiting for room) and show the test only its devices."""
        if (reason := skip_reason(item)) is not None:
            _shared.skip_at_test(reason)  # before waiting for a lease it would not use
        budget = self.budget = budget_of(item, self.footprints)
        if budget.memory_bytes != 0:  # learned to need no device memory: no lease
            try:
                self.hold(self.take(budget.devices, memory=budget.memory_bytes))
            except LeaseUnsatisfiableError as exc:  # only this: no visible device can ever hold it
                _shared.skip_at_test(f"--accelplat-pack: {budget}: {exc}")
            except AccelplatError as exc:
                pytest.fail(f"--accelplat-pack could not lease {budget}: {exc}", False)
        if self.current is None:
            devices = [(self.platform, d.index) for d in self.platform.devices()]
        else:  # a lease unit (a MIG slice) is read through its own view
            held = self.current
            devices = [(u.view, u.device.index) for u in held.pool if u.key in held.device_ids]
        self._monitor = PeakMonitor(devices, whole=budget.memory_bytes is None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """Run the body in a new process with the lease's environment and its enforcement."""
        if self.current is None:
            return None  # no lease: the body runs here, as pytest runs it
        held = self.current.environ
        return _lease.run_body_in_new_process(pyfuncitem, {**held, **self.enforcement.limits(held)})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """After the body: its peak, budget and what to learn go into the test's properties."""
        report = yield
        if call.when != "call" or self._monitor is None:
            return report
        peak, budget, self._monitor = self._monitor.finish(), self.budget, None
        oom = report.failed and "out of memory" in report.longreprtext.lower()
        props = [(PEAK, peak), (BUDGET, budget.memory_bytes), (SOURCE, budget.source)]
        # under MPS the driver may list only the MPS server: a zero there is not a measurement
        if report.passed and peak is not None and (peak or self.enforcement.kind != "mps"):
            props.append((LEARN, peak))
        elif oom and budget.source == FOOTPRINT:
            props.append((LEARN, None))  # stopped at its learned budget: measured alone next time
        item.user_properties.extend(props)  # the teardown report carries them (and JUnit XML)
        if oom and budget.memory_bytes:
            held = "not measured" if peak is None else format_bytes(peak)
            said = f"{budget}, {self.enforcement.describe()}; its processes held {held}"
            report.sections.append(("accelplat budget", said))
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self._monitor is not None:  # the body never ran
            self._monitor.finish()
            self._monitor = None
        self.drop()


@dataclass(eq=False)
class PackSummary:
    """Gathers every worker's peaks: names the tests over budget, and updates the store."""

    store: Path | None
    learned: dict[str, int | None] = field(default_factory=dict)
    # (peak, budget) per test: declared budgets exceeded, learned ones that no longer fit
    over: dict[str, tuple[int, int]] = field(default_factory=dict)
    stale: dict[str, tuple[int, int]] = field(default_factory=dict)
    said: str = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(p for p in report.user_properties if isinstance(p, tuple) and len(p) == 2)
        peak, budget, source = props.get(PEAK), props.get(BUDGET), props.get(SOURCE)
        if LEARN in props:
            learn = props[LEARN]
            self.learned[report.nodeid] = learn if isinstance(learn, int) else None
        if not isinstance(peak, int) or not isinstance(budget, int):
            return
        if source == MARKER and peak > budget:
            self.over[report.nodeid] = (peak, budget)
        elif source == FOOTPRINT and _footprints.is_stale(peak, budget):
            self.stale[report.nodeid] = (peak, budget)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.store is None or not self.learned:
            return
        try:
            _footprints.save_footprints(self.store, self.learned, restart=self.stale)
        except (OSError, AccelplatError) as exc:
            self.said = f"accelplat: could not update the footprint store: {exc}"
        else:
            self.said = f"accelplat: footprints of {len(self.learned)} test(s) in {self.store}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for title, rows, word in (
            ("tests over their memory budget", self.over, "budget"),
            ("footprints out of date, updated", self.stale, "learned budget"),
        ):
            if rows:
                terminalreporter.section(f"accelplat: {title}", yellow=True)
            for nodeid, (peak, budget) in sorted(rows.items()):
                said = f"peak {format_bytes(peak)}, {word} {format_bytes(budget)}"
                terminalreporter.write_line(f"{nodeid}: {said}")
        if self.said:
            terminalreporter.write_line(self.said)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def store_path(config: pytest.Config) -> Path | None:
    """The footprint store: ``--accelplat-footprints``, else in pytest's cache (if it is on)."""
    if given := config.getoption("--accelplat-footprints"):
        return Path(config.invocation_params.dir, given)
    if not config.pluginmanager.has_plugin("cacheprovider"):
        return None
    cache = os.path.expandvars(os.path.expanduser(str(config.getini("cache_dir"))))
    return config.rootpath / cache / "d" / "accelplat" / "footprints.json"


def auto_workers(config: pytest.Config) -> int:
    """``-n auto``'s worker count from the lease units and the learned budgets, CPUs at most."""
    from accelplat._registry import current_platform, get_platform

    name, store = config.getoption("--accelplat-platform"), store_path(config)
    try:
        units = lease(platform=get_platform(name) if name else current_platform()).pool
        totals = [unit.memory().total for unit in units]
        learned = _footprints.load_footprints(store) if store else {}
    except AccelplatError:
        return 1  # pytest_configure says what is wrong
    budgets = sorted(_footprints.budget_for(p) for p in learned.values() if p[-1])
    if config.getoption("--accelplat-lease"):
        each = int(config.getoption("accelplat_lease_count"))
        count, how = len(totals) // each, f"{each} each"
    elif budgets:
        typical = budgets[len(budgets) // 2]
        count = sum(max(1, total // typical) for total in totals)
        how = f"median learned budget {format_bytes(typical)}"
    else:
        count, how = len(totals), "no learned budgets"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = max(1, min(count, cpus or 1))
    config.stash[_AUTO_KEY] = (
        f"-n auto: {count} workers ({len(totals)} device(s), {how}; {cpus} CPUs)"
    )
    return count


def configure(config: pytest.Config) -> None:
    """Check the options once (usage errors), choose the enforcement, register the parts."""
    if config.getoption("--accelplat-lease"):
        raise pytest.UsageError(
            "--accelplat-pack leases per test; --accelplat-lease per process: give one"
        )
    _lease.check_lock_dir("--accelplat-pack")
    store = store_path(config)
    with _shared.usage_errors("--accelplat-pack: "):
        platform = _shared.current(config)
        footprints = _footprints.load_footprints(store) if store else {}
        enforcement = choose(platform, config.getoption("--accelplat-enforce"))
    config.add_cleanup(enforcement.close)
    env = pytest.MonkeyPatch()  # the run's processes, xdist workers too, follow the choice
    for name, value in enforcement.environ.items():
        env.setenv(name, value)
    config.add_cleanup(env.undo)
    said = [enforcement.describe(), config.stash.get(_AUTO_KEY, "")]
    config.stash[_shared.PACK_KEY] = f"pack ({'; '.join(filter(None, said))})"
    # SIGTERM and SIGHUP end the session as Ctrl-C does, and the running body with it; a
    # timeline's own handler does the same
    if not config.pluginmanager.has_plugin(_shared.TIMELINE_PLUGIN_NAME):
        config.add_cleanup(_shared.catch_ending_signals(_interrupt))
    worker = hasattr(config, "workerinput")
    if not worker:
        config.pluginmanager.register(PackSummary(store), "accelplat-pack-summary")
    if worker or config.getoption("dist", "no") == "no":  # the xdist controller runs no test
        timeout = float(config.getoption("accelplat_lease_timeout"))
        take = functools.partial(lease, timeout_s=timeout, platform=platform)
        plugin = PackPlugin(take, platform, footprints, enforcement)
        config.pluginmanager.register(plugin, "accelplat-pack")
