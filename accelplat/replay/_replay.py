"""Answering the vendor boundary from a capture bundle.

:class:`Replayer` is an :class:`accelplat._boundary.Interceptor` built from a loaded
:class:`~accelplat.replay._bundle.Bundle`. Each question is looked up by channel and key; a key
recorded several times (memory sampled over a second or two) gives its answers in order and then
keeps giving the last one, so the first questions of a replay get exactly the answers the
capture's own ``accelplat info`` got.

A question the capture never asked gets the answer an absent thing gives on a real host: a host
file (under ``/sys``, ``/proc``, ``/dev`` or a captured root) is missing (``FileNotFoundError``),
a distribution is not installed, a process is gone, an NVML function is
``NVMLError_NotSupported``, a Level Zero call returns ``ZE_RESULT_ERROR_UNSUPPORTED_FEATURE``. Any
other file (a user's own trace or spec) is not part of the host and is read from this machine.
"""

from __future__ import annotations

import builtins
import copy
import ctypes
import errno
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from accelplat._boundary import Loaded
from accelplat.errors import BundleError
from accelplat.replay._bundle import Answer, Bundle, fields_of
from accelplat.replay._codec import Handle, encode, key_text
from accelplat.replay._record import CTYPES_CHANNELS, buffer_of, ctypes_key

__all__ = ["ReplayLibrary", "ReplayModule", "ReplayedError", "Replayer"]

_BUILTIN_ERRORS = frozenset(
    {
        "AttributeError",
        "ImportError",
        "IndexError",
        "KeyError",
        "LookupError",
        "ModuleNotFoundError",
        "NotImplementedError",
        "OSError",
        "RuntimeError",
        "TimeoutError",
        "TypeError",
        "ValueError",
    }
)
"""Builtin exception types a recorded answer may raise again as themselves."""

_VENDOR_BASES: dict[str, tuple[tuple[str, str], ...]] = {
    "nvml": (("NVMLLibraryMismatchError", "NVMLLibraryMismatchError"), ("NVMLError", "NVMLError")),
    "amdsmi": (("AmdSmi", "AmdSmiException"),),
}
"""Per channel, ``(name prefix, base class)``: a replayed vendor error derives from its base."""

_MISSING_CALL: dict[str, tuple[str, int | None, str]] = {
    "nvml": ("NVMLError_NotSupported", 3, "Not Supported"),
    "amdsmi": ("AmdSmiLibraryException", None, "not supported"),
}
"""Per channel, the error a call the capture never made raises."""

_HOST_ROOT_VARIABLES = frozenset(
    {"ACCELPLAT_SYSFS_ROOT", "ACCELPLAT_PROC_ROOT", "ACCELPLAT_CGROUP_ROOT", "ACCELPLAT_DEV_ROOT"}
)
"""Variables that move the host's file systems elsewhere (a capture of a fake tree)."""

_MISSING_RC: dict[str, int] = {"levelzero": 0x78000003}  # ZE_RESULT_ERROR_UNSUPPORTED_FEATURE


class ReplayedError(Exception):
    """A recorded exception of a type a replay does not recreate; names the original type.

    Attributes:
        type_name: The recorded exception's class name.
        value: The recorded vendor code, if any.
    """

    def __init__(self, message: str = "", value: int | None = None, type_name: str = "") -> None:
        super().__init__(message)
        self.value = value
        self.type_name = type_name

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _VendorError(Exception):
    """Base of the vendor exception classes a replay makes up (``NVMLError_GpuIsLost`` …)."""

    def __init__(self, message: str = "", value: int | None = None) -> None:
        super().__init__(message)
        self.value = value

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Replayer:
    """Answers the vendor boundary from a bundle (see the module docstring).

    Args:
        bundle: The loaded bundle.

    Thread safety:
        Answer cursors are guarded by a lock.
    """

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._answers: dict[tuple[str, str], tuple[Answer, ...]] = {
            (r.channel, r.key_text): r.answers for r in bundle.records
        }
        self._cursor: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._classes: dict[tuple[str, str], type[BaseException]] = {}

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

    def rewind(self) -> None:
        """Start every sequence of answers again from its first answer."""
        with self._lock:
            self._cursor.clear()

    # -- errors -----------------------------------------------------------------------------

    def vendor_class(self, channel: str, name: str) -> type[BaseException]:
        """Return the made-up vendor exception class ``name`` of ``channel`` (one per name)."""
        with self._lock:
            found = self._classes.get((channel, name))
            if found is not None:
                return found
        base: type[BaseException] = _VendorError
        for prefix, base_name in _VENDOR_BASES.get(channel, ()):
            if name.startswith(prefix):
                if name != base_name:
                    base = self.vendor_class(channel, base_name)
                break
        cls = type(name, (base,), {"__module__": f"accelplat.replay.{channel}"})
        with self._lock:
            return self._classes.setdefault((channel, name), cls)

    def error(self, channel: str, description: Mapping[str, Any]) -> BaseException:
        """Return the exception a recorded ``raise`` answer stands for."""
        type_name = str(description.get("type", "Exception"))
        message = str(description.get("message", ""))
        code = description.get("errno")
        if isinstance(code, int):
            filename = description.get("filename")
            if isinstance(filename, str):
                return OSError(code, message, filename)
            return OSError(code, message)
        value = description.get("value")
        if type_name in _BUILTIN_ERRORS:
            exc: BaseException = getattr(builtins, type_name)(message)
            return exc
        if channel in _VENDOR_BASES:
            return self.vendor_class(channel, type_name)(message, value)
        return ReplayedError(message, value, type_name)

    def _answer(self, channel: str, answer: Answer) -> Any:
        if answer.error is not None:
            raise self.error(channel, answer.error)
        return _copy(answer.value)

    # -- the Interceptor protocol -----------------------------------------------------------

    def call(self, channel: str, key: tuple[Hashable, ...], live: Callable[[], Any]) -> Any:
        """Answer from the bundle; ``live`` only for a file outside the host's file systems."""
        answer = self.next_answer(channel, list(key))
        if answer is None:
            path = str(key[-1]) if key else ""
            if channel == "file" and not self._is_host_path(path):
                return live()  # a user's own file (a trace, a spec): not part of the host
            if channel in ("file", "device"):
                raise FileNotFoundError(errno.ENOENT, "not in the capture bundle", path)
            if channel == "proc":
                return ("gone", "")
            return None
        return self._answer(channel, answer)

    def _is_host_path(self, path: str) -> bool:
        """Whether ``path`` lies in the host's pseudo file systems (or the captured roots)."""
        roots = ["/sys", "/proc", "/dev"]
        roots += [v for k, v in self.bundle.env.items() if k in _HOST_ROOT_VARIABLES and v]
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def vendor(self, channel: str, live: Callable[[], Loaded]) -> Loaded:
        """Return a replayed stand-in for the vendor module or library (``live`` is not used)."""
        answer = self.next_answer(channel, ["load"])
        if answer is None or answer.error is not None or not isinstance(answer.value, dict):
            return None, f"{channel}: not present on the captured host", ""
        loaded = answer.value
        reason, vendor_error = str(loaded.get("reason", "")), str(loaded.get("vendor_error", ""))
        if not loaded.get("present"):
            return None, reason, vendor_error
        stand_in: Any
        if channel in CTYPES_CHANNELS:
            stand_in = ReplayLibrary(self, channel)
        else:
            stand_in = ReplayModule(self, channel)
        return stand_in, reason, vendor_error


