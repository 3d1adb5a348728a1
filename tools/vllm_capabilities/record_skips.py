"""pytest plugin: record every collected test's skip/run decision, then run nothing.

Load it with ``-p record_skips`` (the directory on ``PYTHONPATH``) and set
``ACCELPLAT_SKIP_RECORD=/path/out.json``. After collection it evaluates, for each test id,
pytest's own ``skip``/``skipif`` marks and accelplat's markers (the same evaluation they get at
set-up), writes ``{"tests": {nodeid: "run" | "skip: reason"}, "errors": [...]}`` and deselects
every test, so nothing executes. Modules that fail to import or skip at module level are
recorded under ``errors`` / as ``"module-skip: reason"`` by their collector's node id.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_decisions: dict[str, str] = {}
_errors: list[str] = []


def _decide(item: pytest.Item) -> str:
    from _pytest.skipping import evaluate_skip_marks  # the evaluation pytest itself runs

    try:
        skipped = evaluate_skip_marks(item)
    except BaseException as exc:  # a condition that raises is an error at set-up
        return f"error: {type(exc).__name__}"
    if skipped is not None:
        return f"skip: {skipped.reason}"
    from accelplat.errors import MarkerError
    from accelplat.pytest_plugin._requires import skip_reason

    try:
        reason = skip_reason(item)
    except MarkerError as exc:
        return f"error: {exc}"
    return "run" if reason is None else f"skip: {reason}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Record each item's decision and deselect them all."""
    for item in items:
        _decisions[item.nodeid] = _decide(item)
    config.hook.pytest_deselected(items=list(items))
    items[:] = []


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Record modules that error or skip as a whole."""
    if report.failed:
        _errors.append(report.nodeid)
    elif report.skipped and report.nodeid:
        longrepr: Any = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _decisions[report.nodeid] = f"module-skip: {reason}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the record."""
    path = os.environ.get("ACCELPLAT_SKIP_RECORD")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"tests": _decisions, "errors": sorted(_errors)}, f, indent=1)
