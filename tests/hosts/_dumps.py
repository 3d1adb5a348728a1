"""Text of public KFD topology dumps the AMD hosts are shaped from (see ``tests/hosts/README.md``).

Each GPU node's ``properties`` file is kept as a template (one dumped node, verbatim) and the
lines that differ between nodes of the same dump (``NodeLines``), so that every node written
is the dumped file again, byte for byte apart from the final newline.
"""

from __future__ import annotations

from dataclasses import dataclass

K8S_PLUGIN = "https://github.com/ROCm/k8s-device-plugin"


@dataclass(frozen=True)
class NodeLines:
    """The per-node lines of a dumped GPU node's ``properties``."""

    location_id: int
    drm_render_minor: int
    unique_id: int
    simd_id_base: int


def properties(template: str, node: NodeLines) -> str:
    """``template`` with ``node``'s per-node lines put in."""
    values = {
        "location_id": node.location_id,
        "drm_render_minor": node.drm_render_minor,
        "unique_id": node.unique_id,
        "simd_id_base": node.simd_id_base,
    }
    lines = []
    for line in template.strip().splitlines():
        key = line.split(" ", 1)[0]
        lines.append(f"{key} {values[key]}" if key in values else line)
    return "\n".join(lines) + "\n"


# ROCm/k8s-device-plugin testdata/topo-mi300-cpx/topology (commit 4e0e694, 2025-04-29): an
# eight-card MI300X host in CPX mode (64 partitions). Nodes 0-1 are the CPU nodes; nodes 2-17
# (the first two cards) are used.
MI300X_CPX_SOURCE = (
    f"{K8S_PLUGIN}/tree/4e0e694ea6f66054db36cda86ba80410c6cec067/testdata/topo-mi300-cpx"
)
MI300X_CPX_CPU = """\
cpu_cores_count 96
simd_count 0
mem_banks_count 1
caches_count 0
io_links_count {io_links}
p2p_links_count {p2p_links}
cpu_core_id_base {core_base}
simd_id_base 0
max_waves_per_simd 0
lds_size_in_kb 0
gds_size_in_kb 0
num_gws 0
wave_front_size 0
array_count 0
simd_arrays_per_engine 0
cu_per_simd_array 0
simd_per_cu 0
max_slots_scratch_cu 0
gfx_target_version 0
vendor_id 0
device_id 0
location_id 0
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 0
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 0
num_cp_queues 0
max_engine_clk_ccompute 2750
"""
MI300X_CPX_CPU_NODES = (
    {"io_links": 33, "p2p_links": 31, "core_base": 0},
    {"io_links": 32, "p2p_links": 32, "core_base": 128},
)
MI300X_CPX_GPU = """\
cpu_cores_count 0
simd_count 152
mem_banks_count 1
caches_count 80
io_links_count 63
p2p_links_count 1
cpu_core_id_base 0
simd_id_base 2147488064
max_waves_per_simd 8
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 64
array_count 4
simd_arrays_per_engine 1
cu_per_simd_array 10
simd_per_cu 4
max_slots_scratch_cu 32
gfx_target_version 90402
vendor_id 4098
device_id 29857
location_id 1280
domain 0
drm_render_minor 128
hive_id 15188982192727901047
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 8
num_cp_queues 24
max_engine_clk_fcompute 2100
local_mem_size 0
fw_version 177
capability 2893521536
debug_prop 1511
sdma_fw_version 24
unique_id 16404946649897475633
num_xcc 1
max_engine_clk_ccompute 2750
"""
MI300X_CPX_NODES = tuple(
    NodeLines(location + k, minor + k, unique, simd + 40 * (8 * card + k))
    for card, (location, minor, unique) in enumerate(
        ((1280, 128, 16404946649897475633), (9984, 136, 2472748907779728154))
    )
    for k in range(8)
    for simd in (2147488064,)
)  # location_id = the card's PCI id | partition; render minors 8 per card; one unique_id a card

