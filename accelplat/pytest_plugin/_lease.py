"""``--accelplat-lease``: each pytest process (each pytest-xdist worker) gets its own devices.

Each process that runs tests leases ``--accelplat-lease-count`` devices before its initial
conftests are imported and applies the lease's environment to its own ``os.environ``; the xdist
controller leases nothing. A test that declares more devices (``accelplat_requires(devices=n)``)
gets ``n`` for its duration (all or nothing, its own first), and its body runs in a new process
with that environment unless it isolates itself. See docs/leasing.md.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import pytest

from accelplat._leasing import Lease, lease
from accelplat.errors import AccelplatError, ConfigurationError

PLUGIN_NAME = "accelplat-worker-lease"


def _runs_tests(namespace: Any) -> bool:
    """Whether this process runs tests (an xdist worker, or a run without workers)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    return not getattr(namespace, "numprocesses", None) and not getattr(namespace, "tx", None)


class WorkerLease:
    """The devices one pytest process holds, and the per-test widening for multi-device tests.

    Args:
        count: Devices the process holds between tests.
        timeout_s: How long each lease may wait.
        min_free_bytes: Free memory each leased device must have.
        platform_name: A platform forced with ``--accelplat-platform``, or ``None``.
    """

    def __init__(
        self,
        count: int,
        *,
        timeout_s: float,
        min_free_bytes: int | None,
        platform_name: str | None,
    ) -> None:
        self.count = count
        self.timeout_s = timeout_s
        self.min_free_bytes = min_free_bytes
        self.platform_name = platform_name
        self.current: Lease | None = None
        self.home: tuple[str, ...] = ()
        self._restore: Callable[[], None] | None = None
        self._widened = False

    def _take(self, count: int, prefer: tuple[str, ...]) -> None:
        platform = None
        if self.platform_name:
            from accelplat._registry import get_platform

            platform = get_platform(self.platform_name)
        held = lease(
            count,
            timeout_s=self.timeout_s,
            min_free_bytes=self.min_free_bytes,
            platform=platform,
            prefer=prefer,
        ).acquire()
        self.current = held
        self._restore = held.apply()

    def _drop(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None
        if self.current is not None:
            self.current.release()
            self.current = None

    def start(self) -> None:
        """Lease the process's own devices and apply their environment.

        Raises:
            ConfigurationError: For bad input (more devices than visible …).
            LeaseTimeoutError: When they do not become free in time.
        """
        self._take(self.count, ())
        assert self.current is not None
        self.home = self.current.device_ids

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Widen the lease for a test that declares more devices (before the marker checks)."""
        wanted = _declared_devices(item)
        if wanted <= self.count:
            return
        self._drop()
        self._widened = True
        try:
            self._take(wanted, self.home)
        except ConfigurationError as exc:
            self._back_home()
            pytest.skip(f"needs {wanted} devices: {exc}")
        except AccelplatError as exc:
            self._back_home()
            pytest.fail(f"--accelplat-lease could not lease {wanted} devices: {exc}", False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """Run a widened test's body in a new process with the lease's environment.

        A test that isolates itself (``isolate``, vLLM's ``create_new_process_for_each_test``)
        is left to do so; its child inherits the environment applied in setup.
        """
        if not self._widened or self.current is None:
            return None
        from accelplat.testing._isolation import is_isolated, run_in_new_process

        func = pyfuncitem.obj
        if is_isolated(func) or not callable(func):
            return None
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            return None
        args = pyfuncitem.funcargs
        kwargs = {n: args[n] for n in inspect.signature(func).parameters if n in args}
        run_in_new_process(func, (), kwargs, env=self.current.environ)
        return True

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        """Go back to the process's own devices after a widened test."""
        if self._widened:
            self._back_home()

    def _back_home(self) -> None:
        self._widened = False
        self._drop()
        self._take(self.count, self.home)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Release the devices at the end of the session."""
        self._drop()


def _declared_devices(item: pytest.Item) -> int:
    """The most devices an ``accelplat_requires`` marker of ``item`` asks for (at least 1)."""
    wanted = [mark.kwargs.get("devices") for mark in item.iter_markers("accelplat_requires")]
    return max([1, *(n for n in wanted if isinstance(n, int) and not isinstance(n, bool))])


def start(config: pytest.Config, namespace: Any) -> None:
    """Lease this process's devices if it runs tests, and register the worker lease.

    Args:
        config: The (early) pytest config.
        namespace: The parsed options (``early_config.known_args_namespace``).

    Raises:
        pytest.UsageError: For bad option values, or devices that did not become free.
    """
    if not _runs_tests(namespace):
        return
    from accelplat._validate import parse_size

    raw = namespace.accelplat_lease_min_free
    try:
        worker = WorkerLease(
            namespace.accelplat_lease_count,
            timeout_s=namespace.accelplat_lease_timeout,
            min_free_bytes=None
            if raw is None
            else parse_size(raw, argument="--accelplat-lease-min-free"),
            platform_name=namespace.accelplat_platform,
        )
        worker.start()
    except (AccelplatError, ValueError) as exc:
        raise pytest.UsageError(f"--accelplat-lease: {exc}") from None
    config.pluginmanager.register(worker, PLUGIN_NAME)
