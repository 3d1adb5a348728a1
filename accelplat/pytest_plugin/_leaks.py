"""``--accelplat-leak-check``: report tests after which device memory stayed held."""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import NamedTuple

import pytest

from accelplat._leaks import is_leak
from accelplat._types import GIB, MIB
from accelplat.pytest_plugin._shared import (
    LEAK_PLUGIN_NAME,
    current,
    leak_tolerance,
    used_after_teardown,
    used_bytes,
)

_BASELINE_KEY = pytest.StashKey[dict[int, int]]()
_PROPERTY = "accelplat_leak"


def configure(config: pytest.Config) -> None:
    """Register the leak check when ``--accelplat-leak-check`` (or its ini) turns it on.

    Raises:
        pytest.UsageError: For a bad tolerance or wait.
    """
    flag = config.getoption("--accelplat-leak-check")
    if not (config.getini("accelplat_leak_check") if flag is None else flag):
        return
    tolerance = leak_tolerance(config, "--accelplat-leak-tolerance")
    config.pluginmanager.register(LeakChecker(tolerance, _leak_wait(config)), LEAK_PLUGIN_NAME)


def _leak_wait(config: pytest.Config) -> float | None:
    raw, argument = config.getoption("--accelplat-leak-wait"), "--accelplat-leak-wait"
    if raw is None:
        raw, argument = config.getini("accelplat_leak_wait") or "auto", "accelplat_leak_wait"
    if str(raw).strip().lower() == "auto":
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise pytest.UsageError(f"{argument} must be 'auto' or seconds >= 0, got {raw!r}")
    return seconds


def _fmt_size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"


class _Leak(NamedTuple):
    nodeid: str
    device: int
    before: int
    after: int


class LeakChecker:
    """Compares used memory of every visible device before a test and after its teardown.

    A device whose usage grew by more than ``tolerance`` is a finding. On lazily releasing
    platforms it first waits up to ``wait_s`` (default 4 x the platform's stability window) for
    the memory to come back. Findings travel in the teardown report's ``user_properties`` (so
    pytest-xdist workers report them too). Memory held by a fixture of a wider scope than the
    test counts against the first test that sets it up.

    Args:
        tolerance: Bytes of growth that are not reported.
        wait_s: Seconds to wait for memory to come back, or ``None`` for the default.
    """

    def __init__(self, tolerance: int, wait_s: float | None) -> None:
        self.tolerance = tolerance
        self.wait_s = wait_s
        self.leaks: list[_Leak] = []
        self.checked = 0

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Record the baseline (after the marker checks, which run first)."""
        item.stash[_BASELINE_KEY] = used_bytes(current(item.config))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """After teardown, compare device memory with the baseline and attach what leaked."""
        if call.when == "teardown":
            baseline = item.stash.get(_BASELINE_KEY, None)
            if baseline is not None:
                item.user_properties.append((_PROPERTY, self._leaks_after(item, baseline)))
        return (yield)

    def _leaks_after(self, item: pytest.Item, baseline: dict[int, int]) -> list[list[int]]:
        """Return ``[device, before, after]`` for each device above baseline + tolerance."""
        platform = current(item.config)
        after = used_after_teardown(item, platform)
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
            from accelplat._memory import wait_for_memory_to_clear
            from accelplat.errors import MemoryNotSettledError

            targets = {d: baseline[d] + self.tolerance for d in over}
            try:
                snap = wait_for_memory_to_clear(
                    over,
                    threshold_bytes=targets,
                    timeout_s=wait_s,
                    stable_duration_s=0,
                    platform=platform,
                ).snapshot
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
            if key == _PROPERTY:
                self.checked += 1
                for device, before, after in value if isinstance(value, list) else []:
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
        tests = {leak.nodeid for leak in self.leaks}
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
