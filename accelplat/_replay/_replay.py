"""Answering the vendor boundary from a capture bundle.

A key recorded several times gives its answers in order, then keeps giving the last. A question
never asked gets what an absent thing gives on a real host: a host file (under ``/sys``,
``/proc``, ``/dev`` or a captured root) is missing, a process gone, an NVML call
``NVMLError_NotSupported``, a Level Zero call unsupported. Any other file is read from here.
"""

from __future__ import annotations

import builtins
import copy
import ctypes
import errno
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, cast

from accelplat._boundary import Loaded
from accelplat._replay._bundle import TABLES, Answer, Bundle, fields_of
from accelplat._replay._codec import Handle, call_key, key_text
from accelplat._replay._record import CTYPES_CHANNELS, buffer_of, ctypes_key
from accelplat.errors import BundleError

_TABLE = TABLES["replay"]
# builtin exceptions a recorded answer raises again as themselves
_BUILTIN_ERRORS = frozenset(_TABLE["builtin_errors"])
# Per channel, (name prefix, base class): a replayed vendor error derives from its base.
_VENDOR_BASES: dict[str, list[tuple[str, str]]] = _TABLE["vendor_bases"]
# Per channel, what a call never made raises: (class, value, message)
_MISSING_CALL: dict[str, tuple[str, int | None, str]] = _TABLE["missing_call"]
_MISSING_RC = {"levelzero": 0x78000003}  # ZE_RESULT_ERROR_UNSUPPORTED_FEATURE

_HOST_ROOT_VARIABLES = frozenset(  # they move the host's file systems (a capture of a fake tree)
    {"ACCELPLAT_SYSFS_ROOT", "ACCELPLAT_PROC_ROOT", "ACCELPLAT_CGROUP_ROOT", "ACCELPLAT_DEV_ROOT"}
)


class ReplayedError(Exception):
    """A recorded exception raised again; the base of the vendor errors a replay makes up."""

    def __init__(self, message: str = "", value: int | None = None, type_name: str = "") -> None:
        super().__init__(message)
        self.value = value
        self.type_name = type_name or type(self).__name__


class Replayer:
    """Answers the vendor boundary (an :class:`~accelplat._boundary.Interceptor`) from a bundle."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._answers = {(r.channel, key_text(r.key)): r.answers for r in bundle.records}
        self._cursor: dict[tuple[str, str], int] = {}
        self._lock = threading.RLock()
        self._classes: dict[tuple[str, str], type[ReplayedError]] = {}
        roots = [v for k, v in bundle.env.items() if k in _HOST_ROOT_VARIABLES and v]
        self._roots = [r.rstrip("/") for r in ("/sys", "/proc", "/dev", *roots)]

    def next_answer(self, channel: str, key: list[Any]) -> Answer | None:
        """Return the next answer to ``(channel, key)``, or ``None`` when it was never asked."""
        ident = (channel, key_text(key))
        answers = self._answers.get(ident)
        if answers is None:
            return None
        with self._lock:
            position = self._cursor.get(ident, 0)
            if position + 1 < len(answers):
                self._cursor[ident] = position + 1
        return answers[position]

    def vendor_class(self, channel: str, name: str) -> type[ReplayedError]:
        """Return the made-up vendor exception class ``name`` of ``channel`` (one per name)."""
        with self._lock:  # reentrant: a class's base is made first
            if (channel, name) not in self._classes:
                base = ReplayedError
                for prefix, base_name in _VENDOR_BASES.get(channel, ()):
                    if name.startswith(prefix):
                        if name != base_name:
                            base = self.vendor_class(channel, base_name)
                        break
                module = f"accelplat.replay.{channel}"
                self._classes[channel, name] = type(name, (base,), {"__module__": module})
            return self._classes[channel, name]

    def error(self, channel: str, description: Mapping[str, Any]) -> BaseException:
        """Return the exception a recorded ``raise`` answer stands for."""
        type_name = str(description.get("type", "Exception"))
        message = str(description.get("message", ""))
        if isinstance(code := description.get("errno"), int):  # filename checked: text or None
            return OSError(code, message, description.get("filename"))
        value = description.get("value")
        if type_name in _BUILTIN_ERRORS:
            return cast(BaseException, getattr(builtins, type_name)(message))
        if channel in _VENDOR_BASES:
            return self.vendor_class(channel, type_name)(message, value)
        return ReplayedError(message, value, type_name)

    def answer(self, channel: str, answer: Answer) -> Any:
        """Return a copy of the recorded value, or raise the recorded exception."""
        if answer.error is not None:
            raise self.error(channel, answer.error)
        return copy.deepcopy(answer.value)  # a caller may change what it gets

    def call(self, channel: str, key: tuple[Hashable, ...], live: Callable[[], Any]) -> Any:
        """Answer from the bundle; ``live`` only for a file outside the host's file systems."""
        found = self.next_answer(channel, list(key))
        if found is not None:
            return self.answer(channel, found)
        path = str(key[-1]) if key else ""
        if channel == "file" and not any(f"{path}/".startswith(f"{r}/") for r in self._roots):
            return live()  # a user's own file (a trace, a spec): not part of the host
        if channel in ("file", "device"):
            raise FileNotFoundError(errno.ENOENT, "not in the capture bundle", path)
        return ("gone", "") if channel == "proc" else None

    def vendor(self, channel: str, live: Callable[[], Loaded]) -> Loaded:
        """Return a replayed stand-in for the vendor module or library (``live`` is not used)."""
        found = self.next_answer(channel, ["load"])
        if found is None or found.error is not None or not isinstance(found.value, dict):
            return None, f"{channel}: not present on the captured host", ""
        loaded = found.value
        reason, vendor_error = str(loaded.get("reason", "")), str(loaded.get("vendor_error", ""))
        proxy = _ReplayedVendor(self, channel) if loaded.get("present") else None
        return proxy, reason, vendor_error


