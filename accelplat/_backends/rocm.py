"""The ``rocm`` platform: AMD GPUs through sysfs, amdsmi, or (last) an already-imported torch.

Memory sources, in order of preference:

1. **sysfs** (``source="sysfs"``): ``<sysfs>/class/drm/cardN/device/mem_info_vram_total`` and
   ``mem_info_vram_used``, in bytes, for every card whose ``device/vendor`` is ``0x1002``.
   Reading them is a few microseconds, needs no library and creates no context. They count every
   client of the card (display, firmware, the runtime), so an idle card never reads zero.
2. **amdsmi** (``source="amdsmi"``), when sysfs shows no AMD card with VRAM files and ROCm's
   ``libamd_smi.so`` is present: ``amdsmi_get_gpu_memory_total``/``…_usage`` with
   ``AmdSmiMemoryType.VRAM`` (bytes). ``amdsmi_get_gpu_vram_usage`` is never used: it reports MB
   and was seen stale on MI355X (ROCm 7.0). The module is imported lazily, with its stdout
   swallowed, and any failure is caught: without ROCm ``import amdsmi`` prints and raises
   ``KeyError``; against an older ROCm it raises ``AttributeError``.
3. **torch** (``source="torch.cuda (creates a device context)"``), only when neither works and
   the caller has already imported a ROCm build of torch; ``context_free`` is then ``False``.
   This backend never imports torch itself.

Device order and visibility:
    HIP numbers GPUs as ROCr enumerates them: the GPU nodes of the KFD topology
    (``<sysfs>/class/kfd/kfd/topology/nodes/N``, ``gpu_id`` non-zero and ``simd_count`` non-zero)
    in node order. The ROCm thunk opens each GPU node's render device
    ``<dev>/dri/renderD<minor>`` read-write: ``ENOENT`` or ``EPERM`` (absent, or denied by the
    device cgroup: how a container given some GPUs sees only those) drops the node; any other
    error (``EACCES``: the user is not in the render/video group), or a GPU node without
    ``drm_render_minor``, fails the whole topology, so ROCm sees no GPU. The same rule applies
    here, so indices never shift against HIP's. That is the physical order used here. Each node
    is tied to its card by ``drm_render_minor`` (the card's ``device/drm`` holds that ``renderD``
    node); failing that, by PCI address (``domain`` and ``location_id`` = bus << 8 | device << 3
    | function), where a compute partition's ``location_id`` also carries its partition id
    (ORed in by the kernel). A card's PCI address is the name of the directory its
    ``device`` link points to, or ``PCI_SLOT_NAME`` of ``device/uevent``. Without a KFD topology,
    cards are ordered by PCI address, which is the order the driver probes them in on ordinary
    machines. Then ``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``
    apply (see :mod:`accelplat._visible.rocm`); with amdsmi, handles are ordered by their
    ``hip_id`` (or PCI address) first.

Partitioned GPUs (MI300/MI355 in DPX/QPX/CPX) are several KFD nodes on one card; each is a HIP
device. Partition 0 shares the card's render node; partitions 1..N-1 have render nodes of their own
``amdgpu_xcp`` platform devices, tied to the card through ``location_id``. HIP sees each
partition's share of memory — the memory partition's size divided by the compute partitions
sharing it — which is the KFD node's memory bank (``mem_banks/N/properties`` ``size_in_bytes``);
sysfs and amdsmi report the whole card. So a partition's ``total`` is its KFD bank and ``used`` is
the sum of KFD's per-process ``vram_<gpu_id>`` on it (``source`` says so); when those files cannot
be read, the whole card's figures are returned with a ``source`` that says they are card-wide.

APUs whose kernel prefers GTT for KFD (``apu_prefer_gtt``: a VRAM carve-out smaller than GTT)
report only the BIOS carve-out in ``mem_info_vram_*``; their KFD bank (the TTM page limit) is what
HIP reports. They are recognised by a KFD bank larger than ``mem_info_vram_total`` and reported
like a partition; free host memory, which also limits them, is not counted.

Holders come from ``<sysfs>/class/kfd/kfd/proc/<pid>/vram_<gpu_id>`` (bytes; processes with
zero bytes on the device are left out). Without a matched ``gpu_id`` they are unknown (``None``).

Roots: ``ACCELPLAT_SYSFS_ROOT`` (default ``/sys``) and ``ACCELPLAT_DEV_ROOT`` (default ``/dev``),
or the constructor arguments. When only the sysfs root is moved (a copied or fake tree), the
render-node and ``/dev/kfd`` checks are skipped: a foreign tree says nothing about this
process's ``/dev``. Variables are read on every query.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import importlib.util
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from typing_extensions import override

from accelplat import _boundary, _files
from accelplat._backends._common import ReadText, SysfsReader, pci_address, pci_sort_key
from accelplat._backends._presence import (
    AMD_VENDOR_ID,
    AMDSMI_NOT_INSTALLED,
    ENV_SYSFS_ROOT,
    ROCM_TORCH_NOT_IMPORTED,
    drm_cards,
    no_amd_gpu,
)
from accelplat._backends._readings import checked_memory
from accelplat._platform import BasePlatform, StartMethod
from accelplat._types import (
    GIB,
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat._usage import MemoryHolder
from accelplat._vendor import import_quietly
from accelplat._vendor.graphs import graph_support
from accelplat._vendor.procs import make_holder
from accelplat._visible.rocm import (
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_HIP_VISIBLE_DEVICES,
    hip_uuid,
    visible_physical_indices,
)
from accelplat.errors import AccelplatError, BackendError

__all__ = ["AMD_VENDOR_ID", "RocmPlatform"]

ENV_DEV_ROOT = "ACCELPLAT_DEV_ROOT"

SOURCE_SYSFS = "sysfs"
SOURCE_PARTITION = (
    "sysfs kfd (partition {k} of {n}: total = its share of the card, as HIP reports it; "
    "used = KFD allocations on it)"
)
SOURCE_APU = (
    "sysfs kfd (APU, memory from system RAM: total = KFD's limit, as HIP reports it; "
    "used = KFD allocations; host memory pressure not counted)"
)
SOURCE_AMDSMI = "amdsmi"
SOURCE_TORCH = "torch.cuda (creates a device context)"

_RENDER_RE = re.compile(r"^renderD(\d+)$")
_GFX_RE = re.compile(r"^gfx[0-9a-f]{3,4}$")

OpenDevice = Callable[[Path], None]

_HEAP_FB_PUBLIC = 1
_HEAP_FB_PRIVATE = 2
"""KFD memory-bank heap types of GPU-local memory (``HSA_MEM_HEAP_TYPE_FB_*``)."""


def _open_device(path: Path) -> None:
    """Check ``path`` as the ROCm thunk opens it; raise the ``OSError`` it would get.

    A render node is opened read-write and closed at once, as the thunk opens it (this briefly
    creates a DRM client: no HIP context, nothing held afterwards). ``/dev/kfd`` is only checked
    with ``access()``: opening it would register this process with KFD. Asked through the vendor
    boundary (channel ``device``), so a capture records the outcome and a replay gives it back.
    """
    _boundary.call("device", ("open", str(path)), lambda: _open_device_live(path))


def _open_device_live(path: Path) -> None:
    if path.name == "kfd":
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if not os.access(path, os.R_OK | os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return
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
    unique_id: int
    render_minor: int | None
    pci_bus_id: str | None
    label: str
    domain: int = 0
    location_id: int | None = None
    bank_bytes: int | None = None
    """Size of the node's GPU memory banks in the KFD topology: what ROCr and HIP report as the
    device's memory (``None`` when the topology lists no bank)."""
    arch: str | None = None


