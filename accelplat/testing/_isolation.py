"""Run a function (typically a test) in a new process and bring its outcome back.

:func:`run_child` returns what happened as data (vLLM's drop-ins build on it); :func:`isolate`
and :func:`run_in_new_process` re-raise the child's exception here. The child leads its own
process group; spawned ones import the function by name and get the arguments pickled.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import inspect
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_for_sentinels
from types import ModuleType
from typing import Any, Literal, TypeVar, cast, get_args

from accelplat._platform import StartMethod
from accelplat._util import set_environ
from accelplat.errors import ChildTestError, ConfigurationError

_START_METHODS: tuple[str, ...] = get_args(StartMethod)
_ISOLATED_ATTR = "_accelplat_isolated"  # on a decorated wrapper: the function it isolates

_F = TypeVar("_F", bound=Callable[..., Any])

Status = Literal["ok", "outcome", "error", "silent"]


class ChildTracebackError(Exception):
    """Carries a child process's formatted traceback as the ``__cause__`` of what is re-raised."""

    def __str__(self) -> str:
        return "\n\nTraceback in the child process:\n" + str(self.args[0])


@dataclass(frozen=True)
class ChildResult:
    """What happened to a function run in a new process."""

    name: str  # the function's qualified name
    method: StartMethod
    exitcode: int | None  # 0 after a success or a pytest outcome, 1 after an exception, -signal
    status: Status  # "outcome": a pytest skip/xfail/fail/exit; "silent": ended without reporting
    exception: BaseException | None = None  # rebuilt here; None when it did not unpickle
    exception_type: str = ""  # qualified name
    message: str = ""  # str() of the exception, or the pytest outcome's message
    traceback: str = ""
    outcome: tuple[str, str, bool, int] | None = None  # (kind, message, pytrace, returncode)
    pid: int = 0  # the child's, for a wait on what the driver still holds for it

    def describe_exit(self) -> str:
        """Return how the child ended: ``"exited with code 3"``, ``"was killed by SIGKILL"``."""
        code = self.exitcode
        if code is None:
            return "did not exit"
        if code >= 0:
            return f"exited with code {code}"
        name = f"signal {-code}"
        with suppress(ValueError):
            name = signal.Signals(-code).name
        return f"was killed by {name}"

    def raise_pytest_outcome(self) -> None:
        """Raise the pytest skip, xfail, fail or exit the child reported; else do nothing."""
        if self.outcome is None:
            return
        import pytest

        kind, message, pytrace, code = self.outcome
        if kind == "skip":
            pytest.skip(message)
        elif kind == "xfail":
            pytest.xfail(message)
        elif kind == "exit":
            pytest.exit(message, returncode=code)
        pytest.fail(message, pytrace=pytrace)


def start_method() -> StartMethod:
    """Return the current platform's ``preferred_start_method``, safe there."""
    from accelplat._registry import current_platform

    return current_platform().preferred_start_method


def _pickler() -> ModuleType:
    try:
        import cloudpickle  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return pickle
    return cast(ModuleType, cloudpickle)


# How a spawned child finds a function: by module and qualified name, with the file as fallback
_FunctionRef = tuple[str, str, str | None]


def _function_ref(func: Callable[..., Any], method: str) -> _FunctionRef:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise ConfigurationError(
            f"{func!r} cannot run in a {method}ed process: a fresh interpreter imports the "
            "function by name, so it must be defined at module or class level"
        )
    return module, qualname, getattr(sys.modules.get(module), "__file__", None)


def _resolve_function(ref: _FunctionRef) -> Callable[..., Any]:
    """Import the function by module name, else from its file, unwrapped from :func:`isolate`."""
    module, qualname, path = ref
    try:
        obj: Any = importlib.import_module(module)
    except ImportError:
        where = path and importlib.util.spec_from_file_location(module, path)
        if not where or where.loader is None:
            raise
        obj = sys.modules[module] = importlib.util.module_from_spec(where)
        where.loader.exec_module(obj)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    # The module attribute is the decorated wrapper; unwrap to the function it isolates.
    obj = inspect.unwrap(obj, stop=lambda f: hasattr(f, _ISOLATED_ATTR))
    return cast(Callable[..., Any], getattr(obj, _ISOLATED_ATTR, obj))


