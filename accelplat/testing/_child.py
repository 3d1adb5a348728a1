"""The fresh process in which the conformance kit watches a platform for side effects.

``python -c BOOTSTRAP JOB`` records ``sys.modules`` before accelplat is imported, so a framework
imported at any stage shows up even when the parent had it; the JSON answer also names newly
mapped runtime libraries and the devices whose ``memory_holders`` list this process.
"""

from __future__ import annotations

import json
import os
import pkgutil
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from accelplat import _files
from accelplat._registry import describe_failure, factory_for, get_platform

_MAPS_LIMIT = 256 * 1024 * 1024  # /proc/self/maps of a large process is a few MiB

BOOTSTRAP = (  # run with python -c; its single argument is the JSON job
    "import sys; _before = set(sys.modules); "
    "from accelplat.testing._child import main; main(_before, sys.argv[1])"
)

# Modules whose import a context-free backend must not cause (a prefix match on dotted names).
FRAMEWORK_MODULES: tuple[str, ...] = (
    *("torch", "jax", "jaxlib", "tensorflow", "paddle", "mxnet", "cupy", "pycuda", "numba.cuda"),
    *("intel_extension_for_pytorch", "oneflow", "mindspore", "triton", "dpctl"),
)

# Runtime libraries whose mapping the kit reports, but does not fail: mapping is no context
# (nvmlInit maps libcuda.so on R580 drivers, taking no device memory).
RUNTIME_LIBRARIES: tuple[str, ...] = ("libcuda.so", "libcudart.so", "libamdhip64.so", "libsycl.so")


def frameworks_in(modules: Iterable[str]) -> list[str]:
    """Return the names of :data:`FRAMEWORK_MODULES` that one of ``modules`` is or lies under."""
    names = set(modules)
    return [
        fw for fw in FRAMEWORK_MODULES if fw in names or any(n.startswith(f"{fw}.") for n in names)
    ]


def mapped_runtime_libraries() -> set[str]:
    """Return the device runtime libraries mapped into this process (Linux; else empty)."""
    try:
        text = _files.read_text("/proc/self/maps", limit=_MAPS_LIMIT)
    except OSError:
        return set()
    bases = {os.path.basename(line.rpartition(" ")[2]) for line in text.splitlines()}
    return {lib for lib in RUNTIME_LIBRARIES for base in bases if base.startswith(lib)}


def held_here(platform: Any) -> list[int]:
    """Return the devices whose ``memory_holders`` list this process."""
    from accelplat._types import HolderState

    def ours(device: int) -> bool:
        holders = platform.memory_holders(device) or ()
        return any(h.pid == os.getpid() or h.state == HolderState.SELF for h in holders)

    return [device for device in range(platform.device_count()) if ours(device)]


def query(platform: Any) -> list[int]:
    """Ask ``platform`` every query the kit watches; return the devices listing this process."""
    for device in range(platform.device_count()):
        platform.memory_info(device)
    for attr in ("release", "graph", "default_memory_utilization", "preferred_start_method"):
        getattr(platform, attr)
    return held_here(platform)


def _run(job: dict[str, Any], answer: dict[str, Any], stage: Callable[[str], None]) -> None:
    by_name, value = job["kind"] == "name", job["value"]
    factory: Any = factory_for(value) if by_name else pkgutil.resolve_name(value)
    if not callable(factory):
        raise TypeError(f"{value} is not callable")
    stage("import")
    if (probe := getattr(factory, "probe", None)) is not None:
        result = probe()  # a ProbeResult, or (a plugin's) anything with a truth value
        answer["available"] = bool(getattr(result, "available", result))
        answer["reason"] = getattr(result, "reason", repr(result))
    stage("probe")
    if not answer["available"]:
        answer.update(device_count=0, devices=[], ok=True)
        return
    platform = get_platform(value) if by_name else factory()
    stage("construct")
    answer["device_count"] = platform.device_count()
    answer["devices"] = [[d.name, d.physical_index] for d in platform.devices()]
    answer["context_free"] = platform.context_free
    if job.get("queries", True):
        answer["self_holders"] = query(platform)
    stage("queries")
    answer["ok"] = True


def main(before: set[str], job_text: str) -> None:
    """Build and query the job's platform; write the answer to ``job["out"]``.

    The answer's keys: ``ok``, ``error`` (and ``traceback``), ``available`` and ``reason`` (the
    probe's), ``device_count``, ``devices`` (``[name, physical_index]`` each), ``context_free``,
    ``self_holders``, ``frameworks`` (new framework modules per stage) and ``libraries``
    (runtime libraries newly mapped).
    """
    job = json.loads(job_text)
    libs_before = mapped_runtime_libraries()
    seen = set(before)
    answer: dict[str, Any] = {"ok": False, "error": None, "available": True, "frameworks": {}}

    def stage(name: str) -> None:
        now = set(sys.modules)
        answer["frameworks"][name] = frameworks_in(now - seen)
        seen.update(now)

    try:
        _run(job, answer, stage)
    except BaseException as exc:
        answer["error"] = describe_failure(exc)
        answer["traceback"] = traceback.format_exc(limit=8)
        stage("failed")
    answer["libraries"] = sorted(mapped_runtime_libraries() - libs_before)
    with open(job["out"], "w", encoding="utf-8") as f:
        json.dump(answer, f)