def _copy(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return copy.deepcopy(value, {id(h): h for h in _handles(value)})
    return value


def _handles(value: Any) -> list[Handle]:
    found: list[Handle] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Handle):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "_type"):
            stack.extend(vars(item).values())
    return found


def _replay_token(obj: object) -> str:
    if isinstance(obj, Handle):
        return obj.token
    return f"unrecorded-{type(obj).__name__}"


class _ReplayedVendor:
    """What a replayed vendor module and a replayed ctypes library share.

    Their channel, and attribute reads answered from the bundle (a recorded ``AttributeError``
    raised again).
    """

    def __init__(self, replayer: Replayer, channel: str) -> None:
        self._replayer = replayer
        self._channel = channel

    def _recorded_attribute(self, name: str) -> Answer | None:
        """The recorded answer to reading ``name``, ``None`` when none was recorded.

        Raises:
            AttributeError: For dunder names (never recorded) and for an attribute that was
                missing on the captured host.
        """
        if name.startswith("__"):
            raise AttributeError(name)
        answer = self._replayer.next_answer(self._channel, ["attr", name])
        if answer is not None and answer.error is not None:
            raise AttributeError(f"module {self._channel!r} (replayed) has no attribute {name!r}")
        return answer


class ReplayModule(_ReplayedVendor):
    """A vendor Python module (``pynvml``, ``amdsmi``) answering from a bundle.

    Attribute reads answer recorded constants (or raise the recorded ``AttributeError``), the
    channel's error classes (``NVMLError`` …), and otherwise a function whose calls are looked up
    by name and arguments.
    """

    def __getattr__(self, name: str) -> Any:
        answer = self._recorded_attribute(name)
        replayer, channel = self._replayer, self._channel
        if answer is not None:
            return _copy(answer.value)
        for _, base in _VENDOR_BASES.get(channel, ()):
            if name == base or (name.startswith(base) and name[len(base) : len(base) + 1] == "_"):
                return replayer.vendor_class(channel, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            key = [
                "call",
                name,
                [encode(a, _replay_token) for a in args],
                {k: encode(v, _replay_token) for k, v in sorted(kwargs.items())},
            ]
            found = replayer.next_answer(channel, key)
            if found is None:
                missing = _MISSING_CALL.get(channel)
                if missing is None:
                    raise ReplayedError(f"{name}: not in the capture bundle", None, "NotCaptured")
                cls = replayer.vendor_class(channel, missing[0])
                raise cls(f"{missing[2]} (not in the capture bundle)", missing[1])
            return replayer._answer(channel, found)

        call.__name__ = name
        return call


class ReplayLibrary(_ReplayedVendor):
    """A ctypes library (the Level Zero loader) answering from a bundle.

    Each call is looked up by function, scalar arguments and the input bytes of its buffers; the
    recorded output bytes are copied into the caller's buffers after checking that each has
    exactly the recorded size.
    """

    def __getattr__(self, name: str) -> Any:
        self._recorded_attribute(name)
        replayer, channel = self._replayer, self._channel

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
    rc, outs = value["rc"], value["out"]
    rc = fields_of(source).integer(rc, f"{where}: rc", minimum=0, maximum=2**32 - 1)
    if not isinstance(outs, list) or len(outs) != len(args):
        raise BundleError(source, f"out must list one item per argument ({len(args)})", field=where)
    for position, (out, arg) in enumerate(zip(outs, args, strict=True)):
        if out is None:
            continue
        target = buffer_of(arg)
        if not isinstance(out, bytes) or target is None:
            raise BundleError(source, f"argument {position} is not a buffer", field=where)
        if len(out) != ctypes.sizeof(target):
            raise BundleError(
                source,
                f"argument {position} holds {len(out)} bytes; this accelplat's structure has "
                f"{ctypes.sizeof(target)}",
                field=where,
            )
        ctypes.memmove(ctypes.addressof(target), out, len(out))
    return rc
