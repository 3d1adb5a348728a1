"""The KFD topology scan: AMD GPUs of a sysfs tree in ROCr's order, with partitions and APUs.

HIP's numbering: KFD GPU nodes whose render nodes the ROCm thunk can open; without KFD, PCI order.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelplat import _boundary, _files
from accelplat._backends._common import (
    AMD_VENDOR_ID,
    ReadText,
    SysfsReader,
    parse_int_values,
    parse_key_values,
    pci_sort_key,
    vendor_cards,
)
from accelplat._visible.rocm import hip_uuid
from accelplat.errors import BackendError

_RENDER_RE = re.compile(r"^renderD(\d+)$")
OpenDevice = Callable[[Path], None]
_HEAP_FB = (1, 2)  # HSA_MEM_HEAP_TYPE_FB_PUBLIC/PRIVATE: a KFD memory bank of GPU-local memory


def open_node(path: Path) -> None:
    """Check ``path`` as the ROCm thunk opens it, through the boundary; raise its ``OSError``."""
    _boundary.call("device", ("open", str(path)), lambda: _open_device_live(path))


def _open_device_live(path: Path) -> None:
    if path.name == "kfd":  # access() only: opening /dev/kfd would register us with KFD
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if not os.access(path, os.R_OK | os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return
    # Read-write, as the thunk opens it: a DRM client for an instant, no HIP context.
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    os.close(fd)


@dataclass(frozen=True)
class _Card:
    name: str
    path: Path
    pci_bus_id: str | None
    render_minors: frozenset[int]
    label: str


@dataclass(frozen=True)
class _Node:
    node: int
    gpu_id: int
    uuid: str | None
    render_minor: int | None
    label: str
    domain: int = 0
    location_id: int | None = None
    bank_bytes: int | None = None  # the KFD memory banks: what ROCr and HIP call its memory
    arch: str | None = None

    @property
    def pci_bus_id(self) -> str | None:
        # location_id = pci_dev_id() (kfd_topology.c kfd_topology_add_device; HIP decodes it so too)
        location = self.location_id
        if location is None:
            return None
        bus, dev, fn = (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7
        return f"{self.domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


@dataclass(frozen=True)
class Gpu:  # one GPU in ROCr's order, whatever the source
    physical_index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None
    card: _Card | None = None
    node: _Node | None = None
    partitions: int = 1
    partition: int | None = None
    handle: Any = None
    arch: str | None = None

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability HIP reports for :attr:`arch`."""
        return gfx_compute_capability(self.arch)


@dataclass
class Topology:
    gpus: list[Gpu]
    cards: int = 0
    notes: list[str] = field(default_factory=list)


def _properties(reader: SysfsReader, path: Path) -> dict[str, int]:
    # KFD writes "key value" lines; the thunk reads them the same way (libhsakmt topology.c).
    return parse_int_values(parse_key_values(reader.text(path / "properties")))


def gfx_arch(target_version: int | None) -> str | None:
    """Return the LLVM target of a KFD ``gfx_target_version`` (``90402`` -> ``"gfx942"``)."""
    # KFD encodes major * 10000 + minor * 100 + stepping; LLVM writes minor and stepping in hex.
    major, rest = divmod(target_version or 0, 10000)  # none, 0 or negative: major is below 1
    minor, stepping = divmod(rest, 100)
    if not (1 <= major <= 99 and minor < 16 and stepping < 16):
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def gfx_compute_capability(arch: str | None) -> tuple[int, int] | None:
    """Return the ``(major, minor)`` HIP and torch report for an LLVM target (``gfx942`` -> 9.4).

    ``None`` for anything that is not a ``gfx`` target.
    """
    # hipDeviceProp_t.major/minor are the ISA's major and minor version, the stepping dropped
    # (ROCm/clr hip_device.cpp); vLLM reads them the same way from the target name
    # (vllm/platforms/rocm.py _capability_from_gcn_arch): gfx90a -> 9.0, gfx1100 -> 11.0.
    m = re.fullmatch(r"gfx(\d{1,2})([0-9a-f])[0-9a-f]", (arch or "").lower())
    return None if m is None else (int(m.group(1)), int(m.group(2), 16))


def _label(reader: SysfsReader, path: Path) -> str:
    try:
        return reader.text(path)
    except BackendError:
        return ""


