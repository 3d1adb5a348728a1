"""``--accelplat-leak-check``: report tests after which device memory stayed held."""

from __future__ import annotations

import math
from collections.abc import Generator

import pytest

from accelplat._leaks import is_leak
from accelplat._util import format_bytes
from accelplat.errors import MemoryNotSettledError
from accelplat.pytest_plugin import _shared

_BASELINE_KEY = pytest.StashKey[dict[int, int]]()
_PROPERTY = "accelplat_leak"


def configure(config: pytest.Config) -> None:
    """Register the leak check (its option or ini is on); pytest.UsageError for bad values."""
    config.pluginmanager.register(LeakChecker(config), _shared.LEAK_PLUGIN_NAME)


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


class LeakChecker:
    """Compares used memory of every visible device before a test and after its teardown.

    Growth beyond ``tolerance`` after ``wait_s`` (``None``: 4 x a lazy platform's stability window)
    goes in ``user_properties`` (xdist workers' too); a wider fixture's counts on its first test.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.tolerance = _shared.leak_tolerance(config, "--accelplat-leak-tolerance")
        self.wait_s = _leak_wait(config)
        self.leaks: list[tuple[str, int, int, int]] = []  # nodeid, device, used before, after
        self.checked = 0

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Record the baseline (after the marker checks, which run first)."""
        item.stash[_BASELINE_KEY] = _shared.used_bytes(_shared.current(item.config))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """After teardown, compare device memory with the baseline and attach what leaked."""
        baseline = item.stash.get(_BASELINE_KEY, None)
        if call.when == "teardown" and baseline is not None:
            item.user_properties.append((_PROPERTY, self._leaks_after(item, baseline)))
        return (yield)

    def _leaks_after(self, item: pytest.Item, baseline: dict[int, int]) -> list[list[int]]:
        """``[device, before, after]`` for each device above baseline + tolerance."""
        platform = _shared.current(item.config)
        after = _shared.used_after_teardown(item, platform)

        def leaking() -> list[int]:
            return [d for d in sorted(after) if is_leak(baseline.get(d), after[d], self.tolerance)]

        over = leaking()
        if not over:
            return []
        wait_s = self.wait_s
        if wait_s is None:
            profile = platform.release
            wait_s = 4 * profile.stable_duration_s if profile.lazy else 0.0
        if wait_s > 0:
            from accelplat._memory import wait_for_memory_to_clear

            try:
                snap = wait_for_memory_to_clear(
                    over,
                    threshold_bytes={d: baseline[d] + self.tolerance for d in over},
                    timeout_s=wait_s,
                    stable_duration_s=0,
                    platform=platform,
                ).snapshot
            except MemoryNotSettledError as exc:
                snap = exc.snapshot
            after.update({d: m.used for d, m in snap.memory.items()})
        return [[d, baseline[d], after[d]] for d in leaking()]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect findings from teardown reports (also those sent back by xdist workers)."""
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == _PROPERTY:
                self.checked += 1
                for device, before, after in value if isinstance(value, list) else []:
                    self.leaks.append((report.nodeid, int(device), int(before), int(after)))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tolerance = format_bytes(self.tolerance)
        if not self.leaks:
            terminalreporter.write_line(
                f"accelplat leak check: no test left device memory held beyond {tolerance} "
                f"({self.checked} checked)"
            )
            return
        tests = {nodeid for nodeid, *_ in self.leaks}
        terminalreporter.section("accelplat leak check", sep="=", yellow=True, bold=True)
        terminalreporter.write_line(
            f"{len(tests)} test(s) left device memory held beyond {tolerance} "
            f"({self.checked} checked):"
        )
        for nodeid, device, before, after in self.leaks:
            terminalreporter.write_line(
                f"  {nodeid}: device {device} +{format_bytes(after - before)} "
                f"({format_bytes(before)} -> {format_bytes(after)} used)"
            )
