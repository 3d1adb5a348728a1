"""``--accelplat-timeline=PATH``: record device memory across the session into an HTML report.

A background thread samples used memory of every visible device; every test is a span from the
start of its setup to the end of its teardown, sampled at both ends; memory waits come from the
events :mod:`accelplat._memory` logs (:class:`WaitEventTap`) and from the set-up time of the
``accelplat_timeline_wait_fixtures``. ``SIGTERM``/``SIGHUP`` end the session like Ctrl-C so the
report is still written, marked partial. Under pytest-xdist only the controller records, so
spans of tests running in parallel overlap. See docs/timeline.md.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Generator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from accelplat.errors import ConfigurationError
from accelplat.pytest_plugin._shared import leak_tolerance, share_after_teardown
from accelplat.timeline._render import write_report
from accelplat.timeline._sampler import Recorder, validate_grace, validate_hz
from accelplat.timeline._trace import Reading, Trace, save_trace

WAIT_EVENT_ATTRIBUTE = "accelplat_wait"
"""Log-record attribute carrying a wait event, set through ``logging``'s ``extra=``.

Its value is a mapping: ``{"event": "start", "id": <int>, "kind": "settle", "devices": [0, 1]}``
when a wait begins and ``{"event": "end", "id": <same int>, "ok": <bool>}`` when it returns or
raises. Ids need only be unique among waits in flight.
"""

WAIT_LOGGER = "accelplat._memory"
"""Logger whose records :class:`WaitEventTap` watches for wait events."""

_PLUGIN_NAME = "accelplat-timeline-recorder"

_ENDING_SIGNALS = tuple(
    sig for sig in (getattr(signal, n, None) for n in ("SIGTERM", "SIGHUP")) if sig
)
"""Signals that would kill the session without a trace; caught while recording."""


class SessionTerminatedError(KeyboardInterrupt):
    """``SIGTERM``/``SIGHUP`` ended the session: unwound like Ctrl-C so the trace is written."""


_TAP_LEVEL = 1
"""Level the watched logger gets while tapped: below ``DEBUG``, so that any level set by someone
else afterwards (``caplog.set_level(logging.DEBUG, …)`` included) can be told apart from ours."""


def configure(config: pytest.Config) -> None:
    """Start recording when ``--accelplat-timeline`` is given (on the xdist controller only).

    Raises:
        pytest.UsageError: For a bad rate, tolerance or grace period.
    """
    path = config.getoption("--accelplat-timeline")
    if not path or hasattr(config, "workerinput"):
        return
    tolerance = leak_tolerance(
        config, "--accelplat-timeline-leak-tolerance", "--accelplat-leak-tolerance"
    )
    try:
        hz = validate_hz(
            config.getoption("--accelplat-timeline-hz"), argument="--accelplat-timeline-hz"
        )
        grace = validate_grace(
            config.getoption("--accelplat-timeline-leak-grace"),
            argument="--accelplat-timeline-leak-grace",
        )
    except ConfigurationError as exc:
        raise pytest.UsageError(str(exc)) from None
    base = config.invocation_params.dir
    json_path = config.getoption("--accelplat-timeline-json")
    plugin = TimelinePlugin(
        html_path=base / path,
        json_path=None if not json_path else base / json_path,
        hz=hz,
        leak_tolerance_bytes=tolerance,
        leak_grace_s=grace,
        wait_fixtures=tuple(config.getini("accelplat_timeline_wait_fixtures")),
    )
    config.pluginmanager.register(plugin, _PLUGIN_NAME)


class WaitEventTap(logging.Filter):
    """Turns wait events logged at ``accelplat._memory`` into wait spans of a recorder.

    A *filter* of the logger, whose level is lowered below ``DEBUG`` so that the events reach
    it; it passes on only the records that would have passed before (until someone else sets
    the level), so what users see from logging stays as it was. Malformed events are ignored:
    observing must never break the code observed.

    Args:
        recorder: Where the waits go.
        logger_name: The logger to watch.
    """

    def __init__(self, recorder: Recorder, logger_name: str = WAIT_LOGGER) -> None:
        super().__init__()
        self._recorder = recorder
        self._logger = logging.getLogger(logger_name)
        self._own_level = self._logger.level
        self._tokens: dict[object, int] = {}
        self.started = 0
        """Number of waits seen starting so far."""

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

    def _passes(self, record: logging.LogRecord) -> bool:
        if self._logger.level != _TAP_LEVEL:  # changed since install (caplog.set_level, say)
            return record.levelno >= self._logger.getEffectiveLevel()
        if self._own_level != logging.NOTSET:
            return record.levelno >= self._own_level
        parent = self._logger.parent
        return record.levelno >= (parent.getEffectiveLevel() if parent else logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        """Record a wait event carried by ``record``; pass on what would have passed anyway."""
        event = getattr(record, WAIT_EVENT_ATTRIBUTE, None)
        if isinstance(event, dict):
            self._observe(event)
        return self._passes(record)

    def _observe(self, event: dict[Any, Any]) -> None:
        key = event.get("id")
        if not isinstance(key, (int, str)) or isinstance(key, bool):
            return
        if event.get("event") == "start":
            kind = event.get("kind")
            raw = event.get("devices") or ()
            if isinstance(raw, (list, tuple)):
                devices = tuple(d for d in raw if isinstance(d, int) and not isinstance(d, bool))
                self._tokens[key] = self._recorder.begin_wait(
                    kind if isinstance(kind, str) else "wait", devices
                )
                self.started += 1
        elif event.get("event") == "end":
            token = self._tokens.pop(key, None)
            if token is not None:
                self._recorder.end_wait(token, ok=event.get("ok", True) is not False)


class TimelinePlugin:
    """The recorder of one session, registered by :func:`configure`.

    Args:
        html_path: Where the report goes.
        json_path: Where the raw trace goes, or ``None``.
        hz: Samples per second.
        leak_tolerance_bytes: Growth across a test that is not a leak.
        leak_grace_s: Seconds after the last test during which memory may still come back.
        wait_fixtures: Fixtures whose set-up counts as a memory wait.
    """

    def __init__(
        self,
        *,
        html_path: Path,
        json_path: Path | None,
        hz: float,
        leak_tolerance_bytes: int,
        leak_grace_s: float,
        wait_fixtures: tuple[str, ...],
    ) -> None:
        self.html_path = html_path
        self.json_path = json_path
        self._hz = hz
        self._tolerance = leak_tolerance_bytes
        self._grace = leak_grace_s
        self._wait_fixtures = frozenset(wait_fixtures)
        self.recorder: Recorder | None = None
        self.trace: Trace | None = None
        self._tap: WaitEventTap | None = None
        self._outcomes: dict[str, str] = {}
        self._ended: dict[str, tuple[float, Reading]] = {}
        self._written: list[Path] = []
        self._error: str | None = None
        self._signals: list[int] = []
        self._previous: dict[int, Any] = {}

    def _catch_ending_signals(self) -> None:
        """Make SIGTERM/SIGHUP unwind like Ctrl-C (only unhandled ones, from the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _ENDING_SIGNALS:
            if signal.getsignal(sig) is signal.SIG_DFL:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _release_ending_signals(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)
        if len(self._signals) == 1:  # later ones must not interrupt the writing of the trace
            raise SessionTerminatedError(
                f"{signal.Signals(signum).name}: the session was ended; the memory timeline "
                f"is saved, marked partial"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Detect the platform and start sampling."""
        self.recorder = Recorder.of_current_platform(
            hz=self._hz, leak_tolerance_bytes=self._tolerance, leak_grace_s=self._grace
        )
        self._tap = WaitEventTap(self.recorder)
        self._tap.install()
        self.recorder.start()
        self._catch_ending_signals()

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        """Open the span of a test as its setup begins."""
        if self.recorder is not None:
            self.recorder.begin_test(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Note when a test's body begins; remember its outcome (failed > skipped > passed)."""
        if report.when == "setup" and report.passed and self.recorder is not None:
            self.recorder.begin_body(report.nodeid)
        if report.when == "call" or report.outcome != "passed":
            previous = self._outcomes.get(report.nodeid)
            if previous != "failed":
                self._outcomes[report.nodeid] = report.outcome
        else:
            self._outcomes.setdefault(report.nodeid, "passed")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Sample memory as a test's teardown ends, closing its span; the leak check shares it.

        ``tryfirst`` puts this wrapper outside the leak check's, whatever the order registered.
        """
        if call.when == "teardown" and self.recorder is not None:
            sample = self.recorder.sampler.sample()
            self._ended[item.nodeid] = sample
            share_after_teardown(item, self.recorder.devices, sample[1])
        return (yield)

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        """Close the span of a test with the sample taken as its teardown ended."""
        if self.recorder is not None:
            sample = self._ended.pop(nodeid, None)
            self.recorder.end_test(nodeid, self._outcomes.pop(nodeid, ""), sample=sample)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, None]:
        """Time the set-up of the configured wait fixtures (unless it logged a wait of its own)."""
        if self.recorder is None or fixturedef.argname not in self._wait_fixtures:
            yield
            return
        token = self.recorder.begin_wait(f"fixture:{fixturedef.argname}")
        seen = self._tap.started if self._tap is not None else 0
        outcome = yield
        # A fixture that waits through accelplat._memory is already on the timeline, precisely.
        inner = self._tap is not None and self._tap.started > seen
        self.recorder.end_wait(token, ok=outcome.exception is None, keep=not inner)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Stop sampling and write the report (and the JSON trace when asked)."""
        recorder = self.recorder
        if recorder is None:
            return
        if not self._signals:
            recorder.linger()
        recorder.stop()
        if self._tap is not None:
            self._tap.remove()
        trace = recorder.trace(exit_code=int(exitstatus))
        if self._signals:
            names = ", ".join(dict.fromkeys(signal.Signals(s).name for s in self._signals))
            trace = replace(
                trace,
                partial=True,
                notes=(*trace.notes, f"Partial recording: {names} ended the session."),
            )
        self.trace = trace
        try:
            self.html_path.parent.mkdir(parents=True, exist_ok=True)
            self._written.append(write_report(trace, self.html_path))
            if self.json_path is not None:
                self.json_path.parent.mkdir(parents=True, exist_ok=True)
                self._written.append(save_trace(trace, self.json_path))
        except OSError as exc:
            self._error = f"could not write the timeline report: {exc}"
        finally:
            self._release_ending_signals()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Say where the report went, and how many tests leaked."""
        if self.recorder is None:
            return
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
