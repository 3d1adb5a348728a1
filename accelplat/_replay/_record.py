"""Recording the vendor boundary: every question accelplat asks, and every answer it gets.

Host questions are kept as the seam asked them. A vendor module's proxy records every call by
name and arguments, constant and exception (a new function needs no change here); a ctypes
library's, per call, the scalars and input bytes, the result code and the out-parameters' bytes.
``processes=False`` records, and shows the capturing process, every process list empty.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import itertools
import threading
import types
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from accelplat._boundary import Loaded
from accelplat._replay._codec import call_key, encode, key_text

CTYPES_CHANNELS = frozenset({"levelzero"})  # a ctypes library with out-parameters


def describe_error(exc: BaseException) -> dict[str, Any]:
    """Return ``type``, ``message`` and, where present, ``errno``, ``filename`` and ``value``."""
    out: dict[str, Any] = {"type": type(exc).__name__}
    if isinstance(exc, OSError) and isinstance(exc.errno, int):
        out["errno"] = exc.errno
        out["message"] = str(exc.strerror or "")[:4096]
        if isinstance(exc.filename, str):
            out["filename"] = exc.filename[:4096]
    else:
        out["message"] = str(exc)[:4096]
    value = getattr(exc, "value", None)
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**64:
        out["value"] = value
    return out


def buffer_of(arg: object) -> Any:
    """Return what an out-parameter points at: ``x`` of ``pointer(x)``, an array, else ``None``."""
    if isinstance(arg, ctypes._Pointer):
        try:
            return arg.contents
        except ValueError:  # a NULL pointer
            return None
    return arg if isinstance(arg, ctypes.Array) else None


def _bytes_of(obj: Any) -> bytes:
    return ctypes.string_at(ctypes.addressof(obj), ctypes.sizeof(obj))


def ctypes_key(args: tuple[Any, ...]) -> list[object]:
    """Return the key of a ctypes call's arguments; a buffer is its size and its input bytes."""
    out: list[object] = []
    for arg in args:
        target = buffer_of(arg)
        if target is not None:
            data = _bytes_of(target)
            digest = (  # hex up to 32 bytes, else a SHA-256 prefix
                data.hex() if len(data) <= 32 else "sha256:" + hashlib.sha256(data).hexdigest()[:32]
            )
            out.append({"buf": len(data), "in": digest})
        elif arg is None or isinstance(arg, (bool, int, str)):
            out.append(arg if not isinstance(arg, bool) else int(arg))
        elif isinstance(arg, ctypes._SimpleCData):
            out.append(arg.value if isinstance(arg.value, (int, str)) else None)
        else:
            out.append({"type": type(arg).__name__})
    return out


class Recorder:
    """Records every answer at the vendor boundary (``processes=False``: no process lists)."""

    def __init__(self, *, processes: bool = True) -> None:
        self.processes = processes
        self._lock = threading.RLock()
        self._records: dict[tuple[str, str], dict[str, Any]] = {}
        self._tokens: dict[object, str] = {}
        self._kept: list[object] = []
        self._counts: defaultdict[str, Iterator[int]] = defaultdict(itertools.count)

    def token_for(self, channel: str) -> Callable[[object], str]:
        """Return the function naming opaque handles of ``channel``."""

        def token(obj: object) -> str:
            if isinstance(obj, ctypes._Pointer):
                ident: object = ("ptr", type(obj).__name__, ctypes.cast(obj, ctypes.c_void_p).value)
            elif isinstance(obj, ctypes.c_void_p):
                ident = ("void", obj.value)
            else:
                try:
                    hash(obj)
                    ident = ("obj", type(obj).__name__, obj)
                except TypeError:
                    ident = ("id", id(obj))
            with self._lock:
                found = self._tokens.get(ident)
                if found is None:
                    found = self._tokens[ident] = f"{channel}-{next(self._counts[channel])}"
                    self._kept.append(obj)  # keeps id() unique while recording
                return found

        return token

    def add(
        self, channel: str, key: list[Any], answer: dict[str, Any], *, once: bool = False
    ) -> None:
        """Append ``{"v": encoded}`` or ``{"raise": error}``; ``once``: keep the first only."""
        ident = (channel, key_text(key))
        with self._lock:
            rec = self._records.setdefault(ident, {"channel": channel, "key": key, "answers": []})
            if not once or not rec["answers"]:
                rec["answers"].append(answer)

    def records(self) -> list[dict[str, Any]]:
        """Return every record, in the order questions were first asked."""
        with self._lock:
            return [{**r, "answers": list(r["answers"])} for r in self._records.values()]

    def withheld(self, channel: str, key: tuple[Hashable, ...]) -> bool:
        """Whether ``(channel, key)`` names processes that ``processes=False`` leaves out."""
        if self.processes:
            return False
        if channel == "proc":
            return True
        parts = "/".join(str(k) for k in key[1:]).split("/")
        return channel == "file" and "kfd" in parts and "proc" in parts  # KFD's per-process dirs

    def call(self, channel: str, key: tuple[Hashable, ...], live: Callable[[], Any]) -> Any:
        """Answer live and record the answer (see :class:`accelplat._boundary.Interceptor`)."""
        if self.withheld(channel, key):
            if channel == "proc":
                return ("gone", "")  # as a replay answers a process it was never told about
            if key and key[0] == "listdir":
                self.add(channel, list(key), {"v": []})
                return []
            raise FileNotFoundError(2, "left out of the capture (--no-processes)", str(key[-1]))
        return self.ask(channel, list(key), live)

    def ask(self, channel: str, key: list[Any], live: Callable[[], Any]) -> Any:
        """Return ``live()``, its value or its exception recorded as the answer to ``key``."""
        try:
            value = live()
        except Exception as exc:
            self.add(channel, key, {"raise": describe_error(exc)})
            raise
        self.add(channel, key, {"v": encode(value, self.token_for(channel))})
        return value

    def vendor(self, channel: str, live: Callable[[], Loaded]) -> Loaded:
        """Load the vendor module or library live, record the outcome, return a recording proxy."""
        obj, reason, vendor_error = live()
        loaded = {"present": obj is not None, "reason": reason, "vendor_error": vendor_error}
        self.add(channel, ["load"], {"v": {"$map": loaded}})
        proxy = None if obj is None else _RecordingVendor(self, channel, obj)
        return proxy, reason, vendor_error


