"""Capture a host's answers at the vendor boundary, and replay them anywhere.

``accelplat capture`` records what accelplat reads on a machine — the host files its backends
open, the answers of NVML, Level Zero Sysman and amdsmi, installed versions, the relevant
environment variables — into a bundle (see :mod:`accelplat.replay._bundle`). Replaying the bundle
(``ACCELPLAT_REPLAY=bundle.tar.gz``, ``accelplat info --replay bundle.tar.gz`` or
:func:`replaying`) makes detection, ``devices()``, ``memory_info``, holders and capabilities
answer from it through the same code paths as on the captured host: only the vendor boundary
(:mod:`accelplat._boundary`) is replaced.

This package imports no vendor library and no framework; ``import accelplat`` does not import
it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform as _platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from accelplat import _boundary
from accelplat.errors import AccelplatError
from accelplat.replay._bundle import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Bundle,
    bundle_bytes,
    load_bundle,
    parse_bundle,
)
from accelplat.replay._record import Recorder
from accelplat.replay._replay import Replayer

__all__ = [
    "ENV_REPLAY",
    "FORMAT_VERSION",
    "Bundle",
    "Capture",
    "Recorder",
    "Replayer",
    "activate",
    "capture",
    "compare_info",
    "describe",
    "load_bundle",
    "parse_bundle",
    "recording",
    "relevant_env",
    "replaying",
]

ENV_REPLAY = _boundary.ENV_REPLAY

_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ONEAPI_DEVICE_SELECTOR",
    }
)
_ENV_PREFIXES = ("ACCELPLAT_", "ZE_")
_ENV_LEFT_OUT = frozenset({ENV_REPLAY})
_PLUGINS = "ACCELPLAT_PLUGINS"

_DRIVER_MODULES = ("amdgpu",)
"""Kernel modules whose ``/sys/module/NAME/version`` names the driver where no library says."""

VERSION_DISTRIBUTIONS = ("accelplat", "torch", "nvidia-ml-py", "amdsmi", "vllm")
"""Distributions whose installed versions a capture's summary names."""

_TIME_KEYS = frozenset({"timestamp", "wall_time", "created", "generated", "generated_at"})


def relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Return the variables of ``environ`` that change what accelplat answers.

    These are the visible-devices variables of every vendor, Level Zero's ``ZE_*`` and
    accelplat's own ``ACCELPLAT_*`` (except ``ACCELPLAT_REPLAY``).

    Args:
        environ: An environment, e.g. ``os.environ``.
    """
    return {k: v for k, v in sorted(environ.items()) if _relevant(k)}


def _relevant(name: str) -> bool:
    if name in _ENV_LEFT_OUT:
        return False
    return name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)


def _set_env(env: Mapping[str, str]) -> dict[str, str | None]:
    """Make the relevant variables exactly ``env`` (plugins off unless it says otherwise)."""
    saved: dict[str, str | None] = {}
    for name in [k for k in os.environ if _relevant(k)]:
        saved[name] = os.environ.pop(name)
    wanted = {k: v for k, v in env.items() if _relevant(k)}
    wanted.setdefault(_PLUGINS, "")
    for name, value in wanted.items():
        saved.setdefault(name, None)
        os.environ[name] = value
    return saved


def _restore_env(saved: Mapping[str, str | None]) -> None:
    for name in [k for k in os.environ if _relevant(k)]:
        if name not in saved:
            del os.environ[name]
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _reset_caches() -> None:
    """Forget every cached answer of the host, so the next question crosses the boundary."""
    from accelplat import _registry as registry
    from accelplat._vendor import nvml as _nvml

    registry.reset()
    _nvml.forget()
    for module_name, hook in (("accelplat._backends.rocm", "_after_fork"),):
        module = sys.modules.get(module_name)
        forget: Callable[[], None] | None = getattr(module, hook, None) if module else None
        if forget is not None:
            forget()


def _install(interceptor: _boundary.Interceptor) -> Callable[[], None]:
    """Route every seam (vendor libraries and host files) through ``interceptor``.

    Returns:
        A function that puts the previous seams back.
    """
    from accelplat import _files
    from accelplat.replay._hostfiles import BoundaryFiles

    previous = _boundary.install(interceptor)
    previous_files = _files.set_host_files(BoundaryFiles(interceptor))
    _reset_caches()

    def undo() -> None:
        _boundary.install(previous)
        _files.set_host_files(previous_files)

    return undo


@contextmanager
def replaying(bundle: Bundle | str | os.PathLike[str]) -> Iterator[Replayer]:
    """Make this process answer from ``bundle`` for the duration of the block.

    Args:
        bundle: A loaded bundle or a path to one.

    Yields:
        The :class:`Replayer`.

    Raises:
        BundleError: When a path names a bundle that cannot be loaded.

    Side effects:
        Sets the relevant environment variables to the captured ones (``ACCELPLAT_PLUGINS``
        empty unless captured otherwise: plugins are not part of a host), resets the platform
        registry and the NVML session, and undoes all of it on exit.
    """
    loaded = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    replayer = Replayer(loaded)
    saved = _set_env(loaded.env)
    undo = _install(replayer)
    try:
        yield replayer
    finally:
        undo()
        _restore_env(saved)
        _reset_caches()


def activate(path: str | os.PathLike[str]) -> Replayer:
    """Make the whole process answer from the bundle at ``path`` (``ACCELPLAT_REPLAY``).

    Args:
        path: The bundle.

    Returns:
        The installed :class:`Replayer`.

    Raises:
        BundleError: When the bundle cannot be loaded.

    Side effects:
        For the rest of the process every seam answers from the bundle. Unlike
        :func:`replaying`, the process's own variables win: a captured variable is set only
        where the process has none (``ACCELPLAT_PLUGINS`` defaults to empty), so a process
        started by a replay, or by a test that sets ``CUDA_VISIBLE_DEVICES`` over a replayed
        host, sees the variables it was given.
    """
    replayer = Replayer(load_bundle(path))
    for name, value in replayer.bundle.env.items():
        if _relevant(name):
            os.environ.setdefault(name, value)
    os.environ.setdefault(_PLUGINS, "")
    _install(replayer)
    return replayer


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Record every answer given at the vendor boundary for the duration of the block.

    Args:
        recorder: Collects the answers.

    Yields:
        ``recorder``.

    Side effects:
        Sets ``ACCELPLAT_PLUGINS`` empty (a capture describes the host, not its plugins), resets
        the platform registry and the NVML session, and undoes both on exit.
    """
    saved = os.environ.get(_PLUGINS)
    os.environ[_PLUGINS] = ""
    undo = _install(recorder)
    try:
        yield recorder
    finally:
        undo()
        if saved is None:
            os.environ.pop(_PLUGINS, None)
        else:
            os.environ[_PLUGINS] = saved
        _reset_caches()


@dataclass(frozen=True)
class Capture:
    """A finished capture.

    Attributes:
        data: The bundle's ``.tar.gz`` bytes.
        host: The ``host.json`` document.
        info: ``accelplat info --json`` as this host printed it while recording.
        contents: ``CONTENTS.txt``: what is inside, in words.
    """

    data: bytes
    host: Mapping[str, Any]
    info: Mapping[str, Any]
    contents: str


def _exercise(
    platform: Any, samples: int, interval_s: float, sleep: Callable[[float], None]
) -> None:
    """Ask what replays will ask beyond ``info``: holders, capabilities, memory over time."""
    try:
        devices = list(platform.devices())
    except AccelplatError:
        return
    # A failing query is recorded like any answer; the capture goes on with the next one.
    for dev in devices:
        with contextlib.suppress(Exception):
            platform.memory_holders(dev.index)
    for _ in range(samples):
        sleep(interval_s)
        for dev in devices:
            with contextlib.suppress(Exception):
                platform.memory_info(dev.index)