def _replay_token(obj: object) -> str:
    return obj.token if isinstance(obj, Handle) else f"unrecorded-{type(obj).__name__}"


class _ReplayedVendor:
    """A replayed vendor module or library: attribute reads and calls answered from the bundle.

    A module's calls are keyed by name and arguments (recorded constants and error classes come
    as they were); a ctypes library's by scalars and input bytes, its output bytes copied into
    the caller's buffers.
    """

    def __init__(self, replayer: Replayer, channel: str) -> None:
        self._replayer = replayer
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # never recorded
            raise AttributeError(name)
        replayer, channel = self._replayer, self._channel
        found = replayer.next_answer(channel, ["attr", name])
        if found is not None and found.error is not None:  # missing on the captured host
            raise AttributeError(f"module {channel!r} (replayed) has no attribute {name!r}")
        if channel in CTYPES_CHANNELS:
            return _c_function(replayer, channel, name)
        if found is not None:
            return copy.deepcopy(found.value)
        for _, base in _VENDOR_BASES.get(channel, ()):
            if name == base or name.startswith(f"{base}_"):
                return replayer.vendor_class(channel, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            answer = replayer.next_answer(channel, call_key(name, args, kwargs, _replay_token))
            if answer is not None:
                return replayer.answer(channel, answer)
            missing = _MISSING_CALL.get(channel)
            if missing is None:
                raise ReplayedError(f"{name}: not in the capture bundle", None, "NotCaptured")
            cls = replayer.vendor_class(channel, missing[0])
            raise cls(f"{missing[2]} (not in the capture bundle)", missing[1])

        call.__name__ = name
        return call


def _c_function(replayer: Replayer, channel: str, name: str) -> Callable[..., int]:
    def call(*args: Any) -> int:
        found = replayer.next_answer(channel, ["call", name, ctypes_key(args)])
        if found is None:
            return _MISSING_RC.get(channel, 0x7FFFFFFE)
        if found.error is not None:
            raise replayer.error(channel, found.error)
        return _apply(replayer.bundle.source, channel, name, found.value, args)

    call.__name__ = name
    return call


def _apply(source: str, channel: str, name: str, value: Any, args: tuple[Any, ...]) -> int:
    where = f"{channel} answer to {name}"
    if not isinstance(value, dict) or set(value) != {"rc", "out"}:
        raise BundleError(source, "must hold rc and out", field=where)
    rc = fields_of(source).integer(value["rc"], f"{where}: rc", minimum=0, maximum=2**32 - 1)
    outs = value["out"]
    if not isinstance(outs, list) or len(outs) != len(args):
        raise BundleError(source, f"out must list one item per argument ({len(args)})", field=where)
    for position, (out, arg) in enumerate(zip(outs, args, strict=True)):
        if out is None:
            continue
        target = buffer_of(arg)
        if not isinstance(out, bytes) or target is None:
            raise BundleError(source, f"argument {position} is not a buffer", field=where)
        if len(out) != ctypes.sizeof(target):
            why = f"argument {position} holds {len(out)} bytes; this accelplat's structure has "
            raise BundleError(source, f"{why}{ctypes.sizeof(target)}", field=where)
        ctypes.memmove(ctypes.addressof(target), out, len(out))
    return rc