# ROCm/k8s-device-plugin testdata/topology-parsing-mi308/topology (commit d711478, 2024-09-10):
# an eight-card MI308X host in CPX mode (four partitions a card), with gpu_id, name, mem_banks
# and used_memory. Nodes 0-1 (CPU) and 2-9 (the first two cards) are used.
MI308X_CPX_SOURCE = (
    f"{K8S_PLUGIN}/tree/d7114784a180d8436794ebab56dd0a6346501aae/testdata/topology-parsing-mi308"
)
MI308X_CPX_CPU = """\
cpu_cores_count 112
simd_count 0
mem_banks_count 1
caches_count 0
io_links_count 17
p2p_links_count 16
cpu_core_id_base {core_base}
simd_id_base 0
max_waves_per_simd 0
lds_size_in_kb 0
gds_size_in_kb 0
num_gws 0
wave_front_size 0
array_count 0
simd_arrays_per_engine 0
cu_per_simd_array 0
simd_per_cu 0
max_slots_scratch_cu 0
gfx_target_version 0
vendor_id 0
device_id 0
location_id 0
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 0
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 0
num_cp_queues 0
max_engine_clk_ccompute 3800
"""
MI308X_CPX_CPU_BANKS = (
    "heap_type 0\nsize_in_bytes 1081864880128\nflags 0\nwidth 64\nmem_clk_max 5600\n",
    "heap_type 0\nsize_in_bytes 1082256592896\nflags 0\nwidth 0\nmem_clk_max 0\n",
)
MI308X_CPX_GPU = """\
cpu_cores_count 0
simd_count 80
mem_banks_count 1
caches_count 46
io_links_count 32
p2p_links_count 1
cpu_core_id_base 0
simd_id_base 2147487744
max_waves_per_simd 8
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 64
array_count 4
simd_arrays_per_engine 1
cu_per_simd_array 10
simd_per_cu 4
max_slots_scratch_cu 32
gfx_target_version 90402
vendor_id 4098
device_id 29858
location_id 2560
domain 0
drm_render_minor 128
hive_id 2095653680343411291
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 8
num_cp_queues 24
max_engine_clk_fcompute 1420
local_mem_size 0
fw_version 149
capability 746037888
debug_prop 1511
sdma_fw_version 19
unique_id 598046273873802902
num_xcc 1
max_engine_clk_ccompute 3800
"""
MI308X_BANK = "heap_type 1\nsize_in_bytes {size}\nflags 0\nwidth 8192\nmem_clk_max 1300\n"


@dataclass(frozen=True)
class Mi308Node:
    """A dumped MI308X partition: its lines, ``gpu_id``, bank size and ``used_memory``."""

    lines: NodeLines
    gpu_id: int
    bank: int
    used_memory: int


MI308X_CPX_NODES = tuple(
    Mi308Node(
        NodeLines(location + k, minor + k, unique, 2147487744 + 40 * (4 * card + k)),
        gpu_id,
        51522830336 if k == 3 else 51539607552,
        used,
    )
    for card, (location, minor, unique, used, gpu_ids) in enumerate(
        (
            (2560, 128, 598046273873802902, 2907979776, (24248, 41657, 59065, 2236)),
            (32768, 136, 11803749423592941193, 300929024, (22879, 42334, 57694, 3931)),
        )
    )
    for k, gpu_id in enumerate(gpu_ids)
)

# An RX 7900 XTX node's properties, as tinygrad's mock GPU reproduces a real one
# (tinygrad/tinygrad test/mockgpu/amd/amdgpu.py, commit 9fc23e0); drm_render_minor filled in.
RX7900XTX_SOURCE = (
    "https://github.com/tinygrad/tinygrad/blob/9fc23e070551bd060162a74bc87104f38a4195a0/"
    "test/mockgpu/amd/amdgpu.py"
)
RX7900XTX_GPU = """\
cpu_cores_count 0
simd_count 192
mem_banks_count 1
caches_count 206
io_links_count 1
p2p_links_count 5
cpu_core_id_base 0
simd_id_base 2147488032
max_waves_per_simd 16
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 32
array_count 12
simd_arrays_per_engine 2
cu_per_simd_array 8
simd_per_cu 2
max_slots_scratch_cu 32
gfx_target_version 110000
vendor_id 4098
device_id 29772
location_id 34304
domain 0
drm_render_minor 128
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 6
num_cp_queues 8
max_engine_clk_fcompute 2482
local_mem_size 0
fw_version 2140
capability 671588992
debug_prop 1495
sdma_fw_version 20
unique_id 11673270660693242239
num_xcc 1
max_engine_clk_ccompute 2400
"""

# ROCm/k8s-device-plugin testdata/topo-mi210-xgmi-pcie (commit 4e0e694, 2025-04-29): an
# eight-GPU MI210 host (gfx90a); nodes 2-3 (the first two GPUs in KFD order) are used.
MI210_SOURCE = (
    f"{K8S_PLUGIN}/tree/4e0e694ea6f66054db36cda86ba80410c6cec067/testdata/topo-mi210-xgmi-pcie"
)
MI210_GPU = """\
cpu_cores_count 0
simd_count 416
mem_banks_count 1
caches_count 217
io_links_count 4
p2p_links_count 5
cpu_core_id_base 0
simd_id_base 2147487744
max_waves_per_simd 8
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 64
array_count 8
simd_arrays_per_engine 1
cu_per_simd_array 14
simd_per_cu 4
max_slots_scratch_cu 32
gfx_target_version 90010
vendor_id 4098
device_id 29711
location_id 25344
domain 0
drm_render_minor 128
hive_id 12609507387757274807
num_sdma_engines 2
num_sdma_xgmi_engines 3
num_sdma_queues_per_engine 8
num_cp_queues 24
max_engine_clk_fcompute 1700
local_mem_size 0
fw_version 92
capability 746037888
debug_prop 470
sdma_fw_version 9
unique_id 1801979520617338022
num_xcc 1
max_engine_clk_ccompute 2450
"""
MI210_NODES = (
    NodeLines(25344, 128, 1801979520617338022, 2147487744),
    NodeLines(17152, 129, 5847760019078012339, 2147487856),
)  # KFD order is not PCI order: 0000:63:00.0, then 0000:43:00.0
