"""Fixtures shared by the test modules (vendor fakes are in ``tests/fakes/``)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from accelplat import _nvml
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


@pytest.fixture
def sigint_not_ignored() -> Iterator[None]:
    """Children started within the test get SIGINT's default action, as from a terminal.

    A shell starts a background job (``pytest … &``, many CI runners) with SIGINT ignored, and an
    ignored signal stays ignored across ``exec``: a child the test interrupts would never notice.
    Where this process ignores SIGINT, it takes Python's own handler for the duration of the test
    (so children start with the default action) and ignores SIGINT again afterwards.
    """
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
