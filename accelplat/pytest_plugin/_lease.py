"""``--accelplat-lease``: each pytest process (each pytest-xdist worker) gets its own devices.

With the option, every process that runs tests — each xdist worker, or the single process of a
run without ``-n`` — leases ``--accelplat-lease-count`` devices (default 1) *before its initial
conftests are imported*, and applies the lease's environment (``CUDA_VISIBLE_DEVICES`` …) to its
own ``os.environ``: whatever later starts a device runtime in that process or its children sees
only its devices. The xdist controller, which runs no test, leases nothing.

A test that declares more devices than that (``accelplat_requires_devices(n)``, which
:func:`accelplat.integrations.vllm.multi_gpu_test` applies, or
``accelplat_requires_device_memory(devices=n)``) gets ``n`` devices exclusively for its
duration: before its setup the worker lets its own devices go, leases ``n`` (its own first when
free; all or nothing, so two workers cannot deadlock) and applies their environment; the test
body then runs in a new process (:func:`accelplat.testing._isolation.run_in_new_process`) with that
environment, since device runtimes read the variables once and the worker's own may already be
running; a test that isolates itself (``isolate``, vLLM's ``create_new_process_for_each_test``)
keeps its own isolation. After its teardown the worker goes back to its own count, preferring
the devices it had. A test asking for more devices than the outer visible set holds is skipped
with the lease's reason.

Without the option nothing here runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from accelplat._leasing import Lease, lease
from accelplat.errors import AccelplatError, ConfigurationError

__all__ = ["WorkerLease", "start"]

PLUGIN_NAME = "accelplat-worker-lease"
"""Name the worker lease is registered under with pytest's plugin manager."""

_ENV_XDIST_WORKER = "PYTEST_XDIST_WORKER"


def _runs_tests(namespace: Any) -> bool:
    """Whether this process runs tests (an xdist worker, or a run without workers)."""
    if os.environ.get(_ENV_XDIST_WORKER):
        return True
    workers = getattr(namespace, "numprocesses", None)
    hosts = getattr(namespace, "tx", None)
    return not workers and not hosts


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

    def stop(self) -> None:
        """Let every device go and put the environment back."""
        self._drop()

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

        A test that isolates itself already (:func:`accelplat.testing._isolation.isolate`, vLLM's
        ``create_new_process_for_each_test``) is left to do so; its child inherits the
        environment applied in setup.
        """
        if not self._widened or self.current is None:
            return None
        from accelplat.testing._isolation import is_isolated, run_in_new_process

        func = pyfuncitem.obj
        if is_isolated(func):
            return None
        if not callable(func) or _is_coroutine(func):
            return None
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
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
        self.stop()


def _is_coroutine(func: object) -> bool:
    import inspect

    return inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)


def _declared_devices(item: pytest.Item) -> int:
    """The most devices any accelplat marker of ``item`` asks for (malformed ones count 1)."""
    wanted = 1
    for mark in item.iter_markers("accelplat_requires_devices"):
        value = mark.args[0] if mark.args else mark.kwargs.get("n", 1)
        if isinstance(value, int) and not isinstance(value, bool):
            wanted = max(wanted, value)
    for mark in item.iter_markers("accelplat_requires_device_memory"):
        value = mark.kwargs.get("devices", 1)
        if isinstance(value, int) and not isinstance(value, bool):
            wanted = max(wanted, value)
    return wanted


def start(config: pytest.Config, namespace: Any) -> None:
    """Lease this process's devices if ``--accelplat-lease`` asks for it and it runs tests.

    Args:
        config: The (early) pytest config; the worker lease is registered with its plugin
            manager.
        namespace: The parsed options (``early_config.known_args_namespace``).

    Raises:
        pytest.UsageError: For bad option values, or devices that did not become free.
    """
    if not getattr(namespace, "accelplat_lease", False) or not _runs_tests(namespace):
        return
    from accelplat._sizing import parse_size

    try:
        count = int(getattr(namespace, "accelplat_lease_count", 1) or 1)
        timeout = float(getattr(namespace, "accelplat_lease_timeout", 600.0))
        raw = getattr(namespace, "accelplat_lease_min_free", None)
        min_free = None if raw is None else parse_size(str(raw).strip(), argument="size")
        worker = WorkerLease(
            count,
            timeout_s=timeout,
            min_free_bytes=min_free,
            platform_name=getattr(namespace, "accelplat_platform", None),
        )
        worker.start()
    except (AccelplatError, ValueError) as exc:
        raise pytest.UsageError(f"--accelplat-lease: {exc}") from None
    config.pluginmanager.register(worker, PLUGIN_NAME)
