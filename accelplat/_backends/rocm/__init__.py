"""The ``rocm`` platform: AMD GPUs through sysfs, amdsmi, or (last) an already-imported torch.

GPUs in HIP's order (:mod:`._topology`), their memory (:mod:`._sources`), the visible ones
(:mod:`accelplat._visible.rocm`). The sysfs and ``/dev`` roots are read again on every query.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from accelplat import _files
from accelplat._backends._common import (
    EMULATED_FP8,
    ENV_SYSFS_ROOT,
    ReadText,
    SysfsReader,
    never_raises,
)
from accelplat._backends._presence import no_amd_gpu
from accelplat._backends.rocm import _sources, _topology
from accelplat._platform import BasePlatform, StartMethod, override
from accelplat._types import (
    GIB,
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat._vendor.versions import graph_support
from accelplat._visible.rocm import (
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_HIP_VISIBLE_DEVICES,
    visible_physical_indices,
)
from accelplat.errors import AccelplatError, BackendError

ENV_DEV_ROOT = "ACCELPLAT_DEV_ROOT"


class RocmPlatform(BasePlatform):
    """AMD GPUs under ROCm (``docs/backends/rocm.md``)."""

    name: ClassVar[str] = "rocm"
    device_type: ClassVar[str] = "cuda"
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {
        "bf16": (FeatureRule(archs=("gfx908", "gfx90a", "gfx94*", "gfx95*", "gfx11*", "gfx12*")),),
        # vLLM's supports_fp8() is on_cdna() or on_rdna(): every gfx9 and gfx1250 (CDNA), gfx11
        # and gfx12 (RDNA); older targets emulate it (vllm/platforms/rocm.py, vLLM 0.33).
        "fp8": (
            FeatureRule(archs=("gfx94*",), value="e4m3fnuz", note="native"),  # MI300's format
            FeatureRule(archs=("gfx950", "gfx12*"), value="e4m3fn", note="native"),  # OCP
            FeatureRule(archs=("gfx9*", "gfx11*"), value="e4m3fn", note=EMULATED_FP8),
        ),
        "fp8-native": (
            FeatureRule(archs=("gfx94*",), value="e4m3fnuz"),
            FeatureRule(archs=("gfx950", "gfx12*"), value="e4m3fn"),
        ),
        "fp4": (FeatureRule(archs=("gfx950",), value="mxfp4"),),  # MI350/MI355
        # vLLM's supports_mx(): gfx95* or gfx1250
        "mxfp4": (FeatureRule(archs=("gfx95*", "gfx1250")),),
    }  # matrix-core formats by LLVM target, from AMD's CDNA/RDNA instruction-set documentation
    # vLLM's device_control_env_var on ROCm; HIP reads it when HIP_VISIBLE_DEVICES is empty or
    # unset (ROCm/clr rocdevice.cpp), so whoever sets it should set HIP_VISIBLE_DEVICES to "".
    visible_devices_env: ClassVar[str | None] = ENV_CUDA_VISIBLE_DEVICES
    visible_devices_shadowed_by: ClassVar[tuple[str, ...]] = (ENV_HIP_VISIBLE_DEVICES,)
    # NVML, KFD and Level Zero name processes by host pid: no pid-namespace support (NVML docs).
    holder_pids_are_host_pids: ClassVar[bool] = True
    # A forked child of a process that initialised HIP breaks: vLLM's test helper spawns on ROCm
    # (requires_spawn_multiprocessing); accelplat's own queries create no HIP context.
    preferred_start_method: ClassVar[StartMethod] = "spawn"
    # KFD frees a process's buffers from kfd_process_wq work after it exits, so memory returns
    # over seconds: vLLM's ROCm helper waits for 2 s of stability, up to 240 s. An idle MI300 keeps
    # ~2.5 GiB resident, so ratio thresholds below 5 % are floored at 4 GiB, as vLLM does
    # (tests/utils.py wait_for_gpu_memory_to_clear, vLLM 0.33).
    RELEASE: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=True, stable_duration_s=2.0, settle_timeout_s=240.0, idle_floor_bytes=4 * GIB
    )

    def __init__(
        self,
        *,
        sysfs_root: str | os.PathLike[str] | None = None,  # default ACCELPLAT_SYSFS_ROOT or /sys
        dev_root: str | os.PathLike[str] | None = None,  # None: ACCELPLAT_DEV_ROOT, /dev or none
        read_text: ReadText | None = None,
        allow_amdsmi: bool = True,  # when sysfs has no AMD card
        open_device: _topology.OpenDevice | None = None,  # raises the OSError opening a node gives
    ) -> None:
        self._open_device = open_device or _topology.open_node
        self._sysfs_arg = None if sysfs_root is None else Path(sysfs_root)
        self._dev_arg = None if dev_root is None else Path(dev_root)
        self._read = read_text or _files.read_text
        self._allow_amdsmi = allow_amdsmi
        self._lock = threading.RLock()
        self._cache_key: tuple[Path, Path | None] | None = None
        self._source: _sources.Source | None = None
        self._reasons: list[str] = []
        self._notes: list[str] = []
        self._amdsmi_failure = ""  # why amdsmi failed (it is not tried again)

    @override
    def visible_devices_environment(self, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
        """Return ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES``, naming ``devices``."""
        # The same text in both (vLLM rejects them differing): UUIDs, but indices for GPUs sharing
        # one (partitions may share the card's unique_id; HIP takes the first). ROCR_* is kept.
        known: list[str | None] = [d.uuid for d in devices]
        with contextlib.suppress(AccelplatError):
            source = self._select()
            known = (source.uuids() if source is not None else None) or known
        counts = Counter(u for u in known if u)
        text = ",".join(d.uuid if d.uuid and counts[d.uuid] <= 1 else str(d.index) for d in devices)
        return {ENV_HIP_VISIBLE_DEVICES: text, ENV_CUDA_VISIBLE_DEVICES: text}

    def _roots(self) -> tuple[Path, Path | None]:
        env_sysfs, env_dev = os.environ.get(ENV_SYSFS_ROOT), os.environ.get(ENV_DEV_ROOT)
        dev = self._dev_arg or (Path(env_dev) if env_dev else None)
        if dev is None and self._sysfs_arg is None and not env_sysfs:
            dev = Path("/dev")  # only the real sysfs tree speaks of this process's /dev
        return self._sysfs_arg or Path(env_sysfs or "/sys"), dev

    def refresh(self) -> None:
        """Forget the cached topology and source: the next query scans again."""
        with self._lock:
            self._cache_key, self._source = None, None

    def _select(self) -> _sources.Source | None:
        key = self._roots()
        with self._lock:
            if self._cache_key != key or self._source is None:  # a found source is kept
                self._cache_key, self._source = key, self._find_source(*key)
            return self._source

    def _find_source(self, sysfs: Path, dev: Path | None) -> _sources.Source | None:
        """Return the first source that answers (the reasons the others did not: ``_reasons``)."""
        topology = _topology.scan_topology(sysfs, dev, self._read, self._open_device)
        self._notes = topology.notes
        if topology.cards:
            return _sources.SysfsSource(sysfs, topology, SysfsReader("rocm", self._read))
        self._reasons = [no_amd_gpu(sysfs / "class" / "drm"), *topology.notes[:3]]
        if self._allow_amdsmi:
            if not self._amdsmi_failure:
                source, self._amdsmi_failure = _sources.amdsmi_source()
                if source is not None:
                    return source
            self._reasons.append(self._amdsmi_failure)
        torch, why = _sources.torch_if_imported()
        if torch is not None:
            return _sources.TorchSource(torch)
        self._reasons.append(why)
        return None

    def _visible(self) -> tuple[_sources.Source, list[_topology.Gpu]]:
        source = self._select()  # once per query: it scans, and the variables are parsed once
        if source is None:
            raise BackendError("rocm", "no memory source: " + "; ".join(self._reasons))
        gpus = source.gpus()
        if not source.context_free:  # torch applied the visible-devices variables
            return source, list(gpus)
        order = visible_physical_indices(len(gpus), os.environ, source.uuids())
        return source, [gpus[i] for i in order]

    @property
    def context_free(self) -> bool:  # type: ignore[override]
        """``False`` only when memory comes from an already-imported torch."""
        source = self._select()
        return True if source is None else source.context_free

    @property
    @override
    def graph(self) -> GraphSupport:
        """HIP graphs through ``torch.cuda.CUDAGraph`` with a (ROCm) torch 2.0 or later."""
        # ROCm builds could not capture before hipGraph support (pytorch PR 88202, Feb 2023).
        return graph_support("torch.cuda.CUDAGraph", (2, 0), label="HIP graphs", flavour="rocm")

    @property
    def memory_source(self) -> str:
        """The source queries use now (``"sysfs"``, ``"amdsmi"``, the torch one), or ``""``."""
        source = self._select()
        return "" if source is None else source.name

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        return [
            DeviceInfo(i, g.physical_index, g.name, g.uuid, g.pci_bus_id, g.arch, g.capability)
            for i, g in enumerate(self._visible()[1])
        ]

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        source, gpus = self._visible()
        try:
            return source.memory(gpus[device])
        except BackendError:
            self.refresh()  # a card may have gone; scan again next time
            raise

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        source, gpus = self._visible()
        return source.holders(gpus[self.check_device(device)])

    @classmethod
    @override
    @never_raises
    def probe(cls) -> ProbeResult:
        """Say whether ROCm GPUs are visible here (sysfs, else amdsmi with its output swallowed)."""
        platform = cls()
        if platform._select() is None:
            return ProbeResult(False, "; ".join(platform._reasons) or "no AMD GPU found")
        source, visible = platform._visible()
        gpus = source.gpus()
        if not gpus:
            notes = "; ".join(platform._notes[:3])
            return ProbeResult(False, f"no GPU usable by the ROCm runtime ({notes or 'none'})")
        if not visible:
            return ProbeResult(
                False, f"{len(gpus)} AMD GPU(s) found, but the visible-devices variables hide all"
            )
        cards = {g.card.name for g in gpus if g.card is not None and g.partitions > 1}
        share = "each reports its KFD share of the card's memory"
        note = f"; compute partitions on {len(cards)} card(s): {share}" if cards else ""
        return ProbeResult(
            True, f"{len(visible)} of {len(gpus)} AMD GPU(s) visible (source: {source.name}){note}"
        )
