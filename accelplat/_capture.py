"""``accelplat capture``: record this host's answers into a bundle that replays anywhere.

A capture runs what ``accelplat info`` runs, then what replays ask beyond it (memory holders,
memory over time), while :func:`accelplat.replay.recording` keeps every boundary answer.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform as _platform
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from accelplat import _files
from accelplat._backends._common import ENV_PROC_ROOT, ENV_SYSFS_ROOT
from accelplat._backends.cpu import ENV_CGROUP_ROOT
from accelplat._describe import collect_info, driver_version
from accelplat._registry import current_platform
from accelplat._replay._bundle import FORMAT_NAME, FORMAT_VERSION, TABLES, bundle_bytes
from accelplat._replay._install import GRANT_VARIABLES, considered, recording
from accelplat._replay._record import Recorder
from accelplat._util import printable
from accelplat._vendor.versions import distribution_version
from accelplat._version import __version__
from accelplat.errors import AccelplatError

VERSION_DISTRIBUTIONS = ("accelplat", "torch", "nvidia-ml-py", "amdsmi", "vllm")

_DEVICE_RULE = re.compile(r"^([abc]) (\*|\d{1,10}):(\*|\d{1,10}) ([rwm]{1,3})$")
_NVIDIA_MAJOR = 195  # /dev/nvidiaN is char 195:N, /dev/nvidiactl 195:255 (NVIDIA driver README)
_MAX_RULES = 256

# Times, and the version of the document's shape, are no host facts: a newer accelplat prints a
# newer one (info's keys kept their meaning from schema 1 to 2).
_SKIPPED_KEYS = {"timestamp", "wall_time", "created", "generated", "generated_at", "schema"}
_BY_NAME = frozenset({"candidates"})  # lists compared by name: a platform added later is allowed


@dataclass(frozen=True)
class Capture:
    """A finished capture: the bundle's bytes, its documents and ``CONTENTS.txt`` in words."""

    data: bytes
    host: Mapping[str, Any]
    info: Mapping[str, Any]
    contents: str


def _exercise(
    platform: Any, samples: int, interval_s: float, sleep: Callable[[float], None]
) -> None:
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
    # An empty directory: a project's pyproject.toml is no host fact.
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="accelplat-capture-") as empty:
        os.chdir(empty)
        try:
            yield
        finally:
            os.chdir(here)


def _driver(info: Mapping[str, Any]) -> str | None:
    # The driver version the platform reports, else (where no library says) the amdgpu kernel
    # module's /sys/module/amdgpu/version, read through the boundary so it is recorded.
    if info.get("platform") and (version := driver_version(current_platform())) is not None:
        return version
    sysfs = os.environ.get(ENV_SYSFS_ROOT) or "/sys"
    try:
        text = _files.read_text(f"{sysfs}/module/amdgpu/version").strip()
    except (OSError, AccelplatError):
        return None
    return f"amdgpu {text[:64]}" if text else None


def scheduler_grant() -> dict[str, Any]:
    """Return the GPUs an outer scheduler granted this process, as far as it can tell.

    ``variables``: those of :data:`~accelplat._replay._install.GRANT_VARIABLES` that are set.
    ``cgroup``: the process's device cgroup (``None`` without ``/proc/self/cgroup``): ``version``,
    ``path``, and under cgroup v1 the ``devices.list`` rules (``allowed``) with the
    NVIDIA GPU minors they open (``gpus``: ``"all"`` or a list), or ``note`` saying why not.
    The files are read through the vendor boundary: a capture records them, a replay answers.
    """
    variables = {k: os.environ[k] for k in GRANT_VARIABLES if k in os.environ}
    return {"variables": variables, "cgroup": _device_cgroup()}