@contextmanager
def _outside_any_project() -> Iterator[None]:
    """Run the block in an empty directory.

    A project's own capability table (``./pyproject.toml``) is not a fact of the host, and a
    replay elsewhere could not reproduce it.
    """
    import tempfile

    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="accelplat-capture-") as empty:
        os.chdir(empty)
        try:
            yield
        finally:
            os.chdir(here)


def _kernel_driver_version() -> str | None:
    """Return the amdgpu kernel module's version (read through the shared reader, so recorded)."""
    from accelplat import _files

    sysfs = os.environ.get("ACCELPLAT_SYSFS_ROOT") or "/sys"
    for module in _DRIVER_MODULES:
        try:
            text = _files.read_text(f"{sysfs}/module/{module}/version").strip()
        except (OSError, AccelplatError):
            continue
        if text:
            return f"{module} {text[:64]}"
    return None


def capture(
    *,
    processes: bool = True,
    samples: int = 4,
    interval_s: float = 0.4,
    sleep: Callable[[float], None] = time.sleep,
) -> Capture:
    """Record this host's answers into a bundle.

    Runs what ``accelplat info`` runs (detection, every device, its memory), then asks each
    device for its memory holders and samples its memory ``samples`` times, ``interval_s``
    apart, recording every answer at the vendor boundary.

    Args:
        processes: Keep the pids and names of processes holding device memory;
            ``False`` records every process list as empty.
        samples: Memory samples after the first reading (0-100).
        interval_s: Seconds between samples (0-10).
        sleep: How to wait between samples (tests pass a fake).

    Returns:
        The :class:`Capture`.

    Raises:
        ValueError: For ``samples`` or ``interval_s`` out of range.

    Side effects:
        Probes every built-in platform and queries memory as ``accelplat info`` does (no device
        context, no torch import); resets the platform registry before and after.
    """
    if not 0 <= samples <= 100:
        raise ValueError(f"samples must be 0-100, got {samples}")
    if not 0 <= interval_s <= 10:
        raise ValueError(f"interval_s must be 0-10 seconds, got {interval_s}")
    from accelplat import __version__
    from accelplat._describe import collect_info
    from accelplat._registry import current_platform
    from accelplat._vendor.graphs import distribution_version

    recorder = Recorder(processes=processes)
    with recording(recorder), _outside_any_project():
        env = relevant_env(os.environ)
        info = collect_info()
        driver: str | None = None
        if info.get("platform"):
            platform = current_platform()
            _exercise(platform, samples, interval_s, sleep)
            get_driver = getattr(platform, "driver_version", None)
            if callable(get_driver):
                try:
                    driver = str(get_driver())
                except AccelplatError:
                    driver = None
        if driver is None:
            driver = _kernel_driver_version()
        versions = {name: distribution_version(name) for name in VERSION_DISTRIBUTIONS}
    versions["accelplat"] = __version__
    devices = info.get("devices") or []
    summary = {
        "platform": info.get("platform"),
        "devices": [
            {"name": d.get("name"), "total": (d.get("memory") or {}).get("total")} for d in devices
        ],
        "driver": driver,
        "versions": versions,
        "python": _platform.python_version(),
        "machine": _platform.machine(),
        "system": _platform.system(),
    }
    host: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "accelplat_version": __version__,
        "options": {"processes": processes, "samples": samples, "interval_s": interval_s},
        "summary": summary,
        "env": env,
        "records": recorder.records(),
    }
    contents = describe(host)
    return Capture(bundle_bytes(host, info, contents), host, info, contents)


