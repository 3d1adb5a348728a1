"""pytest plugin that records a device-memory timeline of a test session.

Registered through its own ``pytest11`` entry point (``accelplat_timeline``), separate from the
main accelplat plugin; disable it with ``-p no:accelplat_timeline``. It does nothing unless
``--accelplat-timeline=PATH`` is given. Then:

* a background thread samples used memory of every visible device of the current platform at
  ``--accelplat-timeline-hz`` samples per second (default 20), with bounded storage (see
  :class:`~accelplat.timeline._sampler.SampleBuffer`);
* every test is a span from the start of its setup to the end of its teardown
  (``pytest_runtest_logstart`` / ``pytest_runtest_logfinish``), with memory sampled at both ends
  and the start of its body noted (when its set-up report arrives);
* memory waits are recorded from two sources: the start and end events that every wait of
  :mod:`accelplat._memory` logs at the ``accelplat._memory`` logger (see :class:`WaitEventTap`),
  and the set-up time of the fixtures named in the ``accelplat_timeline_wait_fixtures`` ini
  option (default ``settled_device_memory``) when their set-up logged no such event;
* at the end of the session one self-contained HTML report is written to ``PATH``, and the raw
  trace to ``--accelplat-timeline-json`` when given;
* ``SIGTERM`` and ``SIGHUP`` (a CI job's timeout, a closed terminal), when nothing else handles
  them, end the session the way Ctrl-C does (:class:`SessionTerminatedError`, a
  ``KeyboardInterrupt``), so pytest still finishes the session and the report and trace are
  written, marked partial, with a note naming the signal.

Under pytest-xdist only the controller records: it sees every test's start and end, so spans of
tests running in parallel overlap and a leak may be blamed on a neighbour; waits inside workers are
not seen.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from accelplat.errors import ConfigurationError
from accelplat.pytest_plugin import DEFAULT_LEAK_TOLERANCE, share_after_teardown
from accelplat.timeline._defaults import DEFAULT_HZ, DEFAULT_LEAK_GRACE_S

if TYPE_CHECKING:
    from accelplat.timeline._sampler import Recorder
    from accelplat.timeline._trace import Reading, Trace

# The sampler, the trace model and the leak rule load when a timeline is asked for: pytest
# imports this plugin in every session, most of which record nothing.

__all__ = [
    "WAIT_EVENT_ATTRIBUTE",
    "WAIT_LOGGER",
    "SessionTerminatedError",
    "TimelinePlugin",
    "WaitEventTap",
]

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


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--accelplat-timeline*`` options and the wait-fixture ini option."""
    group = parser.getgroup("accelplat-timeline", "accelplat device-memory timeline")
    group.addoption(
        "--accelplat-timeline",
        metavar="PATH",
        default=None,
        help="sample device memory during the session and write a self-contained HTML "
        "timeline report to PATH",
    )
    group.addoption(
        "--accelplat-timeline-hz",
        metavar="N",
        type=float,
        default=DEFAULT_HZ,
        help=f"samples per second (default {DEFAULT_HZ:g})",
    )
    group.addoption(
        "--accelplat-timeline-json",
        metavar="PATH",
        default=None,
        help="also save the raw trace as JSON (render it later with `accelplat report`)",
    )
    group.addoption(
        "--accelplat-timeline-leak-tolerance",
        metavar="SIZE",
        default=None,
        help="growth of used memory across one test that is not yet a leak, e.g. 64MiB "
        f"(default: --accelplat-leak-tolerance, else {DEFAULT_LEAK_TOLERANCE})",
    )
    group.addoption(
        "--accelplat-timeline-leak-grace",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_LEAK_GRACE_S,
        help="seconds after the last test during which memory may still come back before it counts "
        f"as leaked (default {DEFAULT_LEAK_GRACE_S:g})",
    )
    parser.addini(
        "accelplat_timeline_wait_fixtures",
        type="linelist",
        default=["settled_device_memory"],
        help="fixtures whose set-up time the timeline report shows as a memory wait",
    )