@dataclass(frozen=True)
class _Gpu:
    """One GPU in ROCr's order, whatever the source."""

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


@dataclass
class _Topology:
    gpus: list[_Gpu]
    uuids_known: bool
    cards: int = 0
    notes: list[str] = field(default_factory=list)


def _reading(where: str, *, total: int, used: int, source: str) -> MemoryInfo:
    """A ROCm memory reading of ``total`` and ``used``: free is derived, never read.

    Every ROCm source (sysfs VRAM files, the KFD memory bank, amdsmi) reports total and used
    only; the plausibility rule (:func:`checked_memory`) judges the two figures read.

    Raises:
        ImplausibleReadingError: When the figures are impossible, naming ``where``.
    """
    return checked_memory(
        "rocm", where, free=max(0, total - used), total=total, used=used, source=source
    )


class _Source:
    """Where device lists and memory figures come from."""

    name: str = ""
    context_free: bool = True
    visible_applied: bool = False

    def gpus(self) -> list[_Gpu]:
        raise NotImplementedError

    def uuids(self) -> list[str | None] | None:
        return [g.uuid for g in self.gpus()]

    def memory(self, gpu: _Gpu) -> MemoryInfo:
        raise NotImplementedError

    def holders(self, gpu: _Gpu) -> list[MemoryHolder] | None:
        return None


# ---------------------------------------------------------------------------------------------
# sysfs


def _parse_properties(text: str) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            props[key] = int(value.strip())
        except ValueError:
            continue
    return props


def gfx_arch(target_version: int | None) -> str | None:
    """Return the LLVM target name of a KFD ``gfx_target_version`` (``90402`` -> ``"gfx942"``).

    The KFD topology encodes the target as ``major * 10000 + minor * 100 + stepping``; LLVM
    writes minor and stepping as one hex digit each (``90010`` -> ``"gfx90a"``,
    ``110001`` -> ``"gfx1101"``).

    Args:
        target_version: The property's value, or ``None`` when the node has none.

    Returns:
        The ``gfx…`` name, or ``None`` for a missing, zero or out-of-range value.
    """
    if target_version is None or target_version <= 0:
        return None
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if not (1 <= major <= 99 and minor < 16 and stepping < 16):
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def _card_pci(reader: SysfsReader, device: Path) -> str | None:
    try:
        name = os.path.basename(_files.realpath(device))
    except OSError:
        name = ""
    if pci_address(name):
        return pci_address(name)
    try:
        uevent = reader.text(device / "uevent")
    except BackendError:
        return None
    for line in uevent.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PCI_SLOT_NAME" and pci_address(value):
            return pci_address(value)
    return None


def _label(reader: SysfsReader, *paths: Path) -> str:
    for path in paths:
        try:
            text = reader.text(path)
        except BackendError:
            continue
        if text:
            return text
    return ""