def _pytest_outcome(exc: BaseException) -> tuple[str, str, bool, int] | None:
    """Describe pytest's skip/xfail/fail/exit exceptions, which do not pickle, as plain data."""
    pytest_module = sys.modules.get("pytest")
    if pytest_module is None:
        return None
    for kind in ("xfail", "skip", "fail", "exit"):  # xfail before fail: an XFailed is a Failed
        if isinstance(exc, getattr(pytest_module, kind).Exception):
            message = str(getattr(exc, "msg", None) or "")
            returncode = getattr(exc, "returncode", None)
            code = returncode if isinstance(returncode, int) else 1
            return kind, message, bool(getattr(exc, "pytrace", True)), code
    return None


def _report(result_path: str, status: Status, text: str = "", **fields: Any) -> None:
    with open(result_path, "wb") as f:  # ChildResult's fields; an exception, pickled on its own
        pickle.dump({"status": status, "traceback": text, **fields}, f)


def _end_with_parent() -> None:
    """Have Linux kill this child when its parent dies, even by SIGKILL (``PR_SET_PDEATHSIG``)."""
    if not sys.platform.startswith("linux"):
        return
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the request
        os._exit(1)


def _child_main(
    target: Callable[..., Any] | _FunctionRef,
    call: tuple[tuple[Any, ...], dict[str, Any]] | bytes,
    env: Mapping[str, str | None],
    result_path: str,
) -> None:
    """Body of the child process: run the function, write what happened to ``result_path``."""
    with suppress(OSError):  # own process group: what the function leaves behind ends with it
        os.setpgrp()
    _end_with_parent()
    try:
        set_environ(env)
        args, kwargs = pickle.loads(call) if isinstance(call, bytes) else call
        func = _resolve_function(target) if isinstance(target, tuple) else target
        func(*args, **kwargs)
    except BaseException as exc:
        text = traceback.format_exc()
        if (outcome := _pytest_outcome(exc)) is not None:
            _report(result_path, "outcome", text, message=outcome[1], outcome=outcome)
            return
        blob: bytes | None
        try:
            blob = _pickler().dumps(exc)
            pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
        except Exception:
            blob = None
        name, message = type(exc).__qualname__, str(exc)
        _report(result_path, "error", text, exception_type=name, message=message, blob=blob)
        sys.exit(1)
    else:
        _report(result_path, "ok")


def run_child(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: StartMethod | None = None,
    env: Mapping[str, str | None] | None = None,
) -> ChildResult:
    """Run ``func(*args, **kwargs)`` in a new process (:func:`run_in_new_process`'s arguments)."""
    chosen = method if method is not None else start_method()
    if chosen not in _START_METHODS:
        raise ConfigurationError(f"method must be one of {_START_METHODS}, got {chosen!r}")
    child_env = _check_env(env)
    name = getattr(func, "__qualname__", repr(func))
    target: Callable[..., Any] | _FunctionRef = func
    call: tuple[tuple[Any, ...], dict[str, Any]] | bytes = (tuple(args), dict(kwargs or {}))
    if chosen != "fork":
        target = _function_ref(func, chosen)
        try:
            call = _pickler().dumps(call)
        except Exception as exc:
            raise ConfigurationError(
                f"cannot run {name} in a {chosen}ed process: its arguments (for a test, its "
                f"fixture values) must be picklable, and they are not: {exc}"
            ) from exc
    fd, result_path = tempfile.mkstemp(prefix="accelplat-child-", suffix=".pickle")
    os.close(fd)
    try:
        ctx: Any = multiprocessing.get_context(chosen)
        process = ctx.Process(
            target=_child_main,
            args=(target, call, child_env, result_path),
            name=f"accelplat-{name}",
        )
        process.start()
        pid = process.pid or 0
        try:
            _wait_for_sentinels([process.sentinel])
        except BaseException:
            process.terminate()
            process.join(5)
            if process.is_alive():
                process.kill()
            raise
        finally:
            # The exited child is not reaped yet, so its pid still names its process group:
            # SIGTERM what is left of it (the child's own descendants).
            if pid > 0 and pid != os.getpgrp():
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
            process.join()
        with open(result_path, "rb") as f:
            data = f.read()
    finally:
        with suppress(OSError):
            os.unlink(result_path)
    if not data:
        return ChildResult(name, chosen, process.exitcode, "silent", pid=pid)
    fields = pickle.loads(data)
    exception: BaseException | None = None
    if (blob := fields.pop("blob", None)) is not None:
        with suppress(Exception):
            rebuilt = pickle.loads(blob)
            if isinstance(rebuilt, BaseException):
                exception = rebuilt
    return ChildResult(name, chosen, process.exitcode, exception=exception, pid=pid, **fields)