def _device_cgroup() -> dict[str, Any] | None:
    proc = os.environ.get(ENV_PROC_ROOT) or "/proc"
    sysfs = os.environ.get(ENV_SYSFS_ROOT) or "/sys"
    root = os.environ.get(ENV_CGROUP_ROOT) or os.path.join(sysfs, "fs", "cgroup")
    try:
        text = _files.read_text(os.path.join(proc, "self", "cgroup"))
    except (OSError, AccelplatError):
        return None
    unified: str | None = None
    for line in text.splitlines()[:64]:
        _, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if not sep or ".." in path.split("/"):
            continue
        if "devices" in controllers.split(","):
            return _v1_device_rules(root, path)
        if controllers == "":
            unified = path
    if unified is None:
        return None
    # cgroup v2 has no device list: an eBPF program attached to the cgroup decides.
    why = "cgroup v2 controls devices with an eBPF program: no device list to read"
    return {"version": "cgroup-v2", "path": unified, "allowed": None, "note": why}


def _v1_device_rules(root: str, path: str) -> dict[str, Any]:
    found: dict[str, Any] = {"version": "cgroup-v1", "path": path, "allowed": None}
    where = os.path.join(root, "devices", path.lstrip("/"), "devices.list")
    try:
        text = _files.read_text(where)
    except (OSError, AccelplatError) as exc:
        found["note"] = f"devices.list unreadable: {getattr(exc, 'strerror', None) or exc}"
        return found
    rules = [line.strip() for line in text.splitlines() if line.strip()][:_MAX_RULES]
    found["allowed"] = rules
    gpus: set[int] = set()
    for kind, major, minor, _ in (m.groups() for m in map(_DEVICE_RULE.match, rules) if m):
        if kind == "a" or (major in ("*", str(_NVIDIA_MAJOR)) and minor == "*"):
            found["gpus"] = "all"
            return found
        if kind == "c" and major == str(_NVIDIA_MAJOR) and int(minor) < 255:
            gpus.add(int(minor))
    found["gpus"] = sorted(gpus)
    return found


def capture(
    *,
    processes: bool = True,
    samples: int = 4,
    interval_s: float = 0.4,
    sleep: Callable[[float], None] = time.sleep,
) -> Capture:
    """Record this host's answers into a bundle.

    Runs what ``accelplat info`` runs, then asks each device for its memory holders and samples
    its memory ``samples`` times (0-100), ``interval_s`` (0-10) apart, waiting with ``sleep``.
    ``processes=False`` records every process list empty.

    Raises:
        ValueError: For ``samples`` or ``interval_s`` out of range.

    Side effects:
        Probes every built-in platform and queries memory; forgets the detected platform
        before and after.
    """
    if not 0 <= samples <= 100:
        raise ValueError(f"samples must be 0-100, got {samples}")
    if not 0 <= interval_s <= 10:
        raise ValueError(f"interval_s must be 0-10 seconds, got {interval_s}")
    recorder = Recorder(processes=processes)
    with recording(recorder), _outside_any_project():
        variables = considered()
        env = {k: os.environ[k] for k in sorted(variables) if k in os.environ}
        info = collect_info()
        if info.get("platform"):
            _exercise(current_platform(), samples, interval_s, sleep)
        driver = _driver(info)
        grant = scheduler_grant()
        versions = {name: distribution_version(name) for name in VERSION_DISTRIBUTIONS}
    versions["accelplat"] = __version__
    summary = {
        "platform": info.get("platform"),
        "devices": [
            {"name": d.get("name"), "total": (d.get("memory") or {}).get("total")}
            for d in info.get("devices") or []
        ],
        "driver": driver,
        "versions": versions,
        "python": _platform.python_version(),
        "machine": _platform.machine(),
        "system": _platform.system(),
        "scheduler": grant,
    }
    host: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "accelplat_version": __version__,
        "options": {"processes": processes, "samples": samples, "interval_s": interval_s},
        "summary": summary,
        "variables": list(variables),
        "env": env,
        "records": recorder.records(),
    }
    contents = bundle_contents(host)
    return Capture(bundle_bytes(host, info, contents), host, info, contents)