def _scan_cards(reader: SysfsReader, sysfs: Path, notes: list[str]) -> list[_Card]:
    drm = sysfs / "class" / "drm"
    entries, note = drm_cards(drm)  # connectors (card0-DP-1), render nodes are left out
    if note:
        notes.append(note)
        return []
    cards: list[_Card] = []
    for entry in entries:
        device = drm / entry / "device"
        try:
            vendor = reader.integer(device / "vendor", base=16)
        except BackendError:
            continue
        if vendor != AMD_VENDOR_ID:
            continue
        if not _files.exists(device / "mem_info_vram_total"):
            notes.append(f"{entry} is an AMD GPU without mem_info_vram_total")
            continue
        try:
            minors = frozenset(
                int(m.group(1))
                for m in (_RENDER_RE.match(n) for n in _files.listdir(device / "drm"))
                if m is not None
            )
        except OSError:
            minors = frozenset()
        device_id = _label(reader, device / "device")
        label = _label(reader, device / "product_name") or f"AMD GPU {device_id}".strip()
        cards.append(_Card(entry, drm / entry, _card_pci(reader, device), minors, label))
    return cards


def _node_pci(props: Mapping[str, int]) -> str | None:
    location = props.get("location_id")
    if location is None:
        return None
    domain = props.get("domain", 0)
    bus, dev, fn = (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def _bank_bytes(reader: SysfsReader, node: Path) -> int | None:
    """Sum ``size_in_bytes`` of the node's GPU-local memory banks; ``None`` when it lists none."""
    banks = node / "mem_banks"
    try:
        names = sorted(n for n in _files.listdir(banks) if n.isdigit())
    except OSError:
        return None
    total: int | None = None
    for name in names:
        try:
            props = _parse_properties(reader.text(banks / name / "properties"))
        except BackendError:
            continue
        size = props.get("size_in_bytes")
        if props.get("heap_type") in (_HEAP_FB_PUBLIC, _HEAP_FB_PRIVATE) and size is not None:
            total = (total or 0) + max(0, size)
    return total


class _TopologyFailedError(Exception):
    """The ROCm thunk would fail the whole topology (so ROCm sees no GPU)."""


def _render_node_usable(dev: Path, name: str, minor: int | None, open_device: OpenDevice) -> bool:
    """Apply the thunk's rule for one GPU node's render device.

    Returns:
        ``True`` when it opens; ``False`` for ``ENOENT`` or ``EPERM`` (the thunk drops the node).

    Raises:
        _TopologyFailedError: For a GPU node without ``drm_render_minor`` and for any other error,
            such as ``EACCES`` (the user is not in the render/video group).
    """
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
    reader: SysfsReader,
    sysfs: Path,
    dev: Path | None,
    notes: list[str],
    open_device: OpenDevice,
) -> list[_Node] | None:
    """Return the KFD GPU nodes ROCr enumerates, or ``None`` without a KFD topology.

    Raises:
        _TopologyFailedError: When the ROCm thunk would fail the whole topology.
    """
    nodes_dir = sysfs / "class" / "kfd" / "kfd" / "topology" / "nodes"
    try:
        names = _files.listdir(nodes_dir)
    except OSError:
        return None
    nodes: list[_Node] = []
    for name in sorted((n for n in names if n.isdigit()), key=int):
        path = nodes_dir / name
        try:
            gpu_id = reader.integer(path / "gpu_id")
            props = _parse_properties(reader.text(path / "properties"))
        except BackendError as exc:
            notes.append(f"KFD node {name} skipped: {exc}")
            continue
        if gpu_id == 0 or props.get("simd_count", 1) == 0:
            continue  # a CPU node
        minor = props.get("drm_render_minor")
        if dev is not None and not _render_node_usable(dev, name, minor, open_device):
            notes.append(
                f"KFD node {name} skipped: its render node {dev / 'dri'}/renderD{minor} is absent "
                f"or denied (ENOENT/EPERM), as the ROCm runtime skips it"
            )
            continue
        label = _label(reader, path / "name")
        nodes.append(
            _Node(
                int(name),
                gpu_id,
                props.get("unique_id", 0),
                minor,
                _node_pci(props),
                label,
                domain=props.get("domain", 0),
                location_id=props.get("location_id"),
                bank_bytes=_bank_bytes(reader, path),
                arch=gfx_arch(props.get("gfx_target_version")),
            )
        )
    return nodes


def _card_location(card: _Card) -> tuple[int, int] | None:
    """``(domain, bus << 8 | device << 3 | function)`` of a card's PCI address."""
    key = pci_sort_key(card.pci_bus_id)
    if len(key) != 4:  # not a PCI address
        return None
    domain, bus, dev, fn = key
    return domain, (bus << 8) | (dev << 3) | fn


def _card_of_partition(node: _Node, cards: Sequence[_Card]) -> tuple[_Card, int] | None:
    """The card a compute partition belongs to, and the partition id, from ``location_id``.

    The kernel ORs the partition id into ``location_id`` when a card has several partitions
    (``kfd_topology_add_device``), so the card's own location is a bit-subset of the node's on the
    same bus; the closest such card wins.
    """
    if node.location_id is None:
        return None
    best: tuple[_Card, int] | None = None
    for card in cards:
        where = _card_location(card)
        if where is None:
            continue
        domain, location = where
        if domain != node.domain or location >> 8 != node.location_id >> 8:
            continue
        if location & node.location_id != location:
            continue
        if best is None or location > (_card_location(best[0]) or (0, -1))[1]:
            best = (card, node.location_id ^ location)
    return best


