"""``--accelplat-timeline=PATH``: record device memory across the session (docs/timeline.md)."""

from __future__ import annotations

import logging
import signal
from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from accelplat.pytest_plugin._leaks import HOLDINGS_PROPERTY
from accelplat.pytest_plugin._shared import (
    TIMELINE_PLUGIN_NAME,
    catch_ending_signals,
    leak_tolerance,
    share_after_teardown,
    usage_errors,
)
from accelplat.timeline._render import write_report
from accelplat.timeline._sampler import Recorder, validate_grace, validate_hz
from accelplat.timeline._trace import SpanOwners, Trace, save_trace, span_owners

# The log-record attribute (logging's extra=) of a wait event: {"event": "start", "id": <int>,
# "kind": "settle", "devices": [0, 1]} as a wait begins, {"event": "end", "id": <same>, "ok":
# <bool>} as it ends. Ids need only be unique among waits in flight.
WAIT_EVENT_ATTRIBUTE = "accelplat_wait"
WAIT_LOGGER = "accelplat._memory"


class SessionTerminatedError(KeyboardInterrupt):
    """``SIGTERM``/``SIGHUP`` ended the session: unwound like Ctrl-C so the trace is written."""


_TAP_LEVEL = 1  # below DEBUG: a level set later (caplog.set_level) can be told apart from ours


def configure(config: pytest.Config) -> None:
    """Start recording when ``--accelplat-timeline`` is given (on the xdist controller only)."""
    if config.getoption("--accelplat-timeline") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(TimelinePlugin(config), TIMELINE_PLUGIN_NAME)


class WaitEventTap(logging.Filter):
    """Turns wait events logged at ``accelplat._memory`` into wait spans of a recorder.

    It lowers the logger's level below ``DEBUG`` to see them, passing on only what passed before;
    malformed events are ignored: observing must never break the code observed.
    """

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder
        self._logger = logging.getLogger(WAIT_LOGGER)
        self._tokens: dict[object, int] = {}
        self.started = 0  # waits seen starting

    def install(self) -> None:
        """Start watching: add the filter and let ``DEBUG`` records reach it."""
        self._own_level = self._logger.level
        self._logger.addFilter(self)
        self._logger.setLevel(_TAP_LEVEL)

    def remove(self) -> None:
        """Stop watching; restore the logger's level unless someone else has changed it since."""
        self._logger.removeFilter(self)
        if self._logger.level == _TAP_LEVEL:
            self._logger.setLevel(self._own_level)

    def filter(self, record: logging.LogRecord) -> bool:
        """Record a wait event carried by ``record``; pass on what would have passed anyway."""
        event = getattr(record, WAIT_EVENT_ATTRIBUTE, None)
        if isinstance(event, dict):
            self._observe(event)
        if self._logger.level != _TAP_LEVEL:  # changed since install (caplog.set_level, say)
            return record.levelno >= self._logger.getEffectiveLevel()
        parent = self._logger.parent  # its level held before install where the logger had none
        inherited = parent.getEffectiveLevel() if parent else logging.WARNING
        return record.levelno >= (self._own_level or inherited)  # NOTSET is 0

    def _observe(self, event: dict[Any, Any]) -> None:
        key = event.get("id")
        if not isinstance(key, (int, str)) or isinstance(key, bool):
            return
        if event.get("event") == "start":
            kind, raw = event.get("kind"), event.get("devices") or ()
            if isinstance(raw, (list, tuple)):
                devices = tuple(d for d in raw if isinstance(d, int) and not isinstance(d, bool))
                kind = kind if isinstance(kind, str) else "wait"
                self._tokens[key] = self._recorder.begin_wait(kind, devices)
                self.started += 1
        elif event.get("event") == "end":  # an unknown id: no token, no wait ends
            ok = event.get("ok", True) is not False
            self._recorder.end_wait(self._tokens.pop(key, -1), ok=ok)


def _owners_of(report: pytest.TestReport) -> list[SpanOwners]:
    """The leak check's readings by owner in ``report`` (an xdist worker's too); [] if none."""
    for key, value in report.user_properties:
        if key != HOLDINGS_PROPERTY or not isinstance(value, list):
            continue
        keys = ("device", "before", "after", "context")  # the order of a row
        try:
            return [
                span_owners(dict(zip(keys, r, strict=True)), f"{report.nodeid} readings[{i}]")
                for i, r in enumerate(value)
            ]
        except (ValueError, TypeError):  # ConfigurationError is a ValueError
            return []  # malformed: the test is judged on whole devices
    return []