def _scan_cards(reader: SysfsReader, read: ReadText, sysfs: Path, notes: list[str]) -> list[_Card]:
    found, note = vendor_cards(sysfs / "class" / "drm", AMD_VENDOR_ID, read)
    if note:
        notes.append(note)
    cards: list[_Card] = []
    for entry, device, pci in found:
        if not _files.exists(device / "mem_info_vram_total"):
            notes.append(f"{entry} is an AMD GPU without mem_info_vram_total")
            continue
        names: list[str] = []
        with contextlib.suppress(OSError):
            names = _files.listdir(device / "drm")
        minors = frozenset(int(m.group(1)) for m in map(_RENDER_RE.match, names) if m is not None)
        device_id = _label(reader, device / "device")
        label = _label(reader, device / "product_name") or f"AMD GPU {device_id}".strip()
        cards.append(_Card(entry, device.parent, pci, minors, label))
    return cards


def _bank_bytes(reader: SysfsReader, node: Path) -> int | None:
    """Sum ``size_in_bytes`` of the node's GPU-local memory banks; ``None`` when it lists none."""
    banks = node / "mem_banks"
    try:
        names = sorted(n for n in _files.listdir(banks) if n.isascii() and n.isdigit())
    except OSError:
        return None
    total: int | None = None
    for name in names:
        try:
            props = _properties(reader, banks / name)
        except BackendError:
            continue
        size = props.get("size_in_bytes")
        if props.get("heap_type") in _HEAP_FB and size is not None:
            total = (total or 0) + max(0, size)
    return total


class _TopologyFailedError(Exception):
    """The ROCm thunk would fail the whole topology (so ROCm sees no GPU)."""


def _render_node_usable(dev: Path, name: str, minor: int | None, open_device: OpenDevice) -> bool:
    """Apply the thunk's rule for one GPU node's render device: ``False`` drops the node."""
    # ROCR-Runtime libhsakmt/src/topology.c:636-712 and fmm.c:2079-2106: a GPU node without
    # drm_render_minor is an error; ENOENT or EPERM (absent, or denied by the device cgroup: how
    # a container given some GPUs sees only those) drops the node; any other errno fails all.
    if minor is None:
        raise _TopologyFailedError(
            f"KFD node {name} is a GPU without drm_render_minor; the ROCm runtime fails its "
            f"whole topology on that"
        )
    path = dev / "dri" / f"renderD{minor}"
    try:
        open_device(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EPERM):
            return False
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        hint = ""
        if exc.errno == errno.EACCES:
            hint = " (add the user to the 'render' and 'video' groups)"
        raise _TopologyFailedError(
            f"cannot open {path}: {exc.strerror or exc} ({code}){hint}; the ROCm runtime then "
            f"fails its whole topology, so it sees no GPU"
        ) from None
    return True


def _scan_nodes(
    reader: SysfsReader, sysfs: Path, dev: Path | None, notes: list[str], open_device: OpenDevice
) -> list[_Node] | None:
    """Return the KFD GPU nodes ROCr enumerates, or ``None`` without a KFD topology."""
    # ROCr surfaces GPU agents in KFD node order (amd_topology.cpp BuildTopology) and HIP numbers
    # what ROCr surfaced (rocdevice.cpp iterateAgentCallback): that order is the physical one.
    nodes_dir = sysfs / "class" / "kfd" / "kfd" / "topology" / "nodes"
    try:
        names = _files.listdir(nodes_dir)
    except OSError:
        return None
    nodes: list[_Node] = []
    for name in sorted((n for n in names if n.isascii() and n.isdigit()), key=int):
        path = nodes_dir / name
        try:
            gpu_id = reader.integer(path / "gpu_id")
            props = _properties(reader, path)
        except BackendError as exc:
            notes.append(f"KFD node {name} skipped: {exc}")
            continue
        if gpu_id == 0 or props.get("simd_count", 1) == 0:
            continue  # a CPU node: the thunk reads simd_count 0 as "no GPU" (topology.c)
        minor = props.get("drm_render_minor")
        if dev is not None and not _render_node_usable(dev, name, minor, open_device):
            notes.append(
                f"KFD node {name} skipped: its render node {dev / 'dri'}/renderD{minor} is absent "
                f"or denied (ENOENT/EPERM), as the ROCm runtime skips it"
            )
            continue
        nodes.append(
            _Node(
                int(name),
                gpu_id,
                hip_uuid(props.get("unique_id", 0)),
                minor,
                _label(reader, path / "name"),
                domain=props.get("domain", 0),
                location_id=props.get("location_id"),
                bank_bytes=_bank_bytes(reader, path),
                arch=gfx_arch(props.get("gfx_target_version")),
            )
        )
    return nodes


