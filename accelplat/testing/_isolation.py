"""Run a function (typically a test) in a new process and bring its outcome back.

:func:`run_child` returns what happened as data (:class:`ChildResult`); :func:`run_in_new_process`
re-raises the child's own exception here; :func:`isolate` is the decorator form. vLLM's drop-ins
(:mod:`accelplat.integrations.vllm`) build their conventions on :func:`run_child`. The child
leads its own process group, and what it leaves running there gets ``SIGTERM`` once it exits.
``"spawn"``/``"forkserver"`` children import the function by module and qualified name and get
the arguments pickled (with ``cloudpickle`` when installed); pytest's skip/xfail/fail/exit
outcomes, which do not pickle, travel as plain data.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
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

from accelplat._platform import Platform, StartMethod
from accelplat.errors import ChildTestError, ConfigurationError

_START_METHODS: tuple[str, ...] = get_args(StartMethod)
_ISOLATED_ATTR = "_accelplat_isolated"
"""Attribute a decorated wrapper carries: the function it runs in a new process."""

_F = TypeVar("_F", bound=Callable[..., Any])

Status = Literal["ok", "outcome", "error", "silent"]


class ChildTracebackError(Exception):
    """Carries a child process's formatted traceback as the ``__cause__`` of what is re-raised.

    Args:
        text: The traceback as the child formatted it.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\nTraceback in the child process:\n" + self.text


@dataclass(frozen=True)
class ChildResult:
    """What happened to a function run in a new process.

    Attributes:
        name: The function's qualified name.
        method: The start method used.
        exitcode: The child's exit status (``0`` after a success or a pytest outcome, ``1``
            after an exception, ``-N`` when killed by signal ``N``).
        status: ``"ok"``; ``"outcome"`` (a pytest skip, xfail, fail or exit: see
            :attr:`outcome`); ``"error"`` (an exception: see :attr:`exception`,
            :attr:`exception_type`, :attr:`message`, :attr:`traceback`); ``"silent"`` (the
            child ended without reporting).
        exception: The child's exception rebuilt here, or ``None`` when it could not be pickled
            (or there was none).
        exception_type: The qualified name of the child's exception type, or ``""``.
        message: ``str()`` of the child's exception, or the pytest outcome's message.
        traceback: The child's formatted traceback, or ``""``.
        outcome: For ``"outcome"``: ``(kind, message, pytrace, returncode)`` with ``kind`` one
            of ``"skip"``, ``"xfail"``, ``"fail"``, ``"exit"``.
    """

    name: str
    method: StartMethod
    exitcode: int | None
    status: Status
    exception: BaseException | None = None
    exception_type: str = ""
    message: str = ""
    traceback: str = ""
    outcome: tuple[str, str, bool, int] | None = None

    def describe_exit(self) -> str:
        """Return how the child ended: ``"exited with code 3"``, ``"was killed by SIGKILL"``."""
        code = self.exitcode
        if code is None:
            return "did not exit"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with code {code}"

    def raise_pytest_outcome(self) -> None:
        """Raise the pytest outcome the child reported (skip, xfail, fail or exit) here.

        Raises:
            BaseException: The outcome (``pytest.skip.Exception``, ``pytest.xfail.Exception``,
                ``pytest.fail.Exception`` or ``pytest.exit.Exception``). Does nothing when
                :attr:`status` is not ``"outcome"``.
        """
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


def start_method(platform: Platform | None = None) -> StartMethod:
    """Return the platform's ``preferred_start_method``: the start method that is safe there.

    Args:
        platform: The platform; ``None`` means the current one.

    Returns:
        ``"fork"``, ``"spawn"`` or ``"forkserver"``.
    """
    if platform is None:
        from accelplat._registry import current_platform

        platform = current_platform()
    return platform.preferred_start_method


def _pickler() -> ModuleType:
    """Return ``cloudpickle`` when it is installed, else :mod:`pickle`."""
    try:
        import cloudpickle  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return pickle
    return cast(ModuleType, cloudpickle)


@dataclass(frozen=True)
class _FunctionRef:
    """How a spawned child finds a function: by module name, with the file as fallback."""

    module: str
    qualname: str
    path: str | None


def _function_ref(func: Callable[..., Any], method: str) -> _FunctionRef:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise ConfigurationError(
            f"{func!r} cannot run in a {method}ed process: a fresh interpreter imports the "
            "function by name, so it must be defined at module or class level"
        )
    path = getattr(sys.modules.get(module), "__file__", None)
    return _FunctionRef(module, qualname, path)