def bundle_contents(host: Mapping[str, Any]) -> str:
    """Return the ``CONTENTS.txt`` text: everything a ``host.json`` document holds, in words.

    Every character a terminal would act on (an escape, a bidirectional override) is escaped
    as Python writes it in a string, line by line.
    """
    summary = host.get("summary", {})
    env = host.get("env", {})
    versions = summary.get("versions") or {}
    text = TABLES["contents"]  # the fixed sentences
    processes = "included" if host.get("options", {}).get("processes") else "left_out"
    lines = [
        f"accelplat capture bundle, format version {host.get('format_version')}",
        f"captured {host.get('created')} with accelplat {host.get('accelplat_version')}",
        f"platform: {summary.get('platform')}; devices: {len(summary.get('devices') or [])}",
        f"driver: {summary.get('driver') or 'unknown'}",
        "",
        *text["files"],
        "",
        text[f"processes_{processes}"],
        text["not_included"],
        "",
        f"Environment variables ({len(env)}):",
        *(f"  {k}={v}" for k, v in env.items()),
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"Python {summary.get('python')} on {summary.get('system')} {summary.get('machine')}",
        *_grant_lines(summary.get("scheduler")),
        "",
    ]
    by_channel: dict[str, list[str]] = {}
    for rec in host.get("records", []):
        count = len(rec.get("answers", []))
        label = " ".join(str(k) for k in rec.get("key", []) if not isinstance(k, (list, dict)))
        label += f"  ({count} answers)" if count > 1 else ""
        by_channel.setdefault(str(rec.get("channel")), []).append(label)
    for channel, labels in by_channel.items():
        lines.append(f"{TABLES['channel_titles'].get(channel, channel)} ({len(labels)}):")
        lines.extend(f"  {label}" for label in labels)
        lines.append("")
    # every value came from the host (a variable, a cgroup path, a file name): escaped, so that
    # the file a maintainer reads before trusting a bundle cannot drive their terminal
    return "\n".join(printable(line) for line in lines)


def _grant_lines(grant: Any) -> list[str]:
    if not isinstance(grant, dict):
        return []
    cgroup = grant.get("cgroup")
    if not isinstance(cgroup, dict):
        where = "no device cgroup found"
    elif cgroup.get("allowed") is None:
        where = f"{cgroup.get('version')} {cgroup.get('path')}: {cgroup.get('note')}"
    else:
        where = f"{cgroup.get('version')} {cgroup.get('path')}: NVIDIA GPUs {cgroup.get('gpus')}"
    named = ", ".join(f"{k}={v}" for k, v in (grant.get("variables") or {}).items()) or "none set"
    return [f"Scheduler grant: {named}; device cgroup: {where}"]


def compare_info(recorded: Any, replayed: Any, where: str = "info") -> list[str]:
    """Return how a replayed ``info --json`` differs from the recorded one (``[]``: it doesn't).

    Every recorded key must be present with an equal value; keys a newer accelplat added are
    allowed, keys naming times (``timestamp`` …) and the document's version skipped. The
    candidate platforms are compared by name, so a platform a newer accelplat added is allowed
    too. One line per difference, from ``where``.
    """
    if isinstance(recorded, dict):
        if not isinstance(replayed, dict):
            return [f"{where}: recorded an object, replay gave {type(replayed).__name__}"]
        out: list[str] = []
        for key, value in recorded.items():
            if key in _SKIPPED_KEYS:
                continue
            if key not in replayed:
                out.append(f"{where}.{key}: missing from the replay")
            elif key in _BY_NAME:
                out.extend(compare_info(_named(value), _named(replayed[key]), f"{where}.{key}"))
            else:
                out.extend(compare_info(value, replayed[key], f"{where}.{key}"))
        return out
    if isinstance(recorded, list) and isinstance(replayed, list) and len(recorded) == len(replayed):
        return [
            line
            for i, (a, b) in enumerate(zip(recorded, replayed, strict=True))
            for line in compare_info(a, b, f"{where}[{i}]")
        ]
    if recorded != replayed or type(recorded) is not type(replayed):
        return [f"{where}: recorded {recorded!r}, replay gave {replayed!r}"]
    return []


def _named(items: Any) -> Any:
    """A list of objects as an object keyed by their ``name`` (anything else as it is)."""
    if isinstance(items, list) and all(isinstance(i, dict) and "name" in i for i in items):
        return {str(i["name"]): i for i in items}
    return items
