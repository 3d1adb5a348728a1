"""Build the AMD and Intel bundles of ``tests/hosts/`` from public dumps and vendor facts.

No AMD or Intel GPU is at hand, so these hosts are shaped, not captured: each writes a fake
``/sys`` and ``/dev`` (and, for Intel, a fake Level Zero loader compiled from C) whose files are
public dumps where one exists, and vendor facts where none does, then records it with accelplat's
own capture (:mod:`tests.hosts._shape`). ``CONTENTS.txt`` in each bundle and
``tests/hosts/README.md`` say where every file came from. Run it again after a change to a
backend's reads (the goldens are what replay prints then)::

    python -m tests.hosts.make_amd_intel            # every AMD and Intel bundle
    python -m tests.hosts.make_amd_intel NAME ...   # some of them (file names without .tar.gz)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.fakes import levelzero as lz
from tests.fakes.sysfs import FakeSysfs
from tests.hosts import _dumps as dumps
from tests.hosts import make_mi300x
from tests.hosts._shape import build_bundle

HERE = Path(__file__).resolve().parent
GIB = 1024**3
MIB = 1024**2
ROCM_TORCH = "2.7.1+rocm6.3"
XPU_TORCH = "2.8.0+xpu"
ISSUES = "https://github.com/ROCm/ROCm/issues"
K8S_157 = "https://github.com/ROCm/k8s-device-plugin/issues/157"
K8S_108 = "https://github.com/ROCm/k8s-device-plugin/pull/108"
ROCM_4750 = f"{ISSUES}/4750"
SHAPED = "shaped from a public dump"
BUILT = "built from vendor facts"


@dataclass(frozen=True)
class Host:
    """One bundle: its file name, how it is made, and where each of its files came from."""

    name: str
    label: str  # SHAPED or BUILT
    populate: Callable[[Path], Mapping[str, str]]
    torch: str
    driver: str
    sources: tuple[str, ...]  # "what: where (date)" lines

    def provenance(self) -> str:
        lines = [f"How this host was made: {self.label} (not captured on the machine).", ""]
        lines += ["Where its files come from:", *(f"  * {s}" for s in self.sources)]
        return "\n".join(lines)


def _cards_with_partitions(
    fs: FakeSysfs,
    cards: list[tuple[str, int]],
    *,
    device_id: int,
    product: str,
    vram_total: int,
    vram_used: list[int],
    partitions: int,
) -> list[int]:
    """The PCI cards (and their ``amdgpu_xcp`` partition devices) of a partitioned host.

    ``cards`` are (PCI address, first render minor). amdgpu gives every card MAX_XCP = 8 DRM
    devices whatever the mode (amdgpu_xcp.c): the card's own and seven ``amdgpu_xcp.K``
    platform devices, which is why each card's render minors step by 8 in the dumps. Card
    numbers follow ROCm/k8s-device-plugin#157 (``amdgpu_xcp.39`` is ``card46``: card 0 is the
    board's display adapter, each GPU takes eight).
    """
    minors: list[int] = []
    for c, (pci, first) in enumerate(cards):
        card = 8 * c + 1
        fs.add_amd_gpu(
            card,
            pci=pci,
            vram_total=vram_total,
            vram_used=vram_used[c],
            render_minor=first,
            product_name=product,
            device_id=device_id,
            kfd=False,
        )
        mode = {2: "DPX", 4: "QPX", 8: "CPX"}[partitions]
        fs.write_attr(card, "current_compute_partition", f"{mode}\n")
        fs.write_attr(card, "current_memory_partition", "NPS1\n")
        fs.add_render_entry(first)
        minors.append(first)
        for j in range(1, 8):
            fs.add_xcp_device(7 * c + j - 1, card + j, first + j)
            minors.append(first + j)
    return minors


def _bmc_display(fs: FakeSysfs) -> None:
    # card0 of a GPU server: the BMC's display adapter (ASPEED, 0x1a03), which is no GPU.
    fs.add_other_gpu(0, pci="0000:02:00.0", vendor=0x1A03, driver="ast")


def _mi300x_cpx(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    _bmc_display(fs)
    for cpu in dumps.MI300X_CPX_CPU_NODES:
        fs.add_kfd_node_raw(dumps.MI300X_CPX_CPU.format(**cpu), gpu_id=0)
    minors = _cards_with_partitions(
        fs,
        [("0000:05:00.0", 128), ("0000:27:00.0", 136)],
        device_id=0x74A1,
        product="AMD Instinct MI300X",
        vram_total=206141652992,
        vram_used=[297771008, 297771008],
        partitions=8,
    )
    for i, node in enumerate(dumps.MI300X_CPX_NODES):
        # The dump keeps only properties: gpu_id, name and the bank are written from facts.
        k = i % 8
        bank = 24 * GIB - (16 * MIB if k == 7 else 0)
        fs.add_kfd_node_raw(
            dumps.properties(dumps.MI300X_CPX_GPU, node),
            gpu_id=40000 + 977 * i,
            name="ip discovery",
            banks=(dumps.MI308X_BANK.format(size=bank),),
        )
    fs.add_dev_nodes(minors)
    _amdgpu_version(root)
    return {}


def _mi308x_cpx(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    _bmc_display(fs)
    for i, bank in enumerate(dumps.MI308X_CPX_CPU_BANKS):
        cpu = dumps.MI308X_CPX_CPU.format(core_base=128 * i)
        fs.add_kfd_node_raw(cpu, gpu_id=0, banks=(bank,))
    used = [n.used_memory for n in dumps.MI308X_CPX_NODES[::4]]
    minors = _cards_with_partitions(
        fs,
        [("0000:0a:00.0", 128), ("0000:80:00.0", 136)],
        device_id=0x74A2,
        product="AMD Instinct MI308X",
        vram_total=206141652992,
        vram_used=used,
        partitions=4,
    )
    for node in dumps.MI308X_CPX_NODES:
        fs.add_kfd_node_raw(
            dumps.properties(dumps.MI308X_CPX_GPU, node.lines),
            gpu_id=node.gpu_id,
            name="ip discovery",
            banks=(dumps.MI308X_BANK.format(size=node.bank),),
            used_memory=node.used_memory,
        )
    # Card 0 uses 2,607,050,752 bytes more than the idle cards (used_memory): one process.
    first = dumps.MI308X_CPX_NODES[0]
    fs.add_kfd_process(4242, {first.gpu_id: first.used_memory - used[1]})
    fs.add_dev_nodes(minors)
    _amdgpu_version(root)
    return {}


def _strix_halo(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    fs.add_kfd_node_raw("cpu_cores_count 32\nsimd_count 0\nlocation_id 0\ndomain 0\n", gpu_id=0)
    fs.add_amd_gpu(
        1,
        pci="0000:c6:00.0",
        vram_total=536870912,
        vram_used=128 * MIB,
        render_minor=128,
        product_name=None,
        device_id=0x1586,
        kfd=False,
        gtt_total=118111600640,
    )
    fs.add_kfd_node_raw(
        "\n".join(
            [
                "cpu_cores_count 0",
                "simd_count 80",
                "mem_banks_count 1",
                "wave_front_size 32",
                "simd_per_cu 2",
                "gfx_target_version 110501",
                "vendor_id 4098",
                "device_id 5510",
                f"location_id {0xC6 << 8}",
                "domain 0",
                "drm_render_minor 128",
                "unique_id 0",
                "num_xcc 1",
            ]
        ),
        gpu_id=6412,
        name="ip discovery",
        banks=("heap_type 1\nsize_in_bytes 118111600640\nflags 0\nwidth 256\nmem_clk_max 8000\n",),
    )
    fs.add_kfd_process(4242, {6412: 6 * GIB})
    fs.add_dev_nodes([128])
    _amdgpu_version(root)
    return {}


def _rx7900xtx(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    fs.add_kfd_node_raw("cpu_cores_count 16\nsimd_count 0\nlocation_id 0\ndomain 0\n", gpu_id=0)
    fs.add_amd_gpu(
        1,
        pci="0000:86:00.0",
        vram_total=25753026560,
        vram_used=1207959552,
        render_minor=128,
        product_name="AMD Radeon RX 7900 XTX",
        device_id=0x744C,
        kfd=False,
    )
    fs.add_kfd_node_raw(
        dumps.RX7900XTX_GPU,
        gpu_id=4660,
        name="ip discovery",
        banks=("heap_type 1\nsize_in_bytes 25753026560\nflags 0\nwidth 384\nmem_clk_max 1250\n",),
    )
    fs.add_kfd_process(4242, {4660: 900 * MIB})
    fs.add_dev_nodes([128])
    _amdgpu_version(root)
    return {}


def _mi210(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    fs.add_kfd_node_raw("cpu_cores_count 64\nsimd_count 0\nlocation_id 0\ndomain 0\n", gpu_id=0)
    fs.add_kfd_node_raw("cpu_cores_count 64\nsimd_count 0\nlocation_id 0\ndomain 0\n", gpu_id=0)
    for i, (node, pci) in enumerate(
        zip(dumps.MI210_NODES, ("0000:63:00.0", "0000:43:00.0"), strict=True)
    ):
        # card numbers in probe (PCI) order, render minors as KFD gives them in the dump
        fs.add_amd_gpu(
            2 - i,
            pci=pci,
            vram_total=64 * GIB,
            vram_used=(10 if i == 0 else 0) * MIB + 290 * MIB,
            render_minor=node.drm_render_minor,
            product_name="AMD Instinct MI210",
            device_id=0x740F,
            kfd=False,
        )
        fs.add_kfd_node_raw(
            dumps.properties(dumps.MI210_GPU, node),
            gpu_id=50000 + 1103 * i,
            name="gfx90a",
            banks=(dumps.MI308X_BANK.format(size=64 * GIB),),
        )
    fs.add_dev_nodes([128, 129])
    _amdgpu_version(root)
    return {}


def _mi250x(root: Path) -> Mapping[str, str]:
    # One MI250X: two GCDs, each its own PCI device, KFD node and HIP device (64 GiB each).
    fs = FakeSysfs(root)
    fs.add_kfd_node_raw("cpu_cores_count 64\nsimd_count 0\nlocation_id 0\ndomain 0\n", gpu_id=0)
    gcds = (("0000:93:00.0", 0x124D13CCD7B050E5), ("0000:96:00.0", 0x5E0C3A1B2D4F6071))
    for i, (pci, unique_id) in enumerate(gcds):
        fs.add_amd_gpu(
            i + 1,
            pci=pci,
            vram_total=64 * GIB,
            vram_used=(4 * GIB if i == 0 else 0) + 12 * MIB,
            render_minor=128 + i,
            product_name="AMD Instinct MI250X",
            device_id=0x740C,
            kfd=False,
        )
        bus = int(pci[5:7], 16)
        lines = [
            "cpu_cores_count 0",
            "simd_count 440",
            "mem_banks_count 1",
            "wave_front_size 64",
            "simd_per_cu 4",
            "gfx_target_version 90010",
            "vendor_id 4098",
            "device_id 29708",
            f"location_id {bus << 8}",
            "domain 0",
            f"drm_render_minor {128 + i}",
            f"unique_id {unique_id}",
            "num_xcc 1",
        ]
        fs.add_kfd_node_raw(
            "\n".join(lines),
            gpu_id=61000 + 211 * i,
            name="gfx90a",
            banks=(dumps.MI308X_BANK.format(size=64 * GIB),),
        )
        if i == 0:
            fs.add_kfd_process(4242, {61000: 4 * GIB})
    fs.add_dev_nodes([128, 129])
    _amdgpu_version(root)
    return {}


def _mi355x(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    fs.add_kfd_cpu_node()
    for c, pci in enumerate(("0000:05:00.0", "0000:15:00.0")):
        gpu = fs.add_amd_gpu(
            c + 1,
            pci=pci,
            vram_total=288 * GIB,
            vram_used=300 * MIB,
            render_minor=128 + 8 * c,
            product_name="AMD Instinct MI355X",
            device_id=0x75A3,
            gfx_target_version=90500,
        )
        if c == 0:
            fs.add_kfd_process(4242, {gpu.gpu_id: 20 * GIB})
    fs.add_dev_nodes([128, 136])
    _amdgpu_version(root)
    return {}


def _arc_b580(root: Path) -> Mapping[str, str]:
    fs = FakeSysfs(root)
    fs.add_intel_gpu(1, pci="0000:03:00.0", driver="xe", tiles=1, device_id=0xE20B)
    card = lz.arc(0x03, used=1 * GIB)
    # compute-runtime's UUID layout: vendor, device (little-endian), revision, domain, bus
    card.uuid = bytes([0x86, 0x80, 0x0B, 0xE2, 0, 0, 0, 0, 0x03, 0, 0, 0, 0, 0, 0, 0])
    card.processes = [(4242, 1 * GIB)]
    return {"ACCELPLAT_LEVEL_ZERO_LIB": _level_zero(root, [card])}


def _amdgpu_version(root: Path) -> None:
    version = root / "sys" / "module" / "amdgpu" / "version"
    version.parent.mkdir(parents=True, exist_ok=True)
    version.write_text(f"{make_mi300x.AMDGPU}\n")


def _level_zero(root: Path, devices: list[lz.FakeZesDevice]) -> str:
    return str(lz.build_c_library(devices, root / "lz"))


def _max1550(root: Path) -> Mapping[str, str]:
    # Two of the host's Max 1550 cards (buses 0x1a and 0x2c, as their UUIDs in the dump say),
    # i915, two tiles of 64 GiB each; FLAT mode, the default on Max: four XPU devices.
    fs = FakeSysfs(root)
    devices = []
    for bus, used in ((0x1A, (3 * GIB, 512 * MIB)), (0x2C, (512 * MIB, 512 * MIB))):
        fs.add_intel_gpu(
            bus // 0x10, pci=f"0000:{bus:02x}:00.0", driver="i915", tiles=2, device_id=0x0BD5
        )
        device = lz.pvc(bus, used=used)
        device.uuid = bytes([0x86, 0x80, 0xD5, 0x0B, 0x2F, 0, 0, 0, bus, 0, 0, 0, 0, 0, 0, 0])
        device.processes = [(4242, 3 * GIB - 512 * MIB)] if bus == 0x1A else []
        devices.append(device)
    return {"ACCELPLAT_LEVEL_ZERO_LIB": _level_zero(root, devices)}


def _arc_a770_igpu(root: Path) -> Mapping[str, str]:
    # A desktop: Arc A770 at 0000:03:00.0 and the CPU's UHD Graphics 770 at 0000:00:02.0, both
    # on i915. Level Zero lists the discrete card first; the run selects it, as such hosts do.
    fs = FakeSysfs(root)
    fs.add_intel_gpu(0, pci="0000:00:02.0", driver="i915", device_id=0xA780)
    fs.add_intel_gpu(1, pci="0000:03:00.0", driver="i915", device_id=0x56A0)
    arc = lz.arc(0x03, used=1 * GIB, name="Intel(R) Arc(TM) A770 Graphics")
    arc.device_id = 0x56A0
    arc.modules = [lz.FakeModule(16 * GIB, 15 * GIB)]
    # xpu-smi's SOC UUID 00000000-0000-0003-0000-000856a08086, read as compute-runtime lays
    # it out: vendor, device, revision 0x08, domain, bus 0x03
    arc.uuid = bytes([0x86, 0x80, 0xA0, 0x56, 0x08, 0, 0, 0, 0x03, 0, 0, 0, 0, 0, 0, 0])
    arc.processes = [(4242, 1 * GIB)]
    igpu = lz.igpu(mem_free=20 * GIB, mem_available=28 * GIB, name="Intel(R) UHD Graphics 770")
    igpu.device_id = 0xA780
    igpu.uuid = bytes([0x86, 0x80, 0x80, 0xA7, 0x0C, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0])
    return {
        "ACCELPLAT_LEVEL_ZERO_LIB": _level_zero(root, [igpu, arc]),
        "ONEAPI_DEVICE_SELECTOR": "level_zero:0",
    }


HOSTS: tuple[Host, ...] = (
    Host(
        "amd-mi300x-cpx",
        SHAPED,
        _mi300x_cpx,
        ROCM_TORCH,
        f"amdgpu {make_mi300x.AMDGPU} ({SHAPED})",
        (
            "KFD topology properties of every node (two CPU nodes, 16 partitions = the first two "
            f"of eight MI300X cards in CPX mode): {dumps.MI300X_CPX_SOURCE} (2025-04-29), "
            "verbatim",
            "partition memory banks: 24 GiB each, the last of a card 16 MiB less "
            f"(CAPPING_EVEN share of 192 GiB - 16 MiB, the pattern of the MI308X dump); the "
            f"24G per partition amdgpu labels from mem_banks: {K8S_108} (2025-02-26); {BUILT}",
            f"mem_info_vram_total 206141652992 and mem_info_vram_used 297771008 of each card: "
            f"rocm-smi on a partitioned MI300X, {ROCM_4750} (2025)",
            f"amdgpu_xcp platform devices and their card/renderD numbering: {K8S_157} (2025-12-12)",
            f"gpu_id values, the 'ip discovery' node name, product_name, PCI device id 0x74a1, "
            f"current_*_partition files, the BMC display adapter, amdgpu version: {BUILT}",
        ),
    ),
    Host(
        "amd-mi308x-cpx",
        SHAPED,
        _mi308x_cpx,
        ROCM_TORCH,
        f"amdgpu {make_mi300x.AMDGPU} ({SHAPED})",
        (
            "KFD topology (gpu_id, name, properties, mem_banks/0/properties and used_memory) of "
            f"nodes 0-9 (two CPU nodes, the first two of eight MI308X cards in CPX mode, four "
            f"partitions each): {dumps.MI308X_CPX_SOURCE} (2024-09-10), verbatim",
            f"mem_info_vram_total 206141652992 (= the sum of a card's banks): {ROCM_4750}; "
            "mem_info_vram_used = the card's used_memory in the dump",
            "one KFD process holding card 0's usage above the idle cards' (2,607,050,752 bytes "
            f"on partition 0): {BUILT}",
            f"amdgpu_xcp devices and numbering: {K8S_157}; product_name, the BMC display "
            f"adapter, amdgpu version: {BUILT}",
        ),
    ),
    Host(
        "amd-strix-halo-apu",
        SHAPED,
        _strix_halo,
        "2.9.0+rocm7.0",
        f"amdgpu {make_mi300x.AMDGPU} ({SHAPED})",
        (
            "memory figures of a Ryzen AI MAX+ 395 (Radeon 8060S, gfx1151): mem_info_vram_total "
            "536870912 (the BIOS carve-out), GTT and KFD mem_banks/0 size_in_bytes "
            "118111600640, which HIP reports as the device total: "
            "https://github.com/ROCm/rocm-systems/pull/8475 (2026-07-13), and the same split "
            "in https://github.com/ROCm/rocm-systems/pull/8419 (2026-07-10)",
            "rocminfo of a Strix Halo: Uuid GPU-XX (unique_id 0), Chip ID 0x1586, GPU node 1: "
            "https://github.com/antirez/ds4/issues/475; PCI address 0000:c6:00.0: dmesg in "
            "https://github.com/ROCm/ROCm/issues/5595",
            "the rest of the KFD properties (gfx_target_version 110501, simd_count 80), gpu_id, "
            f"one process holding 6 GiB, carve-out usage: {BUILT}",
        ),
    ),
    Host(
        "amd-rx7900xtx",
        SHAPED,
        _rx7900xtx,
        ROCM_TORCH,
        f"amdgpu {make_mi300x.AMDGPU} ({SHAPED})",
        (
            f"KFD properties of the RX 7900 XTX node: {dumps.RX7900XTX_SOURCE}, verbatim",
            "VRAM 24560 MiB (25753026560 bytes), resizable BAR on (so one FB_PUBLIC bank): "
            "`lact cli info` in https://github.com/ilya-zlobintsev/LACT/pull/533 (2025-04-06); "
            "rocminfo (Chip ID 0x744c, 96 CUs): https://github.com/ollama/ollama/issues/3158",
            f"gpu_id, usage, one process, product_name: {BUILT}",
        ),
    ),
    Host(
        "intel-max1550-x2",
        SHAPED,
        _max1550,
        XPU_TORCH,
        f"i915, Level Zero 1.6.33578 ({SHAPED})",
        (
            "names, PCI device id 0x0bd5, tile count, UUIDs (so PCI buses 0x1a and 0x2c) of a "
            "Data Center GPU Max 1550 host in FLAT mode, as torch.xpu lists them in a CI log: "
            "https://github.com/intel/torch-xpu-ops/issues/3585 (2026-05-06)",
            "Sysman memory modules (one 64 GiB module per tile, 128 GB HBM2e a card) and usage, "
            f"the i915 sysfs entries, one process: {BUILT} (Intel Data Center GPU Max Series "
            "product brief; torch reports 65520 MiB a tile, Sysman's deprecated size is the "
            "probed size)",
        ),
    ),
)


HOSTS += (
    Host(
        "amd-mi210-x2",
        SHAPED,
        _mi210,
        ROCM_TORCH,
        f"amdgpu {make_mi300x.AMDGPU} ({SHAPED})",
        (
            "KFD properties of the first two GPU nodes (gfx90a, MI210, in KFD order 0000:63:00.0 "
            f"then 0000:43:00.0) of an eight-GPU host: {dumps.MI210_SOURCE} (2025-04-29), verbatim",
            f"64 GiB of HBM2e a card, banks, gpu_ids, node names, usage, product_name: {BUILT} "
            "(AMD Instinct MI210 data sheet)",
        ),
    ),
    Host(
        "amd-mi250x",
        SHAPED,
        _mi250x,
        ROCM_TORCH,
        f"amdgpu {make_mi300x.AMDGPU} ({SHAPED})",
        (
            "the first GCD as rocminfo shows an MI250X GCD: Uuid GPU-124d13ccd7b050e5, "
            "Marketing Name 'AMD Instinct MI250X/MI250', Chip ID 0x740c, BDFID 37632 "
            "(0000:93:00.0), gfx90a: https://github.com/ROCm/aiter/issues/179",
            "the second GCD (another PCI device on the same package, 0000:96:00.0), 64 GiB of "
            "HBM2e a GCD, 110 CUs a GCD, banks, gpu_ids, usage, one process, product_name: "
            f"{BUILT} (AMD Instinct MI250X data sheet: 128 GB, 220 CUs over two GCDs)",
        ),
    ),
    Host(
        "amd-mi355x-x2",
        BUILT,
        _mi355x,
        "2.9.0+rocm7.0",
        f"amdgpu {make_mi300x.AMDGPU} ({BUILT})",
        (
            "two MI355X (gfx950: KFD gfx_target_version 90500, as MI350-series hosts report it "
            "in https://github.com/ROCm/hip-ep's build notes), 288 GB of HBM3E each (AMD "
            "Instinct MI355X data sheet), PCI device id 0x75a3 (the kernel's amdgpu PCI table), "
            f"SPX mode, one process holding 20 GiB: {BUILT}; no public dump was found",
        ),
    ),
    Host(
        "intel-arc-b580",
        BUILT,
        _arc_b580,
        XPU_TORCH,
        f"xe ({BUILT})",
        (
            "one Arc B580 (Battlemage, PCI device id 0xe20b at 0000:03:00.0 as the xe driver "
            "logs it in https://github.com/geerlingguy/raspberry-pi-pcie-devices/issues/695, "
            "2025-01-28; the name as Windows lists it in "
            "https://github.com/IGCIT/Intel-GPU-Community-Issue-Tracker-IGCIT/issues/1370), "
            f"12 GiB GDDR6 in one Sysman module, 1 GiB held by one process: {BUILT}",
        ),
    ),
)


HOSTS += (
    Host(
        "intel-arc-a770-igpu",
        SHAPED,
        _arc_a770_igpu,
        XPU_TORCH,
        f"i915 ({SHAPED})",
        (
            "an Arc A770 and a UHD Graphics 770 on one desktop (i9-12900K), Level Zero listing "
            "the A770 as device 0 and the UHD 770 as device 1: sycl-ls in "
            "https://github.com/intel/intel-extension-for-pytorch/issues/702 (2024-09-11)",
            "the A770's PCI device id 0x56a0 and SOC UUID (PCI bus 0x03, revision 0x08): "
            "xpu-smi discovery in https://github.com/ggml-org/llama.cpp/pull/28725 (2026-09-12)",
            "torch.xpu counting the UHD Graphics 770 as a device (it warns that it is not "
            "officially supported): "
            "https://github.com/intel/intel-xpu-backend-for-triton/issues/5616 (2025-12-07)",
            "ONEAPI_DEVICE_SELECTOR=level_zero:0 recorded (the A770 alone, as Intel's guides "
            "advise on such hosts), Sysman memory (16 GiB on the A770; the host's MemFree and "
            "MemAvailable for the iGPU), the iGPU's UUID, usage, one process, the i915 sysfs "
            f"entries: {BUILT}",
        ),
    ),
)


def build(host: Host) -> bytes:
    """Return ``host``'s bundle bytes (reproducible)."""
    return build_bundle(
        host.populate,
        source=f"{host.name}.tar.gz",
        torch=host.torch,
        driver=host.driver,
        provenance=host.provenance(),
    )


def main(names: list[str]) -> None:
    chosen = [h for h in HOSTS if not names or h.name in names]
    if not names or "amd-mi300x-x2" in names:
        data = make_mi300x.build()
        make_mi300x.OUT.write_bytes(data)
        print(f"wrote {make_mi300x.OUT.name} ({len(data)} bytes)")
    for host in chosen:
        data = build(host)
        out = HERE / f"{host.name}.tar.gz"
        out.write_bytes(data)
        print(f"wrote {out.name} ({len(data)} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