def _scan_topology(
    sysfs: Path, dev: Path | None, reader: SysfsReader, open_device: OpenDevice = _open_device
) -> _Topology:
    """Return the AMD GPUs of ``sysfs`` in ROCr's order (see the module docstring).

    Args:
        sysfs: The sysfs root.
        dev: The ``/dev`` root to check render nodes and ``kfd`` in, or ``None`` to skip that.
        reader: Reads the attribute files.
        open_device: How a device node is checked (raises the ``OSError`` opening it gives).

    Returns:
        The topology; ``gpus`` is empty when no AMD card with VRAM files exists, or when the ROCm
        runtime could use none (the notes say why).
    """
    notes: list[str] = []
    cards = _scan_cards(reader, sysfs, notes)
    if not cards:
        return _Topology([], uuids_known=False, notes=notes)
    try:
        nodes = _scan_nodes(reader, sysfs, dev, notes, open_device)
    except _TopologyFailedError as exc:
        notes.insert(0, str(exc))
        return _Topology([], uuids_known=True, cards=len(cards), notes=notes)
    if nodes is None:
        ordered = sorted(cards, key=lambda c: (pci_sort_key(c.pci_bus_id), c.name))
        notes.append("no KFD topology: cards ordered by PCI address")
        gpus = [_Gpu(i, c.label, None, c.pci_bus_id, card=c) for i, c in enumerate(ordered)]
        return _Topology(gpus, uuids_known=False, cards=len(cards), notes=notes)
    if dev is not None:
        try:
            open_device(dev / "kfd")
        except OSError as exc:
            what = (
                "is missing"
                if isinstance(exc, FileNotFoundError)
                else f"cannot be opened ({exc.strerror or exc})"
            )
            notes.insert(0, f"{dev / 'kfd'} {what}: the ROCm runtime cannot open any GPU")
            return _Topology([], uuids_known=True, cards=len(cards), notes=notes)
    by_minor = {m: c for c in cards for m in c.render_minors}
    by_pci = {c.pci_bus_id: c for c in cards if c.pci_bus_id}
    matched: list[tuple[_Node, _Card | None, int | None]] = []
    for node in nodes:
        card = by_minor.get(node.render_minor) if node.render_minor is not None else None
        partition: int | None = None
        if card is None and node.pci_bus_id is not None:
            card = by_pci.get(node.pci_bus_id)
        if card is None:
            found = _card_of_partition(node, cards)
            if found is not None:
                card, partition = found
        if card is None:
            notes.append(f"KFD node {node.node} matches no AMD card; its memory is unknown")
        matched.append((node, card, partition))
    shares: dict[str, int] = {}
    for _, card, _ in matched:
        if card is not None:
            shares[card.name] = shares.get(card.name, 0) + 1
    found_gpus: list[_Gpu] = []
    seen: dict[str, int] = {}
    for i, (node, card, from_location) in enumerate(matched):
        count = shares.get(card.name, 1) if card is not None else 1
        partition = from_location
        if card is not None and count > 1 and partition is None:
            partition = seen.get(card.name, 0)
        if card is not None:
            seen[card.name] = seen.get(card.name, 0) + 1
        found_gpus.append(
            _Gpu(
                i,
                (card.label if card is not None else "") or node.label or "AMD GPU",
                hip_uuid(node.unique_id),
                (card.pci_bus_id if card is not None else None) or node.pci_bus_id,
                card=card,
                node=node,
                partitions=count,
                partition=partition if count > 1 else None,
                arch=node.arch,
            )
        )
    return _Topology(found_gpus, uuids_known=True, cards=len(cards), notes=notes)


