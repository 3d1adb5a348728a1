"""Fixtures shared by the test modules (vendor fakes are in ``tests/fakes/``)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accelplat._vendor import nvml as _nvml
from tests.fakes.nvml import FakeNvml

Install = Callable[[Any], Any]
"""Installs a fake (or any object) as the ``pynvml`` module and returns it."""


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """Install a fake nvidia-ml-py as ``pynvml`` for one test, with NVML shut down around it.

    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` are cleared for the test. A session an
    earlier test left open is shut down first (it would hide the fake's first ``nvmlInit``), and
    the fake's call log starts empty.
    """
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    def _install(fake: Any) -> Any:
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        _nvml.shutdown()
        if isinstance(fake, FakeNvml):
            fake.calls.clear()
        return fake

    yield _install
    if isinstance(sys.modules.get("pynvml"), FakeNvml):
        _nvml.shutdown()


_ENDING_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGQUIT", "SIGTERM", "SIGHUP")
    if hasattr(signal, name)
)


@pytest.fixture
def signals_not_ignored() -> Iterator[None]:
    """Children started within the test get the default action of SIGINT, SIGQUIT, SIGTERM, SIGHUP.

    A shell starts a background job (``pytest … &``, many CI runners) with SIGINT and SIGQUIT
    ignored, ``nohup`` ignores SIGHUP, and an ignored signal stays ignored across ``exec``: a
    child the test signals would never notice. For each of these signals this process ignores,
    it takes the default action (Python's own handler for SIGINT) for the duration of the test,
    so that children start with it, and ignores the signal again afterwards.
    """
    ignored = [s for s in _ENDING_SIGNALS if signal.getsignal(s) is signal.SIG_IGN]
    if threading.current_thread() is not threading.main_thread():
        ignored = []
    for signum in ignored:
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, default)
    try:
        yield
    finally:
        for signum in ignored:
            signal.signal(signum, signal.SIG_IGN)