def _check_env(env: object) -> dict[str, str | None]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigurationError(f"env must be a mapping of variable names to values, got {env!r}")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigurationError(f"env has an invalid variable name {key!r}")
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise ConfigurationError(f"env[{key!r}] must be a str or None, got {value!r}")
    return dict(env)


def run_in_new_process(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: StartMethod | None = None,
    env: Mapping[str, str | None] | None = None,
) -> None:
    """Run ``func(*args, **kwargs)`` in a new process and re-raise its failure here.

    The child's exception (pytest outcomes included) is re-raised, chained to its traceback; a
    spawned child sees the environment, not module changes. Its process group gets ``SIGTERM``.

    Args:
        func: The function; for ``"spawn"``/``"forkserver"`` importable by module and name.
        args: Positional arguments (picklable for ``"spawn"``/``"forkserver"``).
        kwargs: Keyword arguments (likewise).
        method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; ``None``: the platform's choice.
        env: Variables to set in the child before ``func`` is looked up (``None`` removes one).

    Raises:
        ConfigurationError: For an unknown method, a bad ``env``, what cannot import or pickle.
        ChildTestError: For a failure that cannot be re-raised as is (unpicklable, or no report).
        BaseException: Whatever the child raised.
    """
    result = run_child(func, args, kwargs, method=method, env=env)
    if result.status == "ok":
        return
    result.raise_pytest_outcome()  # status "outcome"; no-op for the others
    if result.status == "silent":
        raise ChildTestError(
            f"{result.name} ran in a new {result.method} process that "
            f"{result.describe_exit()} without reporting a result"
        )
    cause = ChildTracebackError(result.traceback)
    if result.exception is not None:
        raise result.exception from cause
    raise ChildTestError(
        f"{result.name} failed in a new {result.method} process: "
        f"{result.exception_type}: {result.message}"
    ) from cause


def mark_isolated(wrapper: Callable[..., Any], func: _F) -> _F:
    """Dress ``wrapper`` as ``func`` and record that it isolates it (a spawned child runs that)."""
    functools.update_wrapper(wrapper, func)
    setattr(wrapper, _ISOLATED_ATTR, func)
    return cast(_F, wrapper)


def is_isolated(func: object) -> bool:
    return getattr(func, _ISOLATED_ATTR, None) is not None


def isolate(
    method: StartMethod | None = None, *, env: Mapping[str, str | None] | None = None
) -> Callable[[_F], _F]:
    """Return a decorator that runs each call of a function in a new process.

    Failures come back as :func:`run_in_new_process` raises them; the wrapper keeps the signature.

    Args:
        method: ``"fork"``, ``"spawn"``, ``"forkserver"``, or ``None``: the platform's, per call.
        env: Environment variables for the child (see :func:`run_in_new_process`).

    Raises:
        ConfigurationError: For an unknown method or a malformed ``env`` (at decoration time).
    """
    if method is not None and method not in _START_METHODS:
        raise ConfigurationError(f"method must be one of {_START_METHODS} or None, got {method!r}")
    child_env = _check_env(env)

    def decorator(func: _F) -> _F:
        def wrapper(*args: Any, **kwargs: Any) -> None:
            run_in_new_process(func, args, kwargs, method=method, env=child_env)

        return mark_isolated(wrapper, func)

    return decorator