def _import_module(ref: _FunctionRef) -> Any:
    if ref.module in sys.modules:
        return sys.modules[ref.module]
    try:
        return importlib.import_module(ref.module)
    except ImportError:
        if ref.path is None:
            raise
    spec = importlib.util.spec_from_file_location(ref.module, ref.path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {ref.module!r} from {ref.path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[ref.module] = module
    spec.loader.exec_module(module)
    return module


def _resolve_function(ref: _FunctionRef) -> Callable[..., Any]:
    obj: Any = _import_module(ref)
    for part in ref.qualname.split("."):
        obj = getattr(obj, part)
    # The module attribute is the decorated wrapper; unwrap to the function it isolates.
    for _ in range(100):
        target = getattr(obj, _ISOLATED_ATTR, None)
        if target is not None:
            return cast(Callable[..., Any], target)
        inner = getattr(obj, "__wrapped__", None)
        if inner is None:
            break
        obj = inner
    return cast(Callable[..., Any], obj)


# --------------------------------------------------------------------------------------------
# the child


def _pytest_outcome(exc: BaseException) -> tuple[str, str, bool, int] | None:
    """Describe pytest's skip/xfail/fail/exit exceptions, which do not pickle, as plain data."""
    pytest_module = sys.modules.get("pytest")
    if pytest_module is None:
        return None
    kinds: list[tuple[str, Any]] = [
        ("xfail", pytest_module.xfail),  # before "fail": an XFailed is a Failed
        ("skip", pytest_module.skip),
        ("fail", pytest_module.fail),
        ("exit", pytest_module.exit),
    ]
    for kind, function in kinds:
        if isinstance(exc, function.Exception):
            message = str(getattr(exc, "msg", None) or "")
            returncode = getattr(exc, "returncode", None)
            code = returncode if isinstance(returncode, int) else 1
            return kind, message, bool(getattr(exc, "pytrace", True)), code
    return None


def _report(result_path: str, payload: tuple[Any, ...]) -> None:
    with open(result_path, "wb") as f:
        pickle.dump(payload, f)


def _apply_env(env: Mapping[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _child_main(
    target: Callable[..., Any] | _FunctionRef,
    call: tuple[tuple[Any, ...], dict[str, Any]] | bytes,
    env: Mapping[str, str | None],
    result_path: str,
) -> None:
    """Body of the child process: run the function, write what happened to ``result_path``."""
    with suppress(OSError):  # own process group: what the function leaves behind ends with it
        os.setpgrp()
    try:
        _apply_env(env)
        args, kwargs = pickle.loads(call) if isinstance(call, bytes) else call
        func = _resolve_function(target) if isinstance(target, _FunctionRef) else target
        func(*args, **kwargs)
    except BaseException as exc:
        text = traceback.format_exc()
        outcome = _pytest_outcome(exc)
        if outcome is not None:
            _report(result_path, ("outcome", outcome, text))
            return
        blob: bytes | None
        try:
            blob = _pickler().dumps(exc)
            pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
        except Exception:
            blob = None
        _report(result_path, ("error", blob, type(exc).__qualname__, str(exc), text))
        sys.exit(1)
    else:
        _report(result_path, ("ok",))


def _end_group(pgid: int) -> None:
    """Send SIGTERM to what is left of the child's process group (its own descendants)."""
    if pgid <= 0 or pgid == os.getpgrp():
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)


# --------------------------------------------------------------------------------------------
# the parent


def run_child(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: StartMethod | None = None,
    env: Mapping[str, str | None] | None = None,
) -> ChildResult:
    """Run ``func(*args, **kwargs)`` in a new process and return what happened.

    Args:
        func: The function; its return value is discarded. With ``"spawn"`` or
            ``"forkserver"`` it must be importable by module and qualified name.
        args: Positional arguments (picklable with ``"spawn"``/``"forkserver"``).
        kwargs: Keyword arguments (likewise).
        method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; ``None`` means
            :func:`start_method` of the current platform.
        env: Environment variables to set in the child before ``func`` is looked up; a value of
            ``None`` removes the variable. The parent's environment is not changed.

    Returns:
        A :class:`ChildResult`.

    Raises:
        ConfigurationError: For an unknown method, a malformed ``env``, a function a fresh
            interpreter cannot import, or arguments that cannot be pickled.

    Side effects:
        Starts one process and waits for it (an interrupt while waiting terminates it); sends
        ``SIGTERM`` to what the child left in its process group; a temporary file carries the
        outcome back. Imports neither torch nor a vendor library.
    """
    chosen = method if method is not None else start_method()
    if chosen not in _START_METHODS:
        raise ConfigurationError(f"method must be one of {_START_METHODS}, got {chosen!r}")
    child_env = _check_env(env)
    call_args = tuple(args)
    call_kwargs = dict(kwargs or {})
    name = getattr(func, "__qualname__", repr(func))
    target: Callable[..., Any] | _FunctionRef = func
    call: tuple[tuple[Any, ...], dict[str, Any]] | bytes = (call_args, call_kwargs)
    if chosen != "fork":
        target = _function_ref(func, chosen)
        try:
            call = _pickler().dumps((call_args, call_kwargs))
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
            # The exited child is not reaped yet, so its pid still names its process group.
            _end_group(pid)
            process.join()
        with open(result_path, "rb") as f:
            data = f.read()
    finally:
        with suppress(OSError):
            os.unlink(result_path)
    exitcode = process.exitcode
    if not data:
        return ChildResult(name, chosen, exitcode, "silent")
    report = pickle.loads(data)
    if report[0] == "ok":
        return ChildResult(name, chosen, exitcode, "ok")
    if report[0] == "outcome":
        outcome, text = report[1], report[2]
        return ChildResult(
            name, chosen, exitcode, "outcome", message=outcome[1], traceback=text, outcome=outcome
        )
    _, blob, type_name, message, text = report
    exception: BaseException | None = None
    if blob is not None:
        with suppress(Exception):
            rebuilt = pickle.loads(blob)
            if isinstance(rebuilt, BaseException):
                exception = rebuilt
    return ChildResult(
        name,
        chosen,
        exitcode,
        "error",
        exception=exception,
        exception_type=type_name,
        message=message,
        traceback=text,
    )


def _check_env(env: object) -> dict[str, str | None]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigurationError(f"env must be a mapping of variable names to values, got {env!r}")
    checked: dict[str, str | None] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigurationError(f"env has an invalid variable name {key!r}")
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise ConfigurationError(f"env[{key!r}] must be a str or None, got {value!r}")
        checked[key] = value
    return checked


def run_in_new_process(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: StartMethod | None = None,
    env: Mapping[str, str | None] | None = None,
) -> None:
    """Run ``func(*args, **kwargs)`` in a new process and re-raise its failure here.

    A child's exception is re-raised here as the same exception (pytest's skip, xfail, fail and
    exit outcomes included), chained to the child's formatted traceback. A spawned child sees
    the environment but not changes made to modules in the parent (``monkeypatch.setattr``).

    Args:
        func: The function; its return value is discarded.
        args: Positional arguments.
        kwargs: Keyword arguments.
        method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; ``None`` means
            :func:`start_method` of the current platform.
        env: Environment variables for the child (see :func:`run_child`).

    Raises:
        ConfigurationError: As :func:`run_child`.
        ChildTestError: When the child fails in a way that cannot be re-raised as is (an
            exception that does not pickle, a child killed or exiting without reporting).
        BaseException: Whatever the child raised.

    Side effects:
        As :func:`run_child`.
    """
    result = run_child(func, args, kwargs, method=method, env=env)
    if result.status == "ok":
        return
    if result.status == "outcome":
        result.raise_pytest_outcome()
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


def mark_isolated(wrapper: Callable[..., Any], func: Callable[..., Any]) -> None:
    """Record on ``wrapper`` the function it runs in a new process.

    A fresh interpreter looks the test up by name, finds the decorated wrapper, and must run the
    function itself rather than start yet another process; decorators built on :func:`run_child`
    call this on their wrapper.

    Args:
        wrapper: The decorated function.
        func: The function it isolates.
    """
    setattr(wrapper, _ISOLATED_ATTR, func)


def is_isolated(func: object) -> bool:
    """Say whether ``func`` is a wrapper that runs its function in a new process.

    Args:
        func: Any object, typically a test function.

    Returns:
        ``True`` for wrappers recorded with :func:`mark_isolated` (:func:`isolate`, vLLM's
        ``create_new_process_for_each_test``).
    """
    return getattr(func, _ISOLATED_ATTR, None) is not None


def isolate(
    method: StartMethod | None = None,
    *,
    env: Mapping[str, str | None] | None = None,
) -> Callable[[_F], _F]:
    """Return a decorator that runs each call of a function in a new process.

    The start method is chosen when the function is called, not at import: ``None`` means the
    platform's :func:`start_method`, so ``--accelplat-platform`` and ``ACCELPLAT_PLATFORM``
    apply. Failures come back as :func:`run_in_new_process` raises them.

    Args:
        method: ``"fork"``, ``"spawn"``, ``"forkserver"`` or ``None``.
        env: Environment variables for the child (see :func:`run_child`).

    Returns:
        A decorator; the wrapped function keeps the name and signature, so pytest still injects
        a test's fixtures.

    Raises:
        ConfigurationError: For an unknown method or a malformed ``env`` (at decoration time).
    """
    if method is not None and method not in _START_METHODS:
        raise ConfigurationError(f"method must be one of {_START_METHODS} or None, got {method!r}")
    child_env = _check_env(env)

    def decorator(func: _F) -> _F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            run_in_new_process(func, args, kwargs, method=method, env=child_env)

        mark_isolated(wrapper, func)
        return cast(_F, wrapper)

    return decorator
