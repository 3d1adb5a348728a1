"""``--accelplat-leak-check``: report tests after which device memory stayed held, with blame."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from accelplat._leaks import Blame, Holdings, current_holdings, first_context, holdings, judge
from accelplat._memory import Judge, Wait
from accelplat._owners import running
from accelplat._types import UsageSnapshot
from accelplat._util import format_bytes
from accelplat.errors import MemoryNotSettledError
from accelplat.pytest_plugin import _shared
from accelplat.timeline._trace import holdings_json

if TYPE_CHECKING:
    from accelplat._platform import Platform

_BASELINE_KEY = pytest.StashKey[dict[int, Holdings]]()
_PROPERTY = "accelplat_leak"  # [[device, before, after, leaked, attributed, children]] per leak
CONTEXT_PROPERTY = "accelplat_context"  # [[device, bytes]]: this process's context, first seen
COTENANT_PROPERTY = "accelplat_cotenants"  # [[device, change]]: co-tenants' memory moved
HOLDINGS_PROPERTY = "accelplat_holdings"  # for the timeline: [[device, before, after, context]]
CHILD_EXIT_WAIT_S = 2.0  # NVML lists an exited process 0.2-0.9 s more (H200, vendor facts)


def configure(config: pytest.Config, *, report: bool = True) -> None:
    """Register the leak check; ``report=False``: only its readings, for the timeline.

    Raises:
        pytest.UsageError: For a bad tolerance or wait.
    """
    config.pluginmanager.register(LeakChecker(config, report=report), _shared.LEAK_PLUGIN_NAME)


def _pairs(children: Mapping[int, int]) -> list[list[int]]:
    return sorted(map(list, children.items()))


class _Blamed(Judge):
    """The leak rule as a wait's judge: the bytes a test is blamed for count, per device."""

    holders = True

    def __init__(self, platform: Platform, blame: Callable[[int, Holdings], Blame]) -> None:
        self.platform, self.blame = platform, blame
        self.latest: dict[int, Holdings] = {}

    def __call__(self, reading: UsageSnapshot) -> dict[int, int]:
        self.latest = holdings(self.platform, reading)
        return {d: max(0, self.blame(d, h).leaked or 0) for d, h in self.latest.items()}