class _SysfsSource(_Source):
    name = SOURCE_SYSFS

    def __init__(self, sysfs: Path, topology: _Topology, reader: SysfsReader) -> None:
        self._sysfs = sysfs
        self._topology = topology
        self._reader = reader

    def gpus(self) -> list[_Gpu]:
        return self._topology.gpus

    def uuids(self) -> list[str | None] | None:
        return [g.uuid for g in self.gpus()] if self._topology.uuids_known else None

    def memory(self, gpu: _Gpu) -> MemoryInfo:
        if gpu.card is None:
            raise BackendError(
                "rocm",
                f"GPU {gpu.physical_index} (KFD node {gpu.node.node if gpu.node else '?'}) "
                f"matches no card under {self._sysfs / 'class' / 'drm'}; its memory is unknown",
            )
        device = gpu.card.path / "device"
        total = self._reader.integer(device / "mem_info_vram_total")
        used = self._reader.integer(device / "mem_info_vram_used")
        if used > total:
            raise BackendError(
                "rocm",
                f"{device / 'mem_info_vram_used'} ({used}) exceeds "
                f"{device / 'mem_info_vram_total'} ({total})",
            )
        node = gpu.node
        bank = node.bank_bytes if node is not None else None
        apu = gpu.partitions == 1 and bank is not None and bank > total
        if gpu.partitions == 1 and not apu:
            return _reading(
                f"GPU {gpu.physical_index} ({device}/mem_info_vram_{{total,used}})",
                total=total,
                used=used,
                source=SOURCE_SYSFS,
            )
        # A compute partition, or an APU whose KFD memory is system RAM (GTT): HIP's total is the
        # KFD bank, and the card-wide VRAM files do not describe it.
        kfd_used = self._kfd_used(node.gpu_id) if node is not None else None
        if bank is None or kfd_used is None:
            if apu:
                raise BackendError(
                    "rocm",
                    f"GPU {gpu.physical_index} is an APU whose KFD memory comes from system RAM "
                    f"(GTT): sysfs VRAM is only the carve-out, and the KFD process files under "
                    f"{self._sysfs / 'class' / 'kfd' / 'kfd' / 'proc'} are unreadable",
                )
            why = "no KFD memory bank" if bank is None else "KFD process files unreadable"
            source = (
                f"sysfs (whole card, shared by {gpu.partitions} partitions; this partition's "
                f"share unknown: {why})"
            )
            return _reading(
                f"GPU {gpu.physical_index} ({device}/mem_info_vram_{{total,used}})",
                total=total,
                used=used,
                source=source,
            )
        if kfd_used > bank:
            raise BackendError(
                "rocm",
                f"KFD allocations on GPU {gpu.physical_index} ({kfd_used} bytes) exceed its KFD "
                f"memory bank ({bank} bytes)",
            )
        if apu:
            source = SOURCE_APU
        else:
            source = SOURCE_PARTITION.format(k=gpu.partition or 0, n=gpu.partitions)
        return _reading(
            f"GPU {gpu.physical_index} (KFD memory bank)", total=bank, used=kfd_used, source=source
        )

    def _kfd_vram(self, gpu_id: int) -> dict[int, int] | None:
        """Bytes of VRAM per process on ``gpu_id`` from KFD's process files; ``None`` if absent."""
        proc = self._sysfs / "class" / "kfd" / "kfd" / "proc"
        try:
            pids = [int(p) for p in _files.listdir(proc) if p.isdigit()]
        except OSError:
            return None
        out: dict[int, int] = {}
        for pid in sorted(pids):
            try:
                out[pid] = self._reader.integer(proc / str(pid) / f"vram_{gpu_id}")
            except BackendError:
                continue  # the process exited, or does not use this GPU
        return out

    def _kfd_used(self, gpu_id: int) -> int | None:
        by_pid = self._kfd_vram(gpu_id)
        return None if by_pid is None else sum(by_pid.values())

    def holders(self, gpu: _Gpu) -> list[MemoryHolder] | None:
        if gpu.node is None:
            return None
        by_pid = self._kfd_vram(gpu.node.gpu_id)
        if by_pid is None:
            return None
        return [make_holder(pid, used) for pid, used in by_pid.items() if used > 0]


# ---------------------------------------------------------------------------------------------
# amdsmi

_amdsmi_lock = threading.Lock()
_amdsmi_initialised: object | None = None


def _after_fork() -> None:
    global _amdsmi_lock, _amdsmi_initialised
    _amdsmi_lock = threading.Lock()
    _amdsmi_initialised = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:160]
    return ""


def _import_amdsmi() -> tuple[Any, str]:
    """Import ``amdsmi`` defensively, through the vendor boundary.

    Returns:
        ``(module, "")`` on success, ``(None, reason)`` otherwise. While a capture records or a
        replay answers (:mod:`accelplat._boundary`), the module is a recording proxy or a
        stand-in answering from the bundle.

    Side effects:
        Imports ``amdsmi`` (which loads ``libamd_smi.so``), with anything it prints to stdout
        swallowed; never raises.
    """
    if _boundary.active() is None:
        return _import_amdsmi_live()

    def live() -> _boundary.Loaded:
        module, why = _import_amdsmi_live()
        return module, why, ""

    module, why, _ = _boundary.vendor("amdsmi", live)
    return module, why


def _import_amdsmi_live() -> tuple[Any, str]:
    if "amdsmi" in sys.modules:
        module = sys.modules["amdsmi"]
        if module is None:
            return None, "amdsmi is blocked (sys.modules['amdsmi'] is None)"
        return module, ""
    try:
        if importlib.util.find_spec("amdsmi") is None:
            return None, AMDSMI_NOT_INSTALLED
    except (ImportError, ValueError) as exc:
        return None, f"amdsmi cannot be located: {type(exc).__name__}: {exc}"
    printed: list[str] = []
    try:
        module = import_quietly("amdsmi", printed)
    except Exception as exc:
        said = _first_line("".join(printed))
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        hint = ""
        if isinstance(exc, KeyError):
            hint = " (ROCm's libamd_smi.so is missing)"
        elif isinstance(exc, AttributeError):
            hint = " (the installed ROCm is older than this amdsmi)"
        suffix = f"; it said {said!r}" if said else ""
        return None, f"import amdsmi failed{hint}: {detail}{suffix}"
    return module, ""


def _amdsmi_init(module: Any) -> None:
    global _amdsmi_initialised
    with _amdsmi_lock:
        if _amdsmi_initialised is module:
            return
        module.amdsmi_init()
        _amdsmi_initialised = module


def _vendor_name(exc: BaseException) -> str:
    return type(exc).__name__