def _timeline_tolerance(config: pytest.Config, raw: str | None) -> int:
    """The timeline's leak tolerance: its own option, else the leak check's, else the default.

    One session judges leaks with one tolerance (:mod:`accelplat._leaks`), so without
    ``--accelplat-timeline-leak-tolerance`` the timeline uses ``--accelplat-leak-tolerance`` (or
    the ``accelplat_leak_tolerance`` ini option) when given.
    """
    from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES, parse_leak_tolerance

    if raw is not None:
        return parse_leak_tolerance(raw, argument="--accelplat-timeline-leak-tolerance")
    shared = config.getoption("--accelplat-leak-tolerance", default=None)
    if shared is not None:
        return parse_leak_tolerance(str(shared), argument="--accelplat-leak-tolerance")
    try:
        ini = config.getini("accelplat_leak_tolerance")
    except ValueError:  # the leak-check plugin is not loaded
        ini = None
    if ini:
        return parse_leak_tolerance(str(ini), argument="accelplat_leak_tolerance")
    return DEFAULT_LEAK_TOLERANCE_BYTES


def pytest_configure(config: pytest.Config) -> None:
    """Start recording when ``--accelplat-timeline`` is given (on the xdist controller only)."""
    path = config.getoption("--accelplat-timeline")
    if not path or hasattr(config, "workerinput"):
        return
    from accelplat.timeline._sampler import validate_grace, validate_hz

    raw_tol = config.getoption("--accelplat-timeline-leak-tolerance")
    try:
        hz = validate_hz(
            config.getoption("--accelplat-timeline-hz"), argument="--accelplat-timeline-hz"
        )
        tolerance = _timeline_tolerance(config, raw_tol)
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

    Installed as a *filter* of the logger, with the logger's level lowered below ``DEBUG`` so that
    events logged at ``DEBUG`` reach it. It then lets through to the logger's handlers (and its
    ancestors') only the records that would have passed before, so whatever users see from
    logging stays as it was; once someone else sets the logger's level, that level decides.

    Only records carrying :data:`WAIT_EVENT_ATTRIBUTE` are used; malformed events are ignored:
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
    """The recording side of the timeline plugin: one instance per recorded session.

    Args:
        html_path: Where the report goes.
        json_path: Where the raw trace goes, or ``None``.
        hz: Samples per second.
        leak_tolerance_bytes: Growth across a test that is not a leak; ``None``:
            :data:`accelplat._leaks.DEFAULT_LEAK_TOLERANCE_BYTES`.
        leak_grace_s: Seconds after the last test during which memory may still come back.
        wait_fixtures: Fixtures whose set-up counts as a memory wait.
    """

    def __init__(
        self,
        *,
        html_path: Path,
        json_path: Path | None,
        hz: float = DEFAULT_HZ,
        leak_tolerance_bytes: int | None = None,
        leak_grace_s: float = DEFAULT_LEAK_GRACE_S,
        wait_fixtures: tuple[str, ...] = ("settled_device_memory",),
    ) -> None:
        self.html_path = html_path
        self.json_path = json_path
        self._hz = hz
        if leak_tolerance_bytes is None:
            from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES

            leak_tolerance_bytes = DEFAULT_LEAK_TOLERANCE_BYTES
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
        """Make SIGTERM/SIGHUP unwind the session like Ctrl-C, so a CI timeout keeps the trace.

        Only signals nobody else handles are taken, and only from the main thread.
        """
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
        from accelplat.timeline._sampler import Recorder

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
        """Sample memory the moment a test's teardown has ended, before it is reported.

        The sample closes the test's span (:meth:`pytest_runtest_logfinish`), and the leak
        check, which compares memory at this same point, reads it instead of reading again
        (:func:`accelplat.pytest_plugin.share_after_teardown`). ``tryfirst`` puts this wrapper
        outside the leak check's, whatever order the two plugins were registered in.
        """
        if call.when == "teardown" and self.recorder is not None:
            sample = self.recorder.sampler.sample()
            self._ended[item.nodeid] = sample
            share_after_teardown(item, self.recorder.devices, sample[1])
        report: pytest.TestReport = yield
        return report

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        """Close the span of a test with the sample taken as its teardown ended."""
        if self.recorder is not None:
            sample = self._ended.pop(nodeid, None)
            self.recorder.end_test(nodeid, self._outcomes.pop(nodeid, ""), sample=sample)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, None]:
        """Time the set-up of the configured wait fixtures.

        A fixture whose set-up logged a wait event of its own (it waits through
        :mod:`accelplat._memory`) is not recorded twice: the event's wait stays, the fixture's goes.
        """
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
        from dataclasses import replace

        from accelplat.timeline._trace import save_trace

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
            from accelplat.timeline._render import write_report

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
