"""Where the ``rocm`` platform's device lists and memory figures come from: sysfs, amdsmi, torch.

Sysfs ``mem_info_vram_*`` (a partition or GTT-backed APU: the KFD bank and ``vram_<gpu_id>``
files); amdsmi only when sysfs shows no AMD card; torch only when the caller imported a ROCm build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accelplat import _boundary, _files
from accelplat._backends._common import (
    SysfsReader,
    checked_memory,
    pci_sort_key,
    torch_reading,
)
from accelplat._backends._presence import AMDSMI_NOT_INSTALLED, ROCM_TORCH_NOT_IMPORTED
from accelplat._backends.rocm._topology import Gpu, Topology
from accelplat._types import MemoryHolder, MemoryInfo
from accelplat._util import clip
from accelplat._vendor import import_quietly, vendor_int
from accelplat._vendor.procs import make_holder
from accelplat.errors import BackendError

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

_GFX_RE = re.compile(r"^gfx[0-9a-f]{3,4}$")


def _reading(where: str, *, total: int, used: int, source: str) -> MemoryInfo:
    # sysfs and amdsmi report only total and used; free is derived.
    return checked_memory(
        "rocm", where, free=max(0, total - used), total=total, used=used, source=source
    )


class Source:  # where device lists and memory figures come from
    name: str = ""
    context_free: bool = True  # False: torch's devices, the visible-devices variables applied
    uuids_known: bool = True

    def gpus(self) -> list[Gpu]:
        raise NotImplementedError

    def uuids(self) -> list[str | None] | None:
        return [g.uuid for g in self.gpus()] if self.uuids_known else None

    def memory(self, gpu: Gpu) -> MemoryInfo:
        raise NotImplementedError

    def holders(self, gpu: Gpu) -> list[MemoryHolder] | None:
        return None


class SysfsSource(Source):
    name = SOURCE_SYSFS

    def __init__(self, sysfs: Path, topology: Topology, reader: SysfsReader) -> None:
        self._sysfs = sysfs
        self._topology = topology
        self._reader = reader
        # without a KFD topology (cards in PCI order) no GPU has a node, or a UUID
        self.uuids_known = all(gpu.node is not None for gpu in topology.gpus)

    def gpus(self) -> list[Gpu]:
        return self._topology.gpus

    def memory(self, gpu: Gpu) -> MemoryInfo:
        if gpu.card is None:
            raise BackendError(
                "rocm",
                f"GPU {gpu.physical_index} (KFD node {gpu.node.node if gpu.node else '?'}) "
                f"matches no card under {self._sysfs / 'class' / 'drm'}; its memory is unknown",
            )
        device = gpu.card.path / "device"
        total = self._reader.integer(device / "mem_info_vram_total")
        used = self._reader.integer(device / "mem_info_vram_used")
        bank = gpu.node.bank_bytes if gpu.node is not None else None
        # An APU with apu_prefer_gtt (VRAM carve-out smaller than GTT, amdgpu_ttm.c) gives KFD the
        # TTM page limit, not VRAM (amdgpu_amdkfd_get_local_mem_info): its bank exceeds the
        # carve-out that mem_info_vram_* show, and used there does not move while torch allocates.
        apu = gpu.partitions == 1 and bank is not None and bank > total
        where = f"GPU {gpu.physical_index} ({device}/mem_info_vram_{{total,used}})"
        if gpu.partitions == 1 and not apu:
            return _reading(where, total=total, used=used, source=SOURCE_SYSFS)
        # A partition gets mem_partition.size / num_xcp_per_mem_partition (CAPPING_EVEN,
        # amdgpu_amdkfd_xcp_memory_size): its KFD bank, which HIP reports; sysfs and amdsmi give
        # every partition the whole card (ROCm/amdsmi#97, ROCm/ROCm#4750).
        by_pid = self._kfd_vram(gpu)
        if bank is None or by_pid is None:
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
            return _reading(where, total=total, used=used, source=source)
        source = SOURCE_PARTITION.format(k=gpu.partition or 0, n=gpu.partitions)
        where, used = f"GPU {gpu.physical_index} (KFD memory bank)", sum(by_pid.values())
        return _reading(where, total=bank, used=used, source=SOURCE_APU if apu else source)

    def _kfd_vram(self, gpu: Gpu) -> dict[int, int] | None:
        # Bytes of VRAM per process on the GPU from KFD's process files; None if absent.
        if gpu.node is None:
            return None
        proc = self._sysfs / "class" / "kfd" / "kfd" / "proc"
        try:
            pids = [int(p) for p in _files.listdir(proc) if p.isascii() and p.isdigit()]
        except OSError:
            return None
        out: dict[int, int] = {}
        for pid in sorted(pids):
            try:
                out[pid] = self._reader.integer(proc / str(pid) / f"vram_{gpu.node.gpu_id}")
            except BackendError:
                continue  # the process exited, or does not use this GPU
        return out

    def holders(self, gpu: Gpu) -> list[MemoryHolder] | None:
        by_pid = self._kfd_vram(gpu)
        if by_pid is None:
            return None
        return [make_holder(pid, used) for pid, used in by_pid.items() if used > 0]


_amdsmi_lock = threading.Lock()
_amdsmi_initialised: object | None = None


def _after_fork() -> None:
    global _amdsmi_lock, _amdsmi_initialised
    _amdsmi_lock = threading.Lock()
    _amdsmi_initialised = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
_boundary.on_reset(_after_fork)  # amdsmi comes through the boundary: initialise it afresh


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
        said = next((s.strip()[:160] for s in "".join(printed).splitlines() if s.strip()), "")
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        hint = ""
        # PyPI's amdsmi (community builds up to 7.0.2) bundles no library: without a ROCm whose
        # libamd_smi.so matches, it prints, then raises KeyError('libamd_smi.so') (AMD SMI docs,
        # "AMD SMI packaging and install paths"; docs/getting-started.md, "AMD SMI").
        if isinstance(exc, KeyError):
            hint = (
                " (ROCm's libamd_smi.so is missing: the PyPI amdsmi wheel, the `amd` extra, "
                "needs a ROCm of the same version; use the amdsmi ROCm ships in "
                "/opt/rocm/share/amd_smi, or none: sysfs serves AMD GPUs)"
            )
        elif isinstance(exc, AttributeError):
            hint = " (the installed ROCm is older than this amdsmi)"
        suffix = f"; it said {said!r}" if said else ""
        return None, f"import amdsmi failed{hint}: {detail}{suffix}"
    return module, ""


def amdsmi_source() -> tuple[Source | None, str]:
    """Return amdsmi's source (initialised once per process) and ``""``, or ``None`` and why not."""
    global _amdsmi_initialised
    # Imported through the boundary (a replay answers), its output swallowed.
    module, why, _ = _boundary.vendor("amdsmi", lambda: (*_import_amdsmi_live(), ""))
    if module is None:
        return None, why
    try:
        with _amdsmi_lock:
            if _amdsmi_initialised is not module:
                module.amdsmi_init()
                _amdsmi_initialised = module
        source = AmdSmiSource(module)
        return (source, "") if source.gpus() else (None, "amdsmi reports no GPU")
    except Exception as exc:
        return None, f"amdsmi failed: {type(exc).__name__}: {exc}"