class _AmdSmiSource(_Source):
    name = SOURCE_AMDSMI

    def __init__(self, module: Any) -> None:
        self._m = module
        self._gpus: list[_Gpu] | None = None

    def gpus(self) -> list[_Gpu]:
        if self._gpus is None:
            self._gpus = self._enumerate()
        return self._gpus

    def _enumerate(self) -> list[_Gpu]:
        m = self._m
        try:
            handles = list(m.amdsmi_get_processor_handles())
        except Exception as exc:
            raise BackendError(
                "rocm", f"amdsmi_get_processor_handles failed: {exc}", _vendor_name(exc)
            ) from exc
        rows: list[tuple[tuple[int, ...], Any, str | None, str | None]] = []
        for position, handle in enumerate(handles):
            hip_id: int | None = None
            uuid: str | None = None
            try:
                info = m.amdsmi_get_gpu_enumeration_info(handle)
                raw = info.get("hip_id")
                hip_id = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
                text = info.get("hip_uuid")
                uuid = text if isinstance(text, str) and text.startswith("GPU-") else None
            except Exception:
                pass  # older amdsmi: no enumeration info
            try:
                bdf: str | None = str(m.amdsmi_get_gpu_device_bdf(handle)).lower()
            except Exception:
                bdf = None
            rows.append(
                ((0 if hip_id is not None else 1, hip_id or 0, position), handle, uuid, bdf)
            )
        if any(key[0] for key, *_ in rows):  # no hip_id somewhere: PCI order for all
            rows.sort(key=lambda r: (pci_sort_key(r[3]), r[0][2]))
        else:
            rows.sort(key=lambda r: r[0])
        gpus = []
        for i, (_, handle, uuid, bdf) in enumerate(rows):
            name = "AMD GPU"
            arch: str | None = None
            with contextlib.suppress(Exception):
                asic = m.amdsmi_get_gpu_asic_info(handle)
                name = str(asic.get("market_name") or name)
                target = str(asic.get("target_graphics_version") or "").strip().lower()
                arch = target if _GFX_RE.match(target) else None
            gpus.append(_Gpu(i, name, uuid, bdf, handle=handle, arch=arch))
        return gpus

    def memory(self, gpu: _Gpu) -> MemoryInfo:
        m = self._m
        try:
            vram = m.AmdSmiMemoryType.VRAM
            total = int(m.amdsmi_get_gpu_memory_total(gpu.handle, vram))
            used = int(m.amdsmi_get_gpu_memory_usage(gpu.handle, vram))
        except Exception as exc:
            raise BackendError(
                "rocm",
                f"amdsmi memory query for GPU {gpu.physical_index} failed: {exc}",
                _vendor_name(exc),
            ) from exc
        return _reading(f"GPU {gpu.physical_index}", total=total, used=used, source=SOURCE_AMDSMI)

    def holders(self, gpu: _Gpu) -> list[MemoryHolder] | None:
        try:
            processes = list(self._m.amdsmi_get_gpu_process_list(gpu.handle))
        except Exception:
            return None
        holders: list[MemoryHolder] = []
        for entry in processes:
            if not isinstance(entry, Mapping):
                return None  # an older amdsmi returns opaque handles
            pid = entry.get("pid")
            usage = entry.get("memory_usage")
            vram = usage.get("vram_mem") if isinstance(usage, Mapping) else None
            if not isinstance(pid, int):
                continue
            if isinstance(vram, int) and vram > 0:
                holders.append(make_holder(pid, vram))
        return holders


# ---------------------------------------------------------------------------------------------
# torch (already imported by the caller)


class _TorchSource(_Source):
    name = SOURCE_TORCH
    context_free = False
    visible_applied = True

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def gpus(self) -> list[_Gpu]:
        try:
            count = int(self._torch.cuda.device_count())
        except Exception as exc:
            raise BackendError("rocm", f"torch.cuda.device_count() failed: {exc}") from exc
        return [_Gpu(i, "AMD GPU", None, None) for i in range(count)]

    def uuids(self) -> list[str | None] | None:
        return None

    def memory(self, gpu: _Gpu) -> MemoryInfo:
        try:
            free, total = self._torch.cuda.mem_get_info(gpu.physical_index)
        except Exception as exc:
            raise BackendError(
                "rocm", f"torch.cuda.mem_get_info({gpu.physical_index}) failed: {exc}"
            ) from exc
        free, total = int(free), int(total)
        return checked_memory(
            "rocm",
            f"GPU {gpu.physical_index}",
            free=free,
            total=total,
            used=max(0, total - free),  # derived: the rule judges what was read
            source=SOURCE_TORCH,
        )


