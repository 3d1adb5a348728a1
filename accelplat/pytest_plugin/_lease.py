"""``--accelplat-lease``: each pytest process, each xdist worker, leases its own devices."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from accelplat._leasing import Lease, lease, lease_status
from accelplat.errors import AccelplatError, LeaseUnsatisfiableError
from accelplat.pytest_plugin._requires import parse
from accelplat.pytest_plugin._shared import current, skip_at_test, usage_errors

PLUGIN_NAME = "accelplat-worker-lease"


class Holding:
    """A lease this pytest process holds, its variables applied to ``os.environ`` meanwhile."""

    current: Lease | None = None
    _restore: Callable[[], None] | None = None

    def hold(self, held: Lease) -> Lease:
        """Acquire ``held`` (waiting) and apply it; errors as :meth:`Lease.acquire`."""
        self.current = held.acquire()
        self._restore = held.apply()
        return held

    def drop(self) -> None:
        """Put the variables back and let the lease go (idempotent)."""
        restore, held, self._restore, self.current = self._restore, self.current, None, None
        if restore is not None:
            restore()
        if held is not None:
            held.release()


@dataclass(eq=False)  # a plugin object: pluggy keys it by identity
class WorkerLease(Holding):
    """The devices one pytest process holds between tests, and the widening for bigger tests."""

    count: int
    take: Callable[..., Lease]  # lease() with the session's platform, timeout and minimum
    home: tuple[str, ...] = ()  # the identities of the process's own devices
    _widened: bool = False

    def _take(self, count: int, prefer: tuple[str, ...]) -> Lease:
        return self.hold(self.take(count, prefer=prefer))

    def _back_home(self) -> None:
        self._widened = False
        self.drop()
        self._take(self.count, self.home)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Widen the lease for a test that declares more devices (before the marker checks)."""
        marks = item.iter_markers("accelplat_requires")  # checked at collection
        wanted = max([1, *(parse(mark).devices or 1 for mark in marks)])
        if wanted <= self.count:
            return
        self.drop()
        self._widened = True
        try:
            self._take(wanted, self.home)
        except AccelplatError as exc:
            self._back_home()
            if isinstance(exc, LeaseUnsatisfiableError):  # only this: other mistakes are not skips
                skip_at_test(f"needs {wanted} devices: {exc}")
            pytest.fail(f"--accelplat-lease could not lease {wanted} devices: {exc}", False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """Run a widened test's body in a new process with the lease's environment."""
        if not self._widened or self.current is None:
            return None
        return run_body_in_new_process(pyfuncitem, self.current.environ)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self._widened:
            self._back_home()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.drop()


def run_body_in_new_process(
    pyfuncitem: pytest.Function, environ: Mapping[str, str | None]
) -> bool | None:
    """Run a test's body in a new process with ``environ`` applied; ``None``: left to pytest."""
    from accelplat.testing._isolation import is_isolated, run_in_new_process

    func = pyfuncitem.obj
    # one isolating itself (isolate, vLLM's create_new_process_for_each_test) keeps setup's env;
    # a coroutine's body is left to the plugin that runs it
    if is_isolated(func) or inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        return None
    args = pyfuncitem.funcargs
    kwargs = {n: args[n] for n in inspect.signature(func).parameters if n in args}
    run_in_new_process(func, (), kwargs, env=environ)
    return True


@dataclass(eq=False)
class FailedLease:
    """An xdist worker whose lease failed: it collects and runs nothing and stops the session.

    Raising instead makes xdist restart it, each waiting out the timeout, then exit 0 (issue 23).
    """

    message: str

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool:
        """Collect nothing: test modules would see every device."""
        session.items = []
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        """Stop the whole session (the controller stops on a worker's ``shouldfail``)."""
        session.shouldfail = self.message
        return True


def start(config: pytest.Config, namespace: Any) -> None:
    """Check the options (``namespace``: the early ones); lease the devices if it runs tests."""
    from accelplat._validate import parse_size

    raw = namespace.accelplat_lease_min_free
    with usage_errors("--accelplat-lease: "):
        min_free = None if raw is None else parse_size(raw, argument="--accelplat-lease-min-free")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    dist = getattr(namespace, "dist", "no") != "no" or getattr(namespace, "distload", False)
    numprocesses, tx = getattr(namespace, "numprocesses", None), getattr(namespace, "tx", None)
    if not worker and (numprocesses or (tx and dist)):
        return  # the xdist controller: it runs no test (pytest_configure checks the numbers)
    from accelplat._registry import get_platform

    name, timeout = namespace.accelplat_platform, namespace.accelplat_lease_timeout
    try:
        platform = get_platform(name) if name else None
        take = functools.partial(
            lease, timeout_s=timeout, min_free_bytes=min_free, platform=platform
        )
        held = WorkerLease(namespace.accelplat_lease_count, take)
        held.home = held._take(held.count, ()).device_ids
    except AccelplatError as exc:
        if not worker:
            raise pytest.UsageError(f"--accelplat-lease: {exc}") from None
        config.pluginmanager.register(FailedLease(f"--accelplat-lease on {worker}: {exc}"))
        return
    config.pluginmanager.register(held, PLUGIN_NAME)


def check_workers(config: pytest.Config) -> None:
    """On the xdist controller, before it starts them, refuse more workers than devices serve."""
    if os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("dist", "no") == "no":
        return
    check_lock_dir("--accelplat-lease")
    workers = 0
    for spec in config.getoption("tx", None) or []:  # xdist's own reading of "3*popen"
        times, star, _ = str(spec).partition("*")
        workers += int(times) if star and times.isdigit() else 1
    if not workers:
        return
    with usage_errors("--accelplat-lease: "):
        platform = current(config)
        visible = len(lease(platform=platform).pool)  # its devices, or its lease units
    each = int(config.getoption("accelplat_lease_count"))
    if workers * each > visible:
        fix = "-n auto" if visible >= each else f"--accelplat-lease-count {visible}"
        raise pytest.UsageError(
            f"--accelplat-lease: {workers} xdist workers x {each} device(s) each "
            f"(--accelplat-lease-count) need {workers * each}, but {platform.name} shows this "
            f"process {visible}; the extra workers would wait out the timeout. Use {fix}"
        )


def check_lock_dir(option: str) -> None:
    """Refuse a lock directory leases cannot use: one usage error, not a skip of every test."""
    with usage_errors(f"{option}: "):
        lease_status()