class AmdSmiSource(Source):
    name = SOURCE_AMDSMI

    def __init__(self, module: Any) -> None:
        self._m = module
        # The GPUs, once: handles stay valid while amdsmi is initialised.
        try:
            handles = list(module.amdsmi_get_processor_handles())
        except Exception as exc:
            raise BackendError(
                "rocm", f"amdsmi_get_processor_handles failed: {exc}", type(exc).__name__
            ) from exc
        rows: list[tuple[int | None, Gpu]] = []
        for position, handle in enumerate(handles):
            hip_id: int | None = None
            uuid: str | None = None
            bdf: str | None = None
            name, arch = "AMD GPU", None
            with contextlib.suppress(Exception):  # older amdsmi: no enumeration info
                info = module.amdsmi_get_gpu_enumeration_info(handle)
                raw, text = info.get("hip_id"), info.get("hip_uuid")
                hip_id = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
                uuid = text if isinstance(text, str) and text.startswith("GPU-") else None
            with contextlib.suppress(Exception):
                bdf = str(module.amdsmi_get_gpu_device_bdf(handle)).lower()
            with contextlib.suppress(Exception):
                asic = module.amdsmi_get_gpu_asic_info(handle)
                name = str(asic.get("market_name") or name)
                target = str(asic.get("target_graphics_version") or "").strip().lower()
                arch = target if _GFX_RE.match(target) else None
            rows.append((hip_id, Gpu(position, name, uuid, bdf, handle=handle, arch=arch)))
        # amdsmi's handle order may differ from HIP's, hence hip_id; one missing: PCI order for all
        # (the sort is stable: ties keep the handle order)
        if all(hip_id is not None for hip_id, _ in rows):
            rows.sort(key=lambda r: r[0] or 0)
        else:
            rows.sort(key=lambda r: pci_sort_key(r[1].pci_bus_id))
        self._gpus = [dataclasses.replace(gpu, physical_index=i) for i, (_, gpu) in enumerate(rows)]

    def gpus(self) -> list[Gpu]:
        return self._gpus

    def memory(self, gpu: Gpu) -> MemoryInfo:
        # Bytes (they wrap the sysfs files). Never amdsmi_get_gpu_vram_usage: MB, and seen stale
        # on MI355X with ROCm 7.0 (ROCm/amdsmi#175).
        where = f"GPU {gpu.physical_index}"
        try:
            vram = self._m.AmdSmiMemoryType.VRAM
            total = self._m.amdsmi_get_gpu_memory_total(gpu.handle, vram)
            used = self._m.amdsmi_get_gpu_memory_usage(gpu.handle, vram)
        except Exception as exc:
            why = f"amdsmi memory query for {where} failed: {clip(str(exc), 400)}"
            raise BackendError("rocm", why, type(exc).__name__) from exc
        total = vendor_int("rocm", where, "total", total)
        used = vendor_int("rocm", where, "used", used)
        return _reading(where, total=total, used=used, source=SOURCE_AMDSMI)

    def holders(self, gpu: Gpu) -> list[MemoryHolder] | None:
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
            if type(pid) is int and pid > 0 and type(vram) is int and vram > 0:
                holders.append(make_holder(pid, vram))
        return holders


class TorchSource(Source):
    name = SOURCE_TORCH
    context_free = False
    uuids_known = False

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def gpus(self) -> list[Gpu]:
        try:
            count = int(self._torch.cuda.device_count())
        except Exception as exc:
            raise BackendError("rocm", f"torch.cuda.device_count() failed: {exc}") from exc
        return [Gpu(i, "AMD GPU", None, None) for i in range(count)]

    def memory(self, gpu: Gpu) -> MemoryInfo:
        index = gpu.physical_index
        fn = self._torch.cuda.mem_get_info
        return torch_reading("rocm", fn, index, SOURCE_TORCH, f"GPU {index}")


def torch_if_imported() -> tuple[Any, str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, ROCM_TORCH_NOT_IMPORTED
    hip = getattr(getattr(torch, "version", None), "hip", None)
    if not hip:
        return None, "the imported torch is not a ROCm build (torch.version.hip is unset)"
    return torch, ""
