"""Turn a fake host tree into a replay bundle, as ``accelplat capture`` would record it.

The tree (a fake ``/sys`` and ``/dev`` from :mod:`tests.fakes.sysfs`, and for Intel hosts a fake
Level Zero loader compiled by :mod:`tests.fakes.levelzero`) is captured with accelplat's own
recorder; every temporary path is rewritten to ``/sys``, ``/dev`` and the standard loader name;
the installed torch is set to the host's build; the golden ``info.json`` is what replaying the
result prints; ``CONTENTS.txt`` starts with where each file of the host came from.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from accelplat._capture import bundle_contents, capture
from accelplat._describe import collect_info
from accelplat._replay._bundle import bundle_bytes, parse_bundle
from accelplat.replay import replaying

LOADER = "libze_loader.so.1"
NO_NVML = {
    "present": False,
    "reason": "NVML unavailable: libnvidia-ml.so.1 was not found: no NVIDIA driver is installed, "
    "or its library is not on the loader path (NVMLError_LibraryNotFound)",
    "vendor_error": "NVMLError_LibraryNotFound",
}
"""What a host without the NVIDIA driver answers for NVML."""
CREATED = "2026-01-01T00:00:00+00:00"
_BLOCKED = ("pynvml", "amdsmi", "torch")
_CLEARED = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
    "ACCELPLAT_PLATFORM",
    "ACCELPLAT_LEVEL_ZERO_LIB",
    "ACCELPLAT_XPU_INTEGRATED",
    "ACCELPLAT_XPU_ALLOW_TORCH",
)
_TREE = (
    "ACCELPLAT_SYSFS_ROOT",
    "ACCELPLAT_DEV_ROOT",
    "ACCELPLAT_PROC_ROOT",
    "ACCELPLAT_LEVEL_ZERO_LIB",
)


@contextmanager
def _isolated(root: Path, env: Mapping[str, str]) -> Iterator[None]:
    names = {*_CLEARED, *_TREE, *env}
    saved_env = {k: os.environ.get(k) for k in names}
    saved_mods = {k: sys.modules.get(k, ...) for k in _BLOCKED}
    for name in names:
        os.environ.pop(name, None)
    os.environ["ACCELPLAT_SYSFS_ROOT"] = str(root / "sys")
    os.environ["ACCELPLAT_DEV_ROOT"] = str(root / "dev")
    os.environ["ACCELPLAT_PROC_ROOT"] = str(root / "proc")  # the building machine's is no fact
    os.environ.update(env)
    for name in _BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, module in saved_mods.items():
            if module is ...:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module  # type: ignore[assignment]


def _rewrite(value: Any, replacements: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, list):
        return [_rewrite(v, replacements) for v in value]
    if isinstance(value, dict):
        return {_rewrite(k, replacements): _rewrite(v, replacements) for k, v in value.items()}
    return value


def build_bundle(
    populate: Callable[[Path], Mapping[str, str]],
    *,
    source: str,
    torch: str,
    driver: str,
    provenance: str,
    python: str = "3.12.0",
) -> bytes:
    """Capture the host ``populate`` writes under a temporary root; return the bundle's bytes.

    ``populate(root)`` writes ``root/sys`` and ``root/dev`` (and anything else) and returns the
    variables the capture runs under (``ACCELPLAT_LEVEL_ZERO_LIB`` for a fake loader, the
    host's visible-devices variables); the tree's own variables are left out of the bundle.
    The bytes are reproducible: no time, no temporary path inside.
    """
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = dict(populate(root))
        with _isolated(root, env):
            cap = capture(samples=2, interval_s=0.0, sleep=lambda _: None)
        replacements = {str(root): ""}
        if lib := env.get("ACCELPLAT_LEVEL_ZERO_LIB"):
            replacements = {lib: LOADER, **replacements}
        host: dict[str, Any] = _rewrite(json.loads(json.dumps(cap.host)), replacements)
    host["env"] = {k: v for k, v in host["env"].items() if k not in _TREE}
    del host["variables"]  # a built host lists none: its replay clears every one it knows
    for record in host["records"]:
        if record["channel"] == "dist" and record["key"] == ["version", "torch"]:
            record["answers"] = [{"v": torch}]
        if record["channel"] == "nvml" and record["key"] == ["load"]:
            record["answers"] = [{"v": {"$map": NO_NVML}}]
    host["created"] = CREATED
    host["summary"].update(driver=driver, python=python, machine="x86_64", system="Linux")
    host["summary"]["versions"].update(torch=torch, accelplat=host["accelplat_version"])
    contents = provenance.rstrip() + "\n\n" + bundle_contents(host)
    with replaying(parse_bundle(bundle_bytes(host, None, contents), source=source)):
        info = collect_info()
    return bundle_bytes(host, info, contents)