def _card_of_partition(node: _Node, cards: Sequence[_Card]) -> tuple[_Card, int] | None:
    """The card a compute partition belongs to, and the partition id, from ``location_id``."""
    # amdkfd kfd_topology.c kfd_topology_add_device: "if (gpu->kfd->num_nodes > 1) location_id
    # |= dev->gpu->node_id", so partition k decodes to PCI function k, which is no card; the
    # card's own location is a bit-subset of the node's on the same bus, the closest one wins.
    if node.location_id is None:
        return None
    best: tuple[int, _Card] | None = None  # the closest card's location, and the card
    for card in cards:
        key = pci_sort_key(card.pci_bus_id)  # (domain, bus, device, function) of a PCI address
        if len(key) != 4 or key[0] != node.domain:
            continue
        location = (key[1] << 8) | (key[2] << 3) | key[3]
        on_bus = location >> 8 == node.location_id >> 8 and location & node.location_id == location
        if on_bus and (best is None or location > best[0]):
            best = (location, card)
    return None if best is None else (best[1], node.location_id ^ best[0])


def scan_topology(
    sysfs: Path, dev: Path | None, read: ReadText, open_device: OpenDevice = open_node
) -> Topology:
    """Return the AMD GPUs of ``sysfs`` in ROCr's order; none usable: the notes say why."""
    notes: list[str] = []
    reader = SysfsReader("rocm", read)
    cards = _scan_cards(reader, read, sysfs, notes)
    if not cards:
        return Topology([], notes=notes)
    try:
        nodes = _scan_nodes(reader, sysfs, dev, notes, open_device)
    except _TopologyFailedError as exc:
        notes.insert(0, str(exc))
        return Topology([], cards=len(cards), notes=notes)
    if nodes is None:  # no KFD: the order the driver probes cards in on ordinary machines
        ordered = sorted(cards, key=lambda c: (pci_sort_key(c.pci_bus_id), c.name))
        notes.append("no KFD topology: cards ordered by PCI address")
        gpus = [Gpu(i, c.label, None, c.pci_bus_id, card=c) for i, c in enumerate(ordered)]
        return Topology(gpus, cards=len(cards), notes=notes)
    if dev is not None:
        try:
            open_device(dev / "kfd")
        except OSError as exc:
            what = f"cannot be opened ({exc.strerror or exc})"
            if isinstance(exc, FileNotFoundError):
                what = "is missing"
            notes.insert(0, f"{dev / 'kfd'} {what}: the ROCm runtime cannot open any GPU")
            return Topology([], cards=len(cards), notes=notes)
    # A node is tied to its card by drm_render_minor: partition 0 "shares drm device setting
    # with adev" (amdgpu_xcp.c amdgpu_xcp_dev_alloc), so its renderD is under the card's
    # device/drm. Partitions 1..N-1 have DRM devices on amdgpu_xcp platform devices, with no PCI
    # parent (amdxcp/amdgpu_xcp_drv.c): only their location_id ties them to the card.
    by_minor: dict[int | None, _Card] = {m: c for c in cards for m in c.render_minors}
    by_pci: dict[str | None, _Card] = {c.pci_bus_id: c for c in cards if c.pci_bus_id}
    matched: list[tuple[_Node, _Card | None, int | None]] = []
    for node in nodes:
        card = by_minor.get(node.render_minor) or by_pci.get(node.pci_bus_id)
        partition: int | None = None
        if card is None:
            card, partition = _card_of_partition(node, cards) or (None, None)
        if card is None:
            notes.append(f"KFD node {node.node} matches no AMD card; its memory is unknown")
        matched.append((node, card, partition))
    shares = Counter(card.name for _, card, _ in matched if card is not None)
    seen: Counter[str] = Counter()
    found_gpus: list[Gpu] = []
    for i, (node, card, from_location) in enumerate(matched):
        label, pci = node.label, node.pci_bus_id
        count, partition = 1, None
        if card is not None:
            count = shares[card.name]
            if count > 1:  # from location_id, else partitions in node order
                partition = seen[card.name] if from_location is None else from_location
            seen[card.name] += 1
            label, pci = card.label or label, card.pci_bus_id or pci
        gpu = Gpu(
            i, label or "AMD GPU", node.uuid, pci, card, node, count, partition, arch=node.arch
        )
        found_gpus.append(gpu)
    return Topology(found_gpus, cards=len(cards), notes=notes)