class LeakChecker:
    """Compares what each device holds, by owner, before a test and after its teardown.

    What :func:`~accelplat._leaks.judge` blames beyond ``tolerance`` after ``wait_s`` (``None``:
    4 x a lazy platform's stability window; where a child the test started has exited but is
    still listed, 2 s) goes in ``user_properties`` (xdist workers' too); this process's first
    device context and co-tenants' memory are reported apart, never as leaks.
    """

    def __init__(self, config: pytest.Config, *, report: bool = True) -> None:
        self.report = report
        self.tolerance = _shared.leak_tolerance(config, "--accelplat-leak-tolerance")
        raw, argument = config.getoption("--accelplat-leak-wait"), "--accelplat-leak-wait"
        if raw is None:
            raw, argument = config.getini("accelplat_leak_wait") or "auto", "accelplat_leak_wait"
        self.wait_s = _shared.auto_seconds(raw, argument)
        self.contexts_seen: set[int] = set()  # devices whose context is decided
        # nodeid, device, before, after, leaked, attributed, children [[pid, bytes]]
        self.leaks: list[tuple[Any, ...]] = []
        self.contexts: list[tuple[Any, ...]] = []  # nodeid, device, bytes
        self.cotenants: list[tuple[Any, ...]] = []  # nodeid, device, change
        self.checked = 0
        self.unjudged = False

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Record the baseline (after the marker checks, which run first)."""
        item.stash[_BASELINE_KEY] = current_holdings(_shared.current(item.config))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        """After teardown, judge what the test left held and attach it to the report (to come)."""
        baseline = item.stash.get(_BASELINE_KEY, None)
        if call.when == "teardown" and baseline is not None:
            self._judge(item, baseline)

    def _judge(self, item: pytest.Item, before: dict[int, Holdings]) -> None:
        platform = _shared.current(item.config)
        after = current_holdings(platform, _shared.used_after_teardown(item, platform))
        seen = self.contexts_seen
        contexts = {
            d: first_context(seen, d, before[d], after[d]) for d in sorted(after) if d in before
        }

        def blame(d: int, now: Holdings) -> Blame:
            return judge(before[d], now, contexts[d])

        blames = {d: blame(d, after[d]) for d in contexts}
        over = [d for d, b in blames.items() if b.is_leak(self.tolerance)]
        wait_s = self._wait_for(platform, blames, over)
        if over and wait_s > 0:  # the one wait algorithm, until the blame drops within tolerance
            blamed = _Blamed(platform, blame)
            w = Wait("leak check", blamed, platform, over)
            with contextlib.suppress(MemoryNotSettledError):  # still held: the latest judges
                w.run(self.tolerance, timeout_s=wait_s, stable_duration_s=0)
            after |= blamed.latest
            blames = {d: blame(d, after[d]) for d in contexts}
        leaks = [
            [d, before[d].used, after[d].used, b.leaked, b.attributed, _pairs(b.children)]
            for d, b in sorted(blames.items())
            if b.is_leak(self.tolerance)
        ]
        moved = [
            [d, b.others]
            for d, b in sorted(blames.items())
            if b.others is not None and abs(b.others) > self.tolerance
        ]
        held = [
            [d, holdings_json(before[d]), holdings_json(after[d]), contexts[d]] for d in contexts
        ]
        item.user_properties += [
            (_PROPERTY, leaks),
            (CONTEXT_PROPERTY, [[d, c] for d, c in contexts.items() if c > 0]),
            (COTENANT_PROPERTY, moved),
            (HOLDINGS_PROPERTY, held),
        ]

    def _wait_for(self, platform: Platform, blames: Mapping[int, Blame], over: list[int]) -> float:
        if self.wait_s is not None:
            return self.wait_s
        profile = platform.release
        if profile.lazy:
            return 4 * profile.stable_duration_s
        # a child the test started may be listed a little after it exits (eager release)
        exited = any(not running(pid) for d in over for pid in blames[d].children)
        return CHILD_EXIT_WAIT_S if exited else 0.0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect findings from teardown reports (also those sent back by xdist workers)."""
        if report.when != "teardown":
            return
        found = {k: v for k, v in report.user_properties if isinstance(v, list)}
        for key, rows in (
            (_PROPERTY, self.leaks),
            (CONTEXT_PROPERTY, self.contexts),
            (COTENANT_PROPERTY, self.cotenants),
        ):
            rows += [(report.nodeid, *row) for row in found.get(key, ())]
        self.checked += _PROPERTY in found
        # [device, before, after, context] rows of holdings_json: the host's memory is not judged
        self.unjudged |= any(not row[2]["judged"] for row in found.get(HOLDINGS_PROPERTY, ()))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.report:
            return
        write = terminalreporter.write_line
        tolerance = format_bytes(self.tolerance)
        if not self.leaks:
            write(
                f"accelplat leak check: no test left device memory held beyond {tolerance} "
                f"({self.checked} checked)"
            )
        else:
            terminalreporter.section("accelplat leak check", sep="=", yellow=True, bold=True)
            write(
                f"{len({row[0] for row in self.leaks})} test(s) left device memory held beyond "
                f"{tolerance} ({self.checked} checked):"
            )
            for nodeid, device, before, after, leaked, attributed, children in self.leaks:
                whose = f"{format_bytes(before)} -> {format_bytes(after)} used"
                if attributed:
                    whose = f"this process +{format_bytes(leaked - sum(n for _, n in children))}"
                if attributed and children:
                    pids = ", ".join(f"pid {p} {format_bytes(n)}" for p, n in children)
                    whose += f"; children it started, still holding: {pids}"
                write(f"  {nodeid}: device {device} +{format_bytes(leaked)} ({whose})")
        for nodeid, device, held in self.contexts:
            write(
                f"accelplat leak check: context: device {device} {format_bytes(held)} is this "
                f"process's own device context, first used in {nodeid} (not a leak)"
            )
        if self.cotenants:
            shown = "; ".join(
                f"{nodeid}: device {d} {'+' if n > 0 else ''}{format_bytes(n)}"
                for nodeid, d, n in self.cotenants[:10]
            )
            more = f" (+{len(self.cotenants) - 10} more)" if len(self.cotenants) > 10 else ""
            write(f"accelplat leak check: other processes' memory moved, not blamed: {shown}{more}")
        if self.unjudged:
            write(
                "accelplat leak check: the platform's memory is the host's, which moves for "
                "reasons of its own: no leak is judged on it"
            )