class _RecordingVendor:
    """A vendor module or ctypes library whose functions and constants are recorded as used."""

    def __init__(self, recorder: Recorder, channel: str, module: Any) -> None:
        self._rec = recorder
        self._channel = channel
        self._module = module

    def __getattr__(self, name: str) -> Any:
        rec, channel = self._rec, self._channel
        library = channel in CTYPES_CHANNELS
        if library and name.startswith("__"):
            raise AttributeError(name)
        try:
            value = getattr(self._module, name)
        except AttributeError as exc:
            rec.add(channel, ["attr", name], {"raise": describe_error(exc)}, once=True)
            raise
        if library or (callable(value) and not isinstance(value, type)):
            if library:  # a ctypes function: its calls recorded with their out-parameters
                fn: Any = _RecordingCFunction(rec, channel, name, value)
            else:
                fn = self._recording(name, value)
            setattr(self, name, fn)  # found as an attribute from now on
            return fn
        if isinstance(value, type) and issubclass(value, enum.Enum):
            members = {m.name: encode(m.value, rec.token_for(channel)) for m in value}
            record = {"$record": {"type": value.__name__, "fields": members}}
            rec.add(channel, ["attr", name], {"v": record}, once=True)
        if isinstance(value, (type, types.ModuleType)):
            return value  # error classes, structure classes, modules: used as they are
        rec.add(channel, ["attr", name], {"v": encode(value, rec.token_for(channel))}, once=True)
        return value

    def _recording(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        rec, channel = self._rec, self._channel
        token = rec.token_for(channel)
        withheld = "process" in name.lower() and not rec.processes

        def call(*args: Any, **kwargs: Any) -> Any:
            def live() -> Any:
                result = fn(*args, **kwargs)
                return type(result)() if withheld and isinstance(result, (list, tuple)) else result

            return rec.ask(channel, call_key(name, args, kwargs, token), live)

        call.__name__ = name
        return call


class _RecordingCFunction:
    """One ctypes function of a recorded library; forwards ``argtypes``/``restype``."""

    def __init__(self, recorder: Recorder, channel: str, name: str, fn: Any) -> None:
        self.__dict__.update(_rec=recorder, _channel=channel, _name=name, _fn=fn)

    def __getattr__(self, name: str) -> Any:
        if name in ("argtypes", "restype"):
            return getattr(self._fn, name)
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fn, name, value)

    def __call__(self, *args: Any) -> Any:
        rec, channel, name = self._rec, self._channel, self._name
        key = ["call", name, ctypes_key(args)]
        rc = self._fn(*args)
        targets = [buffer_of(arg) for arg in args]
        if not rec.processes and "process" in name.lower():
            for target in targets:  # neither the bundle nor the caller sees a process
                if target is not None:
                    ctypes.memset(ctypes.addressof(target), 0, ctypes.sizeof(target))
        value = {"rc": int(rc), "out": [None if t is None else _bytes_of(t) for t in targets]}
        rec.add(channel, key, {"v": encode(value, rec.token_for(channel))})
        return rc