def describe(host: Mapping[str, Any]) -> str:
    """Return, in words, everything a ``host.json`` document holds (``CONTENTS.txt``).

    Args:
        host: The document.
    """
    summary = host.get("summary", {})
    options = host.get("options", {})
    records = host.get("records", [])
    lines = [
        f"accelplat capture bundle, format version {host.get('format_version')}",
        f"captured {host.get('created')} with accelplat {host.get('accelplat_version')}",
        f"platform: {summary.get('platform')}; devices: {len(summary.get('devices') or [])}",
        f"driver: {summary.get('driver')}",
        "",
        "Files in this bundle:",
        "  host.json     every question accelplat asked at the vendor boundary, with the answers",
        "  info.json     `accelplat info --json` as this host printed it",
        "  CONTENTS.txt  this description",
        "",
    ]
    if options.get("processes"):
        lines.append(
            "Processes: INCLUDED - the pid and process name of each process holding device "
            "memory (leave them out with --no-processes)."
        )
    else:
        lines.append("Processes: left out (--no-processes): process lists are recorded empty.")
    lines.append(
        "Not included: host name, user names, command lines, anything outside the files and "
        "calls listed below."
    )
    lines.append("")
    env = host.get("env", {})
    lines.append(f"Environment variables ({len(env)}):")
    lines.extend(f"  {k}={v}" for k, v in env.items())
    lines.append("")
    lines.append(
        "Versions: " + ", ".join(f"{k} {v}" for k, v in (summary.get("versions") or {}).items())
    )
    lines.append(
        f"Python {summary.get('python')} on {summary.get('system')} {summary.get('machine')}"
    )
    lines.append("")
    by_channel: dict[str, list[str]] = {}
    for rec in records:
        key = rec.get("key", [])
        count = len(rec.get("answers", []))
        label = " ".join(str(k) for k in key if not isinstance(k, (list, dict)))
        if count > 1:
            label += f"  ({count} answers)"
        by_channel.setdefault(str(rec.get("channel")), []).append(label)
    titles = {
        "file": "Host files read (sysfs, procfs, cgroup)",
        "nvml": "NVML calls",
        "levelzero": "Level Zero Sysman calls",
        "amdsmi": "amdsmi calls",
        "dist": "Installed versions asked",
        "proc": "Processes classified (pid: state and name)",
        "device": "Device nodes checked (/dev/kfd, render nodes: whether they open)",
        "host": "Host facts (the machine name, as uname -m)",
    }
    for channel, labels in by_channel.items():
        lines.append(f"{titles.get(channel, channel)} ({len(labels)}):")
        lines.extend(f"  {label}" for label in labels)
        lines.append("")
    return "\n".join(lines)


def compare_info(recorded: Any, replayed: Any, where: str = "info") -> list[str]:
    """Return how a replayed ``info --json`` differs from the recorded one (``[]``: it doesn't).

    Every key the recorded document has must be present with an equal value; keys a newer
    accelplat added are allowed; keys naming times (``timestamp``, ``created`` …) are skipped.

    Args:
        recorded: The recorded document (or part of it).
        replayed: The replayed one.
        where: Path of this part, for the messages.

    Returns:
        One line per difference.
    """
    if isinstance(recorded, dict):
        if not isinstance(replayed, dict):
            return [f"{where}: recorded an object, replay gave {type(replayed).__name__}"]
        out: list[str] = []
        for key, value in recorded.items():
            if key in _TIME_KEYS:
                continue
            if key not in replayed:
                out.append(f"{where}.{key}: missing from the replay")
                continue
            out.extend(compare_info(value, replayed[key], f"{where}.{key}"))
        return out
    if isinstance(recorded, list):
        if not isinstance(replayed, list) or len(replayed) != len(recorded):
            return [f"{where}: recorded {recorded!r}, replay gave {replayed!r}"]
        out = []
        for i, (a, b) in enumerate(zip(recorded, replayed, strict=True)):
            out.extend(compare_info(a, b, f"{where}[{i}]"))
        return out
    if recorded != replayed or type(recorded) is not type(replayed):
        return [f"{where}: recorded {recorded!r}, replay gave {replayed!r}"]
    return []
