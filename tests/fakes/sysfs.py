"""A fake sysfs (and /dev) tree of real files, laid out as the amdgpu, KFD, xe and i915 drivers do.

Layout written under ``root``::

    sys/devices/pci0000:00/<bdf>/            the PCI device: vendor, device, uevent, driver ->,
                                             mem_info_vram_total/used (amdgpu), product_name,
                                             drm/cardN, drm/renderD<minor>, tile<N> (xe)
    sys/bus/pci/drivers/<driver>/            what each device's ``driver`` link points at
    sys/class/drm/cardN/device -> <bdf dir>  one directory per card (gt/gt<N> for i915)
    sys/class/drm/cardN-DP-1, renderD128     connectors and render nodes (to be ignored)
    sys/class/kfd/kfd/topology/nodes/N/      gpu_id, properties, name
    sys/class/kfd/kfd/proc/<pid>/vram_<id>   per-process VRAM
    dev/kfd, dev/dri/renderD<minor>          device nodes (plain files)

Facts followed: attribute files end with a newline; ``vendor`` is ``0x1002``/``0x8086``/``0x10de``;
the KFD ``properties`` file is ``key value`` lines with ``location_id`` = bus << 8 | dev << 3 |
fn, ``domain``, ``drm_render_minor``, ``unique_id`` and ``simd_count`` (0 for CPU nodes, whose
``gpu_id`` is 0).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

AMD = 0x1002
INTEL = 0x8086
NVIDIA = 0x10DE


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _bdf_parts(bdf: str) -> tuple[int, int, int, int]:
    domain, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


@dataclass
class AmdGpu:
    """What :meth:`FakeSysfs.add_amd_gpu` created."""

    card: int
    pci: str
    render_minor: int
    nodes: list[int]
    gpu_ids: list[int]
    unique_ids: list[int]

    @property
    def gpu_id(self) -> int:
        return self.gpu_ids[0]

    @property
    def uuid(self) -> str:
        return f"GPU-{self.unique_ids[0]:016x}"


class FakeSysfs:
    """Builder of a fake ``/sys`` and ``/dev`` under a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys = root / "sys"
        self.dev = root / "dev"
        self.sys.mkdir(parents=True, exist_ok=True)
        (self.sys / "class" / "drm").mkdir(parents=True, exist_ok=True)
        self._next_node = 0
        self._kfd = False

    # -- generic pieces -----------------------------------------------------------------------

    def pci_dir(self, bdf: str) -> Path:
        return self.sys / "devices" / "pci0000:00" / bdf

    def card_dir(self, card: int) -> Path:
        return self.sys / "class" / "drm" / f"card{card}"

    def device_dir(self, card: int) -> Path:
        return self.card_dir(card) / "device"

    def _pci_device(
        self, bdf: str, *, vendor: int, device_id: int, driver: str | None, card: int
    ) -> Path:
        pci = self.pci_dir(bdf)
        pci.mkdir(parents=True, exist_ok=True)
        _write(pci / "vendor", f"0x{vendor:04x}\n")
        _write(pci / "device", f"0x{device_id:04x}\n")
        uevent = f"PCI_ID={vendor:04X}:{device_id:04X}\nPCI_SLOT_NAME={bdf}\n"
        if driver:
            uevent = f"DRIVER={driver}\n" + uevent
            target = self.sys / "bus" / "pci" / "drivers" / driver
            target.mkdir(parents=True, exist_ok=True)
            os.symlink(target, pci / "driver")
        _write(pci / "uevent", uevent)
        (pci / "drm" / f"card{card}").mkdir(parents=True, exist_ok=True)
        card_dir = self.card_dir(card)
        card_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(pci, card_dir / "device")
        _write(card_dir / "dev", f"226:{card}\n")
        return pci

    def add_connector(self, name: str = "card0-DP-1") -> None:
        """A display connector entry (``cardN-<connector>``), which is not a card."""
        d = self.sys / "class" / "drm" / name
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "status", "disconnected\n")

    def add_render_entry(self, minor: int) -> None:
        """A ``renderD<minor>`` entry in ``class/drm``, which is not a card."""
        d = self.sys / "class" / "drm" / f"renderD{minor}"
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "dev", f"226:{minor}\n")

    def add_dev_nodes(self, minors: list[int], *, kfd: bool = True) -> None:
        """Device nodes in the fake ``/dev`` (what a container was given)."""
        (self.dev / "dri").mkdir(parents=True, exist_ok=True)
        for minor in minors:
            (self.dev / "dri" / f"renderD{minor}").write_text("")
        if kfd:
            (self.dev / "kfd").write_text("")

    # -- AMD ----------------------------------------------------------------------------------

    def _topology(self) -> Path:
        nodes = self.sys / "class" / "kfd" / "kfd" / "topology" / "nodes"
        nodes.mkdir(parents=True, exist_ok=True)
        (self.sys / "class" / "kfd" / "kfd" / "proc").mkdir(parents=True, exist_ok=True)
        self._kfd = True
        return nodes

    def add_kfd_cpu_node(self) -> int:
        """A CPU node of the KFD topology (``gpu_id`` 0)."""
        node = self._next_node
        self._next_node += 1
        d = self._topology() / str(node)
        _write(d / "gpu_id", "0\n")
        _write(d / "properties", "cpu_cores_count 64\nsimd_count 0\nlocation_id 0\ndomain 0\n")
        _write(d / "name", "\n")
        return node

    def add_kfd_gpu_node(
        self,
        *,
        gpu_id: int,
        pci: str,
        render_minor: int | None,
        unique_id: int,
        name: str = "gfx942",
        simd_count: int = 1216,
        with_domain: bool = True,
    ) -> int:
        """A GPU node of the KFD topology."""
        node = self._next_node
        self._next_node += 1
        domain, bus, dev, fn = _bdf_parts(pci)
        lines = [
            "cpu_cores_count 0",
            f"simd_count {simd_count}",
            f"location_id {(bus << 8) | (dev << 3) | fn}",
        ]
        if with_domain:
            lines.append(f"domain {domain}")
        if render_minor is not None:
            lines.append(f"drm_render_minor {render_minor}")
        lines += [f"unique_id {unique_id}", "num_xcc 8"]
        d = self._topology() / str(node)
        _write(d / "gpu_id", f"{gpu_id}\n")
        _write(d / "properties", "\n".join(lines) + "\n")
        _write(d / "name", f"{name}\n")
        return node

    def add_amd_gpu(
        self,
        card: int,
        *,
        pci: str,
        vram_total: int,
        vram_used: int = 0,
        render_minor: int | None = None,
        gpu_id: int | None = None,
        unique_id: int | None = None,
        product_name: str | None = "AMD Instinct MI300X",
        kfd: bool = True,
        partitions: int = 1,
        device_id: int = 0x74A1,
    ) -> AmdGpu:
        """An amdgpu card with VRAM files and (unless ``kfd=False``) its KFD node(s).

        ``partitions`` > 1 adds that many KFD nodes for the card (compute partitions); the first
        uses the card's render node, the others render nodes of their own partition devices.
        """
        minor = 128 + card if render_minor is None else render_minor
        pci_dir = self._pci_device(pci, vendor=AMD, device_id=device_id, driver="amdgpu", card=card)
        (pci_dir / "drm" / f"renderD{minor}").mkdir(parents=True, exist_ok=True)
        _write(pci_dir / "mem_info_vram_total", f"{vram_total}\n")
        _write(pci_dir / "mem_info_vram_used", f"{vram_used}\n")
        _write(pci_dir / "mem_info_vis_vram_total", f"{vram_total}\n")
        if product_name is not None:
            _write(pci_dir / "product_name", f"{product_name}\n")
        nodes: list[int] = []
        gpu_ids: list[int] = []
        unique_ids: list[int] = []
        if kfd:
            for p in range(partitions):
                gid = (gpu_id if gpu_id is not None else 40000 + 977 * card) + p
                uid = (unique_id if unique_id is not None else 0x5A1B2C3D4E5F6000 + card) + (p << 8)
                part_minor = minor if p == 0 else 200 + 8 * card + p
                nodes.append(
                    self.add_kfd_gpu_node(
                        gpu_id=gid, pci=pci, render_minor=part_minor, unique_id=uid
                    )
                )
                gpu_ids.append(gid)
                unique_ids.append(uid)
        return AmdGpu(card, pci, minor, nodes, gpu_ids, unique_ids)

    def set_vram(self, card: int, *, used: int | None = None, total: int | None = None) -> None:
        if used is not None:
            _write(self.device_dir(card) / "mem_info_vram_used", f"{used}\n")
        if total is not None:
            _write(self.device_dir(card) / "mem_info_vram_total", f"{total}\n")

    def write_attr(self, card: int, name: str, text: str) -> None:
        """Overwrite one attribute of a card's device with raw text (truncated, garbage…)."""
        _write(self.device_dir(card) / name, text)

    def replace_with_directory(self, card: int, name: str) -> None:
        """Put a directory where an attribute file should be (an unreadable attribute)."""
        path = self.device_dir(card) / name
        path.unlink()
        path.mkdir()

    def remove_card(self, card: int) -> None:
        """The card disappears (hot-unplug, driver unbind)."""
        pci = Path(os.path.realpath(self.device_dir(card)))
        shutil.rmtree(self.card_dir(card))
        shutil.rmtree(pci)

    def add_kfd_process(self, pid: int, vram: dict[int, int]) -> None:
        """A process known to KFD, with its VRAM per ``gpu_id``."""
        d = self.sys / "class" / "kfd" / "kfd" / "proc" / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "pasid", "32770\n")
        for gid, used in vram.items():
            _write(d / f"vram_{gid}", f"{used}\n")
            _write(d / f"sdma_{gid}", "0\n")

    # -- Intel and others ---------------------------------------------------------------------

    def add_intel_gpu(
        self,
        card: int,
        *,
        pci: str,
        driver: str = "xe",
        tiles: int = 1,
        device_id: int = 0xE20B,
    ) -> Path:
        """An Intel GPU bound to ``driver`` (xe: ``device/tile<N>``; i915: ``cardN/gt/gt<N>``)."""
        pci_dir = self._pci_device(pci, vendor=INTEL, device_id=device_id, driver=driver, card=card)
        if driver == "xe":
            for t in range(tiles):
                (pci_dir / f"tile{t}" / f"gt{t}").mkdir(parents=True, exist_ok=True)
        elif driver == "i915":
            gts = tiles if pci != "0000:00:02.0" else 2  # an integrated GPU lists its media GT
            for t in range(gts):
                (self.card_dir(card) / "gt" / f"gt{t}").mkdir(parents=True, exist_ok=True)
        return pci_dir

    def add_other_gpu(
        self, card: int, *, pci: str, vendor: int = NVIDIA, driver: str = "nvidia"
    ) -> Path:
        """A card of another vendor (NVIDIA by default)."""
        return self._pci_device(pci, vendor=vendor, device_id=0x2335, driver=driver, card=card)
