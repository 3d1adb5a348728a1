"""A fake sysfs (and /dev) tree of real files, laid out as the amdgpu, KFD, xe and i915 drivers do.

Layout written under ``root``::

    sys/devices/pci0000:00/<bdf>/            the PCI device: vendor, device, uevent, driver ->,
                                             mem_info_vram_total/used (amdgpu), product_name,
                                             drm/cardN, drm/renderD<minor>, tile<N> (xe)
    sys/bus/pci/drivers/<driver>/            what each device's ``driver`` link points at
    sys/class/drm/cardN/device -> <bdf dir>  one directory per card (gt/gt<N> for i915)
    sys/class/drm/cardN-DP-1, renderD128     connectors and render nodes (to be ignored)
    sys/devices/platform/amdgpu_xcp.K/drm/   compute partitions 1..N-1 of a partitioned AMD GPU:
                                             cardM and renderD<minor> of their own DRM device
    sys/class/kfd/kfd/topology/nodes/N/      gpu_id, properties, name, mem_banks/0/properties
    sys/class/kfd/kfd/proc/<pid>/vram_<id>   per-process VRAM
    dev/kfd, dev/dri/renderD<minor>          device nodes (plain files); ``open_device`` answers
                                             as ``open(O_RDWR)`` would (an errno per node)

Facts followed: attribute files end with a newline; ``vendor`` is ``0x1002``/``0x8086``/``0x10de``;
the KFD ``properties`` file is ``key value`` lines with ``location_id`` = bus << 8 | dev << 3 |
fn, ``domain``, ``drm_render_minor``, ``unique_id`` and ``simd_count`` (0 for CPU nodes, whose
``gpu_id`` is 0).

Partitioned AMD GPUs (MI300/MI355 in DPX/QPX/CPX; amdgpu ``kfd_topology_add_device``,
``amdgpu_xcp.c``, ``amdxcp/amdgpu_xcp_drv.c``): one KFD node per compute partition; when a card
has more than one, the partition id is ORed into ``location_id``; partition 0 shares the card's
DRM device (its render node is under the card's ``device/drm``), partitions 1..N-1 get DRM devices
of their own on ``amdgpu_xcp`` platform devices, which have no PCI parent and no ``vendor`` file.
The KFD memory bank of each partition (``mem_banks/0/properties`` ``size_in_bytes``) is what
``amdgpu_amdkfd_xcp_memory_size`` gives it: the memory partition's size divided by the compute
partitions sharing it (the default CAPPING_EVEN mode); sysfs ``mem_info_vram_*`` stay card-wide.
Every partition carries the card's ``unique_id``, and the banks are heap type 1 (FB_PUBLIC), as
the public KFD dumps of MI300X and MI308X hosts in CPX mode show (``tests/hosts/_dumps.py``).

APUs whose kernel prefers GTT for KFD (``apu_prefer_gtt``: VRAM carve-out smaller than GTT,
amdgpu_ttm.c): ``mem_info_vram_total`` is the BIOS carve-out while the KFD bank reports the TTM
page limit (``amdgpu_amdkfd_get_local_mem_info``), which is what HIP calls the device's memory.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
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
    render_minors: list[int] = field(default_factory=list)
    bank_bytes: list[int] = field(default_factory=list)

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
        self._next_xcp = 0
        self._next_xcp_card = 64
        self.open_errors: dict[str, int] = {}

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

    def deny_device(self, name: str, code: int) -> None:
        """Make opening ``/dev/<name>`` fail with ``code`` (``EPERM``: a device-cgroup deny;
        ``EACCES``: the user is not in the render/video group)."""
        self.open_errors[name] = code

    def open_device(self, path: str | os.PathLike[str]) -> None:
        """Answer as ``open(path, O_RDWR)`` on this tree's ``/dev`` would: the errno set by
        :meth:`deny_device`, ``ENOENT`` for a missing node, else success."""
        rel = os.path.relpath(os.fspath(path), self.dev)
        if rel in self.open_errors:
            code = self.open_errors[rel]
            raise OSError(code, os.strerror(code), os.fspath(path))
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(path))

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
        partition: int | None = None,
        bank_bytes: int | None = None,
        private_heap: bool = True,
        gfx_target_version: int | None = 90402,
    ) -> int:
        """A GPU node of the KFD topology.

        Args:
            partition: The compute partition's id, ORed into ``location_id`` (the kernel does so
                when a card has more than one partition); ``None`` for an unpartitioned card.
            bank_bytes: ``size_in_bytes`` of its memory bank (``None``: no ``mem_banks``).
            private_heap: Heap type 2 (FB_PRIVATE: part of the memory is not CPU-visible) rather
                than 1 (FB_PUBLIC, e.g. an APU's GTT-backed memory).
            gfx_target_version: The LLVM target as KFD encodes it (90402 is an MI300X's gfx942);
                ``None`` leaves the property out.
        """
        node = self._next_node
        self._next_node += 1
        domain, bus, dev, fn = _bdf_parts(pci)
        location = (bus << 8) | (dev << 3) | fn
        if partition is not None:
            location |= partition
        lines = [
            "cpu_cores_count 0",
            f"simd_count {simd_count}",
            f"mem_banks_count {0 if bank_bytes is None else 1}",
            f"location_id {location}",
        ]
        if with_domain:
            lines.append(f"domain {domain}")
        if render_minor is not None:
            lines.append(f"drm_render_minor {render_minor}")
        lines += [f"unique_id {unique_id}", "num_xcc 8"]
        if gfx_target_version is not None:
            lines.append(f"gfx_target_version {gfx_target_version}")
        d = self._topology() / str(node)
        _write(d / "gpu_id", f"{gpu_id}\n")
        _write(d / "properties", "\n".join(lines) + "\n")
        _write(d / "name", f"{name}\n")
        if bank_bytes is not None:
            heap = 2 if private_heap else 1
            _write(
                d / "mem_banks" / "0" / "properties",
                f"heap_type {heap}\nsize_in_bytes {bank_bytes}\nflags 0\nwidth 8192\n"
                f"mem_clk_max 1300\n",
            )
        return node

    def add_kfd_node_raw(
        self,
        properties: str,
        *,
        gpu_id: int,
        name: str = "",
        banks: tuple[str, ...] = (),
        used_memory: int | None = None,
    ) -> int:
        """A KFD topology node whose files hold the given text verbatim (a public dump's).

        Args:
            properties: The node's ``properties`` file, as dumped.
            gpu_id: Its ``gpu_id`` (0 for a CPU node).
            name: Its ``name`` file (``"ip discovery"`` on MI300-class GPU nodes).
            banks: The ``mem_banks/<i>/properties`` files, in order.
            used_memory: ``mem_banks/0/used_memory``, when the dump has one.
        """
        node = self._next_node
        self._next_node += 1
        d = self._topology() / str(node)
        _write(d / "gpu_id", f"{gpu_id}\n")
        _write(d / "properties", properties if properties.endswith("\n") else properties + "\n")
        _write(d / "name", f"{name}\n")
        for i, bank in enumerate(banks):
            _write(d / "mem_banks" / str(i) / "properties", bank)
        if used_memory is not None and banks:
            _write(d / "mem_banks" / "0" / "used_memory", f"{used_memory}\n")
        return node

    def add_xcp_device(self, index: int, card: int, minor: int) -> None:
        """A compute partition's DRM device ``cardN``/``renderD<minor>`` on platform device
        ``amdgpu_xcp.<index>`` (numbers as a dump shows them)."""
        platform = self.sys / "devices" / "platform" / f"amdgpu_xcp.{index}"
        (platform / "drm" / f"card{card}").mkdir(parents=True, exist_ok=True)
        (platform / "drm" / f"renderD{minor}").mkdir(parents=True, exist_ok=True)
        _write(platform / "uevent", "DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp\n")
        card_dir = self.card_dir(card)
        card_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(platform, card_dir / "device")
        _write(card_dir / "dev", f"226:{card}\n")
        self.add_render_entry(minor)

    def _add_xcp_device(self) -> tuple[int, int]:
        """A DRM device on an ``amdgpu_xcp`` platform device; returns (card, render minor)."""
        index = self._next_xcp
        self._next_xcp += 1
        card = self._next_xcp_card
        self._next_xcp_card += 1
        minor = 128 + card
        platform = self.sys / "devices" / "platform" / f"amdgpu_xcp.{index}"
        (platform / "drm" / f"card{card}").mkdir(parents=True, exist_ok=True)
        (platform / "drm" / f"renderD{minor}").mkdir(parents=True, exist_ok=True)
        _write(platform / "uevent", "DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp\n")
        card_dir = self.card_dir(card)
        card_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(platform, card_dir / "device")
        _write(card_dir / "dev", f"226:{card}\n")
        self.add_render_entry(minor)
        return card, minor

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
        memory_partitions: int = 1,
        device_id: int = 0x74A1,
        bank_bytes: int | None = None,
        gtt_total: int | None = None,
        gfx_target_version: int | None = 90402,
        shared_unique_id: bool = True,
    ) -> AmdGpu:
        """An amdgpu card with VRAM files and (unless ``kfd=False``) its KFD node(s).

        Args:
            partitions: Compute partitions (1 SPX, 2 DPX, 4 QPX, 8 CPX): one KFD node each, laid
                out as the kernel does (see the module docstring).
            memory_partitions: Memory partitions (NPS mode); each compute partition's KFD bank is
                ``vram_total / memory_partitions / (partitions / memory_partitions)``.
            bank_bytes: The KFD bank size of an unpartitioned card (default ``vram_total``); an
                APU that prefers GTT reports its TTM limit here.
            gtt_total: Writes ``mem_info_gtt_total``/``_used`` when given.
            shared_unique_id: Every partition carries the card's ``unique_id``, as the KFD
                topologies of MI300X and MI308X hosts in CPX mode show (ROCm/k8s-device-plugin
                test data); ``False`` gives each its own.
        """
        minor = 128 + card if render_minor is None else render_minor
        pci_dir = self._pci_device(pci, vendor=AMD, device_id=device_id, driver="amdgpu", card=card)
        (pci_dir / "drm" / f"renderD{minor}").mkdir(parents=True, exist_ok=True)
        _write(pci_dir / "mem_info_vram_total", f"{vram_total}\n")
        _write(pci_dir / "mem_info_vram_used", f"{vram_used}\n")
        _write(pci_dir / "mem_info_vis_vram_total", f"{vram_total}\n")
        if gtt_total is not None:
            _write(pci_dir / "mem_info_gtt_total", f"{gtt_total}\n")
            _write(pci_dir / "mem_info_gtt_used", "0\n")
        if partitions > 1 or memory_partitions > 1:
            mode = {1: "SPX", 2: "DPX", 4: "QPX", 8: "CPX"}.get(partitions, "CPX")
            _write(pci_dir / "current_compute_partition", f"{mode}\n")
            _write(pci_dir / "current_memory_partition", f"NPS{memory_partitions}\n")
        if product_name is not None:
            _write(pci_dir / "product_name", f"{product_name}\n")
        result = AmdGpu(card, pci, minor, [], [], [])
        if not kfd:
            return result
        if partitions > 1:
            share = vram_total // memory_partitions // max(1, partitions // memory_partitions)
            share -= share % 4096  # ALIGN_DOWN(…, PAGE_SIZE)
        else:
            share = vram_total if bank_bytes is None else bank_bytes
        for p in range(partitions):
            gid = (gpu_id if gpu_id is not None else 40000 + 977 * card) + p
            uid = (unique_id if unique_id is not None else 0x5A1B2C3D4E5F6000 + card) + (
                0 if shared_unique_id else p << 8
            )
            part_minor = minor if p == 0 else self._add_xcp_device()[1]
            result.nodes.append(
                self.add_kfd_gpu_node(
                    gpu_id=gid,
                    pci=pci,
                    render_minor=part_minor,
                    unique_id=uid,
                    partition=p if partitions > 1 else None,
                    bank_bytes=share,
                    private_heap=False,  # FB_PUBLIC on large-BAR cards, as dumped
                    gfx_target_version=gfx_target_version,
                )
            )
            result.gpu_ids.append(gid)
            result.unique_ids.append(uid)
            result.render_minors.append(part_minor)
            result.bank_bytes.append(share)
        return result

    def add_amd_apu(
        self,
        card: int,
        *,
        pci: str = "0000:c4:00.0",
        carveout: int = 512 * 1024**2,
        gtt_limit: int = 62 * 1024**3,
        vram_used: int = 300 * 1024**2,
        product_name: str | None = None,
        device_id: int = 0x1586,
    ) -> AmdGpu:
        """An APU whose kernel prefers GTT for KFD (Strix Halo, Ryzen iGPUs, MI300A).

        ``mem_info_vram_total`` is the BIOS carve-out; the KFD bank (heap type FB_PUBLIC) is the
        TTM page limit, the memory HIP reports.
        """
        return self.add_amd_gpu(
            card,
            pci=pci,
            vram_total=carveout,
            vram_used=vram_used,
            product_name=product_name,
            device_id=device_id,
            bank_bytes=gtt_limit,
            gtt_total=gtt_limit,
        )

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
