"""The conformance kit's harness: what one run shares between its checks.

:class:`Kit` holds the platform and :func:`run_conformance`'s options, caches shared facts, and
rebuilds the platform in a fresh interpreter (``_child``) for the side-effect checks; when none
reproduces the caller's devices (a fake sysfs tree, say) they run in-process and say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal, get_args

from accelplat import _validate
from accelplat._registry import describe_failure, factory_for
from accelplat._types import MIB, DeviceInfo, MemoryInfo
from accelplat._util import Clock
from accelplat.errors import ConfigurationError
from accelplat.testing._child import BOOTSTRAP

Isolation = Literal["auto", "subprocess", "inprocess"]


class CheckFailedError(Exception):
    """Raised inside a check to fail it with a message."""


class CheckSkippedError(Exception):
    """Raised inside a check to skip it with a reason."""


def is_int(value: object) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def call(label: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Return ``function(*args, **kwargs)``; if it raises, fail the check (``<label> raised …``)."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:
        raise CheckFailedError(f"{label} raised {describe_failure(exc)}") from None


@dataclass(frozen=True)
class Tolerance:
    """An allowance in bytes that grows with the device: ``max(min_bytes, ratio × total)``.

    Attributes:
        min_bytes: The allowance for small devices (an int ``>= 0``).
        ratio: The allowance as a fraction of the device's total, in ``[0, 1]``.

    Raises:
        ConfigurationError: On construction, for a field out of its range, naming it.
    """

    min_bytes: int
    ratio: float

    def __post_init__(self) -> None:
        _validate.integer(self.min_bytes, "Tolerance.min_bytes", minimum=0)
        _validate.ratio(self.ratio, "Tolerance.ratio")

    def allowed(self, total: int) -> int:
        """Return the allowance for a device of ``total`` bytes (exact for any int)."""
        return max(self.min_bytes, int(Fraction(self.ratio) * max(0, total)))


# How far used + free may be from total. Some sources read used and total from separate counters
# (two sysfs files) or round to MiB; a gap beyond this means the fields disagree in meaning.
SUM_TOLERANCE = Tolerance(min_bytes=64 * MIB, ratio=0.005)
# How much used/free may move between two back-to-back reads (other processes allocate meanwhile).
STABILITY_TOLERANCE = Tolerance(min_bytes=256 * MIB, ratio=0.02)


@dataclass
class Kit:
    """The platform under test, the run's options, and the facts its checks share."""

    platform: Any
    registered_name: str | None = None
    factory: Callable[[], Any] | None = None
    child: str | None = None
    isolation: Isolation = "auto"
    sum_tolerance: Tolerance = SUM_TOLERANCE
    stability_tolerance: Tolerance = STABILITY_TOLERANCE
    settle_timeout_s: float | None = None
    settle_clock: Any = None
    empty_visible_hides_all: bool | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    baseline_note: str | None = None

    def __post_init__(self) -> None:
        """Refuse an option a check would otherwise blame on the platform."""

        def refuse(name: str, expected: str) -> ConfigurationError:
            return ConfigurationError(
                f"{name} must be {expected}, got {getattr(self, name)!r:.200}"
            )

        if self.isolation not in get_args(Isolation):
            raise refuse("isolation", "'auto', 'subprocess' or 'inprocess'")
        if self.factory is not None and not callable(self.factory):
            raise refuse("factory", "callable or None")
        if self.child is not None and (not isinstance(self.child, str) or not self.child.strip()):
            raise refuse("child", "a platform name or 'module:attr'")
        for name in ("sum_tolerance", "stability_tolerance"):
            if not isinstance(getattr(self, name), Tolerance):
                raise refuse(name, "a Tolerance")
        if self.settle_timeout_s is not None:
            _validate.duration(self.settle_timeout_s, "settle_timeout_s")
        if self.settle_clock is not None and not isinstance(self.settle_clock, Clock):
            raise refuse("settle_clock", "a clock with monotonic() and sleep(seconds)")
        if self.empty_visible_hides_all is not None and not isinstance(
            self.empty_visible_hides_all, bool
        ):
            raise refuse("empty_visible_hides_all", "True, False or None")
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise refuse("env", "a mapping of str names to str values")

    @cached_property
    def count(self) -> int:
        """``device_count()``, checked."""
        count = call("device_count()", self.platform.device_count)
        if not is_int(count) or count < 0:
            raise CheckFailedError(f"device_count() returned {count!r}, not an int >= 0")
        return int(count)

    @cached_property
    def devices(self) -> tuple[DeviceInfo, ...]:
        """``devices()``, checked to be a sequence."""
        devs = call("devices()", self.platform.devices)
        if not isinstance(devs, Sequence) or isinstance(devs, str):
            raise CheckFailedError(f"devices() returned {type(devs).__name__}, not a sequence")
        return tuple(devs)

    def need_devices(self) -> int:
        """Return the device count; skip the check when there is no device."""
        if self.count == 0:
            raise CheckSkippedError("no device is visible")
        return self.count

    def memory(self, device: int) -> MemoryInfo:
        """Return ``memory_info(device)``, checked to be a :class:`MemoryInfo`."""
        info = call(f"memory_info({device})", self.platform.memory_info, device)
        if not isinstance(info, MemoryInfo):
            raise CheckFailedError(
                f"memory_info({device}) returned {type(info).__name__}, not MemoryInfo"
            )
        return info

    def probe_owner(self) -> Any:
        """Return the object whose ``probe`` the registry would call."""
        if self.factory is not None and hasattr(self.factory, "probe"):
            return self.factory
        if self.registered_name is not None:
            with suppress(ConfigurationError):
                return factory_for(self.registered_name)
        return type(self.platform)

    def probe_describes_platform(self) -> bool:
        """Whether the argument-less probe speaks of this platform, not of one built with args."""
        if self.registered_name is not None or hasattr(self.factory, "probe"):
            return True
        try:
            got = [(d.name, d.physical_index) for d in type(self.platform)().devices()]
        except Exception:
            return False
        return got == [(d.name, d.physical_index) for d in self.devices]

    def _child_specs(self) -> list[tuple[str, str]]:
        if self.child is not None:
            return [("ref" if ":" in self.child else "name", self.child)]
        if self.isolation == "inprocess":
            return []
        specs = [] if self.registered_name is None else [("name", self.registered_name)]
        cls = type(self.platform)
        if cls.__module__ != "__main__" and "<" not in cls.__qualname__:
            specs.append(("ref", f"{cls.__module__}:{cls.__qualname__}"))
        return specs

    def run_child(
        self, spec: tuple[str, str], *, env: Mapping[str, str] | None = None, queries: bool = True
    ) -> dict[str, Any]:
        """Build the platform ``spec`` names in a fresh interpreter; return its JSON answer."""
        child_env = {**os.environ, **self.env, **(env or {})}
        paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        old = child_env.get("PYTHONPATH")
        child_env["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
        with tempfile.TemporaryDirectory(prefix="accelplat-conformance-") as tmp:
            out = os.path.join(tmp, "answer.json")
            job = {"kind": spec[0], "value": spec[1], "queries": queries, "out": out}
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", BOOTSTRAP, json.dumps(job)],
                    env=child_env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return {"error": "timed out after 60 s"}
            with suppress(OSError, ValueError), open(out, encoding="utf-8") as f:
                return dict(json.load(f))
        tail = proc.stderr.strip().splitlines()[-3:]
        return {
            "ok": False,
            "error": f"the child exited {proc.returncode} without an answer: {tail}",
        }

    @cached_property
    def baseline(self) -> dict[str, Any] | None:
        """The answer of a fresh process that reproduced the caller's platform, or ``None``.

        Its ``spec`` says how it was built and ``label`` says so in words (``name 'cuda'``).
        """
        tried: list[str] = []
        want = [(d.name, d.physical_index) for d in self.devices]
        for spec in self._child_specs():
            label, answer = f"{spec[0]} {spec[1]!r}", self.run_child(spec)
            if not answer.get("ok"):
                tried.append(f"{label}: {answer.get('error')}")
                continue
            got = [tuple(d) for d in answer.get("devices", [])]
            if answer.get("device_count") != len(want) or got != want:
                tried.append(f"{label}: sees {got} instead of {want}")
                continue
            return {**answer, "spec": spec, "label": label}
        self.baseline_note = "no way to rebuild the platform in a subprocess"
        if tried:
            self.baseline_note = f"a fresh process could not reproduce it ({'; '.join(tried)})"
        return None

    def inprocess_note(self) -> str:
        """Say that a check ran in the caller's process, and why."""
        return f"in-process: {self.baseline_note}; pass child='module:attr' to isolate"
