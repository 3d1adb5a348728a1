"""Build the hand-built MI300X bundle ``amd-mi300x-x2.tar.gz`` from vendor facts.

No MI300X is at hand, so this host is assembled rather than captured: the fake sysfs and /dev
tree of ``tests/fakes/sysfs.py`` (laid out as amdgpu and KFD lay them out: two MI300X cards,
192 GiB of VRAM each, KFD nodes with ``gfx_target_version 90402``, render nodes and
``/dev/kfd``) is captured with ``accelplat capture``'s own recorder, every path of the temporary
tree is rewritten to ``/sys`` and ``/dev``, the installed torch is set to a ROCm build, and the
golden ``info.json`` is what replaying the result prints. Run it again after a change to the
fake tree or to the ROCm backend's reads::

    python -m tests.hosts.make_mi300x
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from accelplat._capture import bundle_contents, capture
from accelplat._describe import collect_info
from accelplat.replay import parse_bundle, replaying
from accelplat.replay._bundle import bundle_bytes
from tests.fakes.sysfs import FakeSysfs

GIB = 1024**3
MIB = 1024**2
OUT = Path(__file__).with_name("amd-mi300x-x2.tar.gz")
TORCH = "2.7.1+rocm6.3"
AMDGPU = "6.12.12"
"""An amdgpu DKMS module version, in the form /sys/module/amdgpu/version prints it."""
NO_NVML = {
    "present": False,
    "reason": "NVML unavailable: libnvidia-ml.so.1 was not found: no NVIDIA driver is installed, "
    "or its library is not on the loader path (NVMLError_LibraryNotFound)",
    "vendor_error": "NVMLError_LibraryNotFound",
}
"""What an AMD host without the NVIDIA driver answers for NVML."""
_BLOCKED = ("pynvml", "amdsmi", "torch")
_CLEARED = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ACCELPLAT_PLATFORM",
    "ACCELPLAT_LEVEL_ZERO_LIB",
)


@contextmanager
def _isolated(root: Path) -> Iterator[None]:
    saved_env = {
        k: os.environ.get(k) for k in (*_CLEARED, "ACCELPLAT_SYSFS_ROOT", "ACCELPLAT_DEV_ROOT")
    }
    saved_mods = {k: sys.modules.get(k, ...) for k in _BLOCKED}
    for name in _CLEARED:
        os.environ.pop(name, None)
    os.environ["ACCELPLAT_SYSFS_ROOT"] = str(root / "sys")
    os.environ["ACCELPLAT_DEV_ROOT"] = str(root / "dev")
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


def _rewrite(value: Any, prefix: str) -> Any:
    if isinstance(value, str):
        return value.replace(prefix, "")
    if isinstance(value, list):
        return [_rewrite(v, prefix) for v in value]
    if isinstance(value, dict):
        return {_rewrite(k, prefix): _rewrite(v, prefix) for k, v in value.items()}
    return value


def build() -> bytes:
    """Return the bundle's bytes (reproducible: no time, no temporary path inside)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fs = FakeSysfs(root)
        fs.add_kfd_cpu_node()
        first = fs.add_amd_gpu(0, pci="0000:0c:00.0", vram_total=192 * GIB, vram_used=3 * GIB)
        fs.add_amd_gpu(1, pci="0000:22:00.0", vram_total=192 * GIB, vram_used=282 * MIB)
        fs.add_dev_nodes([128, 129])
        (root / "sys" / "module" / "amdgpu").mkdir(parents=True)
        (root / "sys" / "module" / "amdgpu" / "version").write_text(f"{AMDGPU}\n")
        fs.add_kfd_process(4242, {first.gpu_ids[0]: 3 * GIB - 282 * MIB})
        with _isolated(root):
            cap = capture(samples=2, interval_s=0.0, sleep=lambda _: None)
        host: dict[str, Any] = _rewrite(json.loads(json.dumps(cap.host)), str(root))
    host["env"] = {
        k: v
        for k, v in host["env"].items()
        if k not in ("ACCELPLAT_SYSFS_ROOT", "ACCELPLAT_DEV_ROOT")
    }
    for record in host["records"]:
        if record["channel"] == "dist" and record["key"] == ["version", "torch"]:
            record["answers"] = [{"v": TORCH}]
        if record["channel"] == "nvml" and record["key"] == ["load"]:
            record["answers"] = [{"v": {"$map": NO_NVML}}]
    host["created"] = "2026-01-01T00:00:00+00:00"
    host["summary"].update(
        driver=f"amdgpu {AMDGPU} (hand-built from vendor facts)",
        python="3.12.0",
        machine="x86_64",
        system="Linux",
    )
    host["summary"]["versions"].update(torch=TORCH, accelplat=host["accelplat_version"])
    contents = bundle_contents(host)
    with replaying(parse_bundle(bundle_bytes(host, None, contents), source=OUT.name)):
        info = collect_info()
    return bundle_bytes(host, info, contents)


if __name__ == "__main__":
    data = build()
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data)} bytes)")