def _torch_if_imported() -> tuple[Any, str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, ROCM_TORCH_NOT_IMPORTED
    hip = getattr(getattr(torch, "version", None), "hip", None)
    if not hip:
        return None, "the imported torch is not a ROCm build (torch.version.hip is unset)"
    return torch, ""


# ---------------------------------------------------------------------------------------------


class RocmPlatform(BasePlatform):
    """AMD GPUs under ROCm. See the module docstring for sources, order and visibility.

    Args:
        sysfs_root: The sysfs root; default ``ACCELPLAT_SYSFS_ROOT`` or ``/sys``.
        dev_root: The ``/dev`` root for render-node checks; default ``ACCELPLAT_DEV_ROOT`` or
            ``/dev`` (skipped when only the sysfs root is moved).
        read_text: How sysfs files are read (for tests).
        allow_amdsmi: Whether amdsmi may be used when sysfs has no AMD card.
        open_device: How a ``/dev`` node is checked, raising the ``OSError`` opening it gives
            (for tests; by default render nodes are opened read-write and closed at once, as the
            ROCm thunk opens them, and ``/dev/kfd`` is checked with ``access()``).
    """

    name: ClassVar[str] = "rocm"
    device_type: ClassVar[str] = "cuda"
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {
        "bf16": (FeatureRule(archs=("gfx908", "gfx90a", "gfx94*", "gfx95*", "gfx11*", "gfx12*")),),
        "fp8": (
            FeatureRule(archs=("gfx950", "gfx12*"), value="e4m3fn"),  # OCP formats
            FeatureRule(archs=("gfx94*",), value="e4m3fnuz"),  # MI300's own formats
        ),
        "fp4": (FeatureRule(archs=("gfx950",), value="mxfp4"),),  # MI350/MI355
        "mxfp4": (FeatureRule(archs=("gfx950",)),),
    }
    """Matrix-core formats by LLVM target, from AMD's CDNA/RDNA instruction-set documentation."""
    visible_devices_env: ClassVar[str | None] = ENV_CUDA_VISIBLE_DEVICES
    """vLLM's device-control variable on ROCm; HIP honours it when ``HIP_VISIBLE_DEVICES`` is
    empty or unset."""
    visible_devices_shadowed_by: ClassVar[tuple[str, ...]] = (ENV_HIP_VISIBLE_DEVICES,)
    """Takes precedence over :attr:`visible_devices_env` when non-empty; whoever sets
    ``CUDA_VISIBLE_DEVICES`` should set it to ``""`` (read as unset by HIP and vLLM)."""
    default_memory_utilization: ClassVar[float] = 0.92
    preferred_start_method: ClassVar[StartMethod] = "spawn"
    """Safe after device use: a forked child of a process that initialised HIP breaks, so vLLM's
    test helper spawns on ROCm (``requires_spawn_multiprocessing``). vLLM's engine workers fork
    by default and switch to spawn only once HIP is initialised, under Ray, or on WSL; accelplat's
    queries create no HIP context, so they do not force that switch."""
    RELEASE: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=True, stable_duration_s=2.0, settle_timeout_s=240.0, idle_floor_bytes=4 * GIB
    )
    """Lazy: VRAM returns from a kernel work queue after the holder exits (and TTM delays
    destroying buffers with pending fences), so waits need a 2 s stability window (vLLM's ROCm
    CI) and up to 240 s. Idle cards keep firmware, display and runtime buffers (~2.5 GiB seen on
    MI300), so a ratio threshold is floored at 4 GiB, as vLLM does for ratios below 5 %."""

    def __init__(
        self,
        *,
        sysfs_root: str | os.PathLike[str] | None = None,
        dev_root: str | os.PathLike[str] | None = None,
        read_text: ReadText | None = None,
        allow_amdsmi: bool = True,
        open_device: OpenDevice | None = None,
    ) -> None:
        self._open_device = open_device or _open_device
        self._sysfs_arg = None if sysfs_root is None else Path(sysfs_root)
        self._dev_arg = None if dev_root is None else Path(dev_root)
        self._reader = SysfsReader("rocm", read_text)
        self._allow_amdsmi = allow_amdsmi
        self._lock = threading.RLock()
        self._cache_key: tuple[Path, Path | None] | None = None
        self._source: _Source | None = None
        self._reasons: list[str] = []
        self._notes: list[str] = []
        self._amdsmi_failure: str | None = None

    @override
    def visible_devices_environment(self, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
        """Return ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` naming exactly ``devices``.

        Both name the GPUs by UUID (``GPU-…``, which HIP matches whatever ``ROCR_VISIBLE_DEVICES``
        left visible), else by HIP index, and carry the same text, because vLLM rejects the
        two when they differ. A UUID that more than one GPU carries (compute partitions may share
        their card's ``unique_id``) would select the first of them in HIP, so such GPUs are named
        by index. ``ROCR_VISIBLE_DEVICES`` is kept: the subset lies inside it.

        Args:
            devices: Devices as :meth:`devices` returned them.

        Returns:
            The two variables and their common value.
        """
        known: list[str | None] = [d.uuid for d in devices]
        with contextlib.suppress(AccelplatError):
            source = self._select()
            every = source.uuids() if source is not None else None
            if every is not None:
                known = every
        counts = Counter(u for u in known if u)
        text = ",".join(d.uuid if d.uuid and counts[d.uuid] <= 1 else str(d.index) for d in devices)
        return {ENV_HIP_VISIBLE_DEVICES: text, ENV_CUDA_VISIBLE_DEVICES: text}

    # -- configuration ------------------------------------------------------------------------

    def _roots(self) -> tuple[Path, Path | None]:
        env_sysfs = os.environ.get(ENV_SYSFS_ROOT)
        env_dev = os.environ.get(ENV_DEV_ROOT)
        sysfs = self._sysfs_arg or Path(env_sysfs or "/sys")
        if self._dev_arg is not None:
            dev: Path | None = self._dev_arg
        elif env_dev:
            dev = Path(env_dev)
        elif self._sysfs_arg is None and not env_sysfs:
            dev = Path("/dev")
        else:
            dev = None  # a moved sysfs tree says nothing about this process's /dev
        return sysfs, dev

    def refresh(self) -> None:
        """Forget the cached topology and source, so the next query scans again."""
        with self._lock:
            self._cache_key = None
            self._source = None

    def _select(self) -> _Source | None:
        key = self._roots()
        with self._lock:
            if self._cache_key == key and self._source is not None:
                return self._source
            sysfs, dev = key
            reasons: list[str] = []
            source: _Source | None = None
            topology = _scan_topology(sysfs, dev, self._reader, self._open_device)
            self._notes = topology.notes
            if topology.cards:
                source = _SysfsSource(sysfs, topology, self._reader)
            else:
                reasons.append(no_amd_gpu(sysfs / "class" / "drm"))
                reasons.extend(topology.notes[:3])
            if source is None and self._allow_amdsmi:
                if self._amdsmi_failure is None:
                    source = self._try_amdsmi()
                if source is None:
                    reasons.append(self._amdsmi_failure or "amdsmi failed")
            if source is None:
                torch, why = _torch_if_imported()
                if torch is None:
                    reasons.append(why)
                else:
                    source = _TorchSource(torch)
            self._reasons = reasons
            if source is not None:
                self._cache_key, self._source = key, source
            return source

    def _try_amdsmi(self) -> _Source | None:
        module, why = _import_amdsmi()
        if module is None:
            self._amdsmi_failure = why
            return None
        try:
            _amdsmi_init(module)
            candidate = _AmdSmiSource(module)
            if candidate.gpus():
                return candidate
            self._amdsmi_failure = "amdsmi reports no GPU"
        except Exception as exc:
            self._amdsmi_failure = f"amdsmi failed: {type(exc).__name__}: {exc}"
        return None

    def _require(self) -> _Source:
        source = self._select()
        if source is None:
            raise BackendError("rocm", "no memory source: " + "; ".join(self._reasons))
        return source

    def _visible(self) -> list[_Gpu]:
        source = self._require()
        gpus = source.gpus()
        if source.visible_applied:
            return list(gpus)
        order = visible_physical_indices(len(gpus), os.environ, source.uuids())
        return [gpus[i] for i in order]

    # -- Platform -----------------------------------------------------------------------------

    @property
    def context_free(self) -> bool:  # type: ignore[override]
        """``False`` only when memory comes from an already-imported torch."""
        source = self._select()
        return True if source is None else source.context_free

    @property
    @override
    def graph(self) -> GraphSupport:
        """HIP graphs through ``torch.cuda.CUDAGraph`` with a (ROCm) torch 2.0 or later.

        ROCm builds could not capture before hipGraph support was merged (pytorch PR 88202,
        February 2023, first released in torch 2.0).
        """
        return graph_support("torch.cuda.CUDAGraph", (2, 0), label="HIP graphs", flavour="rocm")

    @property
    def memory_source(self) -> str:
        """The source queries use now (``"sysfs"``, ``"amdsmi"``, the torch one), or ``""``."""
        source = self._select()
        return "" if source is None else source.name

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible GPUs, in torch's order.

        Raises:
            BackendError: When no source can enumerate GPUs.
            ConfigurationError: For malformed or conflicting visible-devices variables.

        Side effects:
            Reads sysfs (or amdsmi); imports no framework and creates no device context.
        """
        return [
            DeviceInfo(i, g.physical_index, g.name, g.uuid, g.pci_bus_id, arch=g.arch)
            for i, g in enumerate(self._visible())
        ]

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        source = self._require()
        gpu = self._visible()[device]
        try:
            return source.memory(gpu)
        except BackendError:
            self.refresh()  # a card may have gone; scan again next time
            raise

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the processes holding VRAM on ``device``, or ``None`` when unknown.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        index = self.check_device(device)
        source = self._require()
        return source.holders(self._visible()[index])

    @classmethod
    @override
    def probe(cls) -> ProbeResult:
        """Return whether ROCm GPUs are visible here; never raises.

        Side effects:
            Reads sysfs; when sysfs shows no AMD GPU, may import amdsmi (stdout swallowed).
            Never imports torch and creates no device context.
        """
        try:
            platform = cls()
            source = platform._select()
            if source is None:
                return ProbeResult(False, "; ".join(platform._reasons) or "no AMD GPU found")
            count = len(platform._visible())
            gpus = source.gpus()
            total = len(gpus)
        except AccelplatError as exc:
            return ProbeResult(False, str(exc))
        except Exception as exc:  # a probe must never raise
            return ProbeResult(False, f"probe failed: {type(exc).__name__}: {exc}")
        if total == 0:
            notes = "; ".join(platform._notes[:3])
            return ProbeResult(False, f"no GPU usable by the ROCm runtime ({notes or 'none'})")
        if count == 0:
            return ProbeResult(
                False, f"{total} AMD GPU(s) found, but the visible-devices variables hide all"
            )
        cards = {g.card.name for g in gpus if g.card is not None and g.partitions > 1}
        note = ""
        if cards:
            note = (
                f"; compute partitions on {len(cards)} card(s): each reports its KFD share of "
                f"the card's memory"
            )
        return ProbeResult(
            True, f"{count} of {total} AMD GPU(s) visible (source: {source.name}){note}"
        )