class TimelinePlugin:
    """The recorder of one session, registered by :func:`configure`."""

    # Set as the session starts, before any other hook of this plugin runs: pytest calls
    # pytest_sessionfinish only after every pytest_sessionstart succeeded.
    recorder: Recorder
    _tap: WaitEventTap

    def __init__(self, config: pytest.Config) -> None:
        """Read the options; raise pytest.UsageError for a bad rate, tolerance or grace period."""
        hz, grace = "--accelplat-timeline-hz", "--accelplat-timeline-leak-grace"
        flags = ("--accelplat-timeline-leak-tolerance", "--accelplat-leak-tolerance")
        # the Recorder's keywords
        self._options: dict[str, Any] = {"leak_tolerance_bytes": leak_tolerance(config, *flags)}
        with usage_errors():
            self._options["hz"] = validate_hz(config.getoption(hz), argument=hz)
            self._options["leak_grace_s"] = validate_grace(config.getoption(grace), argument=grace)
        base = config.invocation_params.dir
        json_path = config.getoption("--accelplat-timeline-json")
        self.html_path = base / config.getoption("--accelplat-timeline")
        self.json_path = base / json_path if json_path else None
        self._wait_fixtures = frozenset(config.getini("accelplat_timeline_wait_fixtures"))
        self.trace: Trace | None = None
        self._ending: defaultdict[str, dict[str, Any]] = defaultdict(dict)  # end_test's keywords
        self._written: list[Path] = []
        self._error: str | None = None
        self._signals: list[int] = []
        self._restore: Callable[[], None] = lambda: None  # the ending signals' handlers

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)
        if len(self._signals) == 1:  # later ones must not interrupt the writing of the trace
            raise SessionTerminatedError(
                f"{signal.Signals(signum).name}: the session was ended; the memory timeline "
                f"is saved, marked partial"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.recorder = Recorder.of_current_platform(**self._options)
        self._tap = WaitEventTap(self.recorder)
        self._tap.install()
        self.recorder.start()
        # caught while recording, so that the trace is still written (marked partial)
        self._restore = catch_ending_signals(self._on_signal)

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.recorder.begin_test(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Note when a test's body begins; remember its outcome (failed > skipped > passed)."""
        if report.when == "setup" and report.passed:
            self.recorder.begin_body(report.nodeid)
        ending = self._ending[report.nodeid]
        if report.when == "teardown":
            ending["owners"] = _owners_of(report)
        decisive = report.when == "call" or report.outcome != "passed"  # else a passed set-up
        if decisive and ending.get("outcome") != "failed":
            ending["outcome"] = report.outcome
        ending.setdefault("outcome", "passed")

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside the leak check's, whatever the order
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Sample memory as a test's teardown ends, closing its span; the leak check shares it."""
        if call.when == "teardown":
            self._ending[item.nodeid]["sample"] = sample = self.recorder.sampler.sample()
            share_after_teardown(item, self.recorder.devices, sample[1])
        return (yield)

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        self.recorder.end_test(nodeid, **self._ending.pop(nodeid, {}))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, None]:
        """Time the set-up of the configured wait fixtures (unless it logged a wait of its own)."""
        if fixturedef.argname not in self._wait_fixtures:
            yield
            return
        token = self.recorder.begin_wait(f"fixture:{fixturedef.argname}")
        seen = self._tap.started
        outcome = yield
        inner = self._tap.started > seen  # it logged its own, precise wait
        self.recorder.end_wait(token, ok=outcome.exception is None, keep=not inner)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        recorder = self.recorder
        if not self._signals:
            recorder.linger()
        recorder.stop()
        self._tap.remove()
        trace = recorder.trace(exit_code=int(exitstatus))
        if self._signals:
            names = ", ".join(dict.fromkeys(signal.Signals(s).name for s in self._signals))
            note = f"Partial recording: {names} ended the session."
            trace = replace(trace, partial=True, notes=(*trace.notes, note))
        self.trace = trace
        try:
            for path, write in ((self.html_path, write_report), (self.json_path, save_trace)):
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    self._written.append(write(trace, path))
        except OSError as exc:
            self._error = f"could not write the timeline report: {exc}"
        finally:
            self._restore()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._error:
            terminalreporter.write_line(f"accelplat timeline: {self._error}", red=True)
            return
        trace = self.trace
        if trace is None or not self._written:
            return
        leaking = len({leak.nodeid for leak in trace.leaks()})
        slowest = trace.slowest_waits(1)
        extra = f", slowest wait {slowest[0].duration:.2f} s" if slowest else ""
        terminalreporter.write_line(
            f"accelplat timeline: {', '.join(str(p) for p in self._written)} "
            f"({len(trace.samples)} samples, {len(trace.tests)} tests, {leaking} leaking{extra})"
        )
