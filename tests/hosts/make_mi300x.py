"""Build the hand-built MI300X bundle ``amd-mi300x-x2.tar.gz`` from vendor facts.

No MI300X is at hand, so this host is assembled rather than captured: the fake sysfs and /dev
tree of ``tests/fakes/sysfs.py`` (laid out as amdgpu and KFD lay them out: two MI300X cards,
192 GiB of VRAM each, KFD nodes with ``gfx_target_version 90402``, render nodes and
``/dev/kfd``) is captured with ``accelplat capture``'s own recorder (:mod:`tests.hosts._shape`).
``python -m tests.hosts.make_amd_intel`` rebuilds it with the other AMD and Intel hosts; alone::

    python -m tests.hosts.make_mi300x
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.fakes.sysfs import FakeSysfs
from tests.hosts._shape import build_bundle

GIB = 1024**3
MIB = 1024**2
OUT = Path(__file__).with_name("amd-mi300x-x2.tar.gz")
TORCH = "2.7.1+rocm6.3"
AMDGPU = "6.12.12"
"""An amdgpu DKMS module version, in the form /sys/module/amdgpu/version prints it."""
PROVENANCE = """\
How this host was made: built from vendor facts (not captured on the machine).

Where its files come from:
  * two MI300X in SPX mode, written from the amdgpu and KFD driver source (tests/fakes/sysfs.py)
"""


def _populate(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    fs.add_kfd_cpu_node()
    first = fs.add_amd_gpu(0, pci="0000:0c:00.0", vram_total=192 * GIB, vram_used=3 * GIB)
    fs.add_amd_gpu(1, pci="0000:22:00.0", vram_total=192 * GIB, vram_used=282 * MIB)
    fs.add_dev_nodes([128, 129])
    (root / "sys" / "module" / "amdgpu").mkdir(parents=True)
    (root / "sys" / "module" / "amdgpu" / "version").write_text(f"{AMDGPU}\n")
    fs.add_kfd_process(4242, {first.gpu_ids[0]: 3 * GIB - 282 * MIB})
    return {}


def build() -> bytes:
    """Return the bundle's bytes (reproducible: no time, no temporary path inside)."""
    return build_bundle(
        _populate,
        source=OUT.name,
        torch=TORCH,
        driver=f"amdgpu {AMDGPU} (hand-built from vendor facts)",
        provenance=PROVENANCE,
    )


if __name__ == "__main__":
    data = build()
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data)} bytes)")
