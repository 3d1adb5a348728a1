"""The ``xpu`` platform: Intel GPUs through Level Zero Sysman, or torch.xpu when allowed.

Memory: Sysman's memory modules summed over a device's tiles; torch only when the caller imported
it or ``ACCELPLAT_XPU_ALLOW_TORCH=1``. Cards: Sysman (or sysfs) in Level Zero core's order, then the
oneAPI variables (:mod:`accelplat._visible.oneapi`). ``docs/backends/xpu.md`` has the rules.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from accelplat import _files
from accelplat._backends._common import (
    EMULATED_FP8,
    ENV_SYSFS_ROOT,
    INTEL_VENDOR_ID,
    checked_memory,
    never_raises,
    parse_key_values,
    pci_sort_key,
    read_or_empty,
    torch_reading,
    vendor_cards,
)
from accelplat._backends._presence import level_zero_loader_name, level_zero_not_found, no_intel_gpu
from accelplat._platform import BasePlatform, StartMethod, override
from accelplat._types import (
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat._vendor import facts, import_quietly
from accelplat._vendor import levelzero as lz
from accelplat._vendor.procs import make_holder
from accelplat._vendor.versions import graph_support
from accelplat._visible.oneapi import (
    ENV_AFFINITY_MASK,
    ENV_DEVICE_SELECTOR,
    ENV_FLAT_DEVICE_HIERARCHY,
    Hierarchy,
    XpuTarget,
    affinity_mask_for,
    default_devices,
    parse_hierarchy,
    visible_targets,
)
from accelplat.errors import BackendError, LevelZeroError

ENV_ALLOW_TORCH = "ACCELPLAT_XPU_ALLOW_TORCH"
ENV_INTEGRATED = "ACCELPLAT_XPU_INTEGRATED"
ENV_PCI_ORDER = "ZE_ENABLE_PCI_ID_DEVICE_ORDER"

SOURCE_SYSMAN = "level-zero-sysman"
SOURCE_TORCH = "torch.xpu (creates a device context)"
SOURCE_ACCELERATOR = "torch.accelerator (creates a device context)"
SOURCE_IPEX = "ipex xpu.mem_get_info (creates a device context)"

_TOTAL_TOLERANCE_DIVISOR = 256  # a torch total 0.4 % off total_memory is a shifted total
_DRIVERS = ("xe", "i915")
_INTEGRATED_SLOT = "0000:00:02.0"  # where Intel integrated GPUs sit on the PCI bus
_TILE_RE = re.compile(r"^tile(\d+)$")
_GT_RE = re.compile(r"^gt(\d+)$")
_CAP_SYS_ADMIN = 21
_CAP_PERFMON = 38
_TRUE = ("1", "true", "yes", "on")
_INIT_USER_NS = ["0", "0", "4294967295"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def usage_visible_to_this_process(status_text: str, uid_map_text: str) -> bool:
    """Whether ``perfmon_capable()`` passes: CapEff (else root) and the initial user namespace."""
    # i915 (i915_query.c query_memregion_info), and xe before upstream 4d0b035fd6da (stable
    # 6.8+ from late 2025), show real usage only if perfmon_capable(): capable(CAP_PERFMON) ||
    # capable(CAP_SYS_ADMIN), which checks the *initial* user namespace (linux/capability.h).
    lines = [line.split() for line in uid_map_text.splitlines() if line.strip()]
    if lines and lines != [_INIT_USER_NS]:
        return False  # a user namespace: its capabilities do not reach the kernel's check
    with contextlib.suppress(KeyError, ValueError):
        caps = int(parse_key_values(status_text, sep=":")["CapEff"], 16)
        return bool(caps & (1 << _CAP_PERFMON) or caps & (1 << _CAP_SYS_ADMIN))
    return os.geteuid() == 0 if hasattr(os, "geteuid") else False


def xe_arch(device_id: int) -> str | None:
    """Return the Intel GPU architecture of a PCI device id (``0x0BD5`` -> ``"pvc"``) or None.

    The ranges are the kernel's Intel PCI id tables (``xe_arch_by_device_id`` in the package data
    file ``accelplat/_vendor/vendor_facts.json``).
    """
    ranges = facts("xe_arch_by_device_id")
    return next(
        (a for low, high, a, _ in ranges if int(low, 16) <= device_id <= int(high, 16)), None
    )


def _hidden_usage(driver: str) -> str:
    """Say why a zero usage reading on a card bound to ``driver`` is (i915) or may be hidden."""
    hint = (
        "grant CAP_PERFMON (docker run --cap-add PERFMON; it does not count inside a user "
        "namespace)"
    )
    if driver == "i915":
        return (
            "i915 hides memory usage from processes without CAP_PERFMON or CAP_SYS_ADMIN in the "
            "initial user namespace (it reports everything unallocated), so this zero is hidden "
            f"usage, not a reading; {hint}"
        )
    what = "xe" if driver == "xe" else "the card's driver (unknown here)"
    return (
        f"Level Zero reports no memory in use, but {what} may hide usage from this process: "
        "i915, and xe kernels without upstream commit 4d0b035fd6da (backported to stable 6.8+ in "
        "late 2025), hide it from processes without CAP_PERFMON or CAP_SYS_ADMIN, and this "
        f"process has neither in the initial user namespace; {hint}"
    )


class _Card(NamedTuple):  # one Intel GPU, in Level Zero's order
    pci_bus_id: str | None
    name: str
    uuid: str | None
    integrated: bool
    tiles: int
    kernel_driver: str  # xe or i915 when sysfs shows the card, else ""
    sysman: lz.SysmanDevice | None = None
    arch: str | None = None


def _default_hierarchy(cards: Sequence[_Card]) -> tuple[Hierarchy, str]:
    """The device model the driver defaults to for ``cards``, and a note when it is assumed."""
    # compute-runtime: COMPOSITE (the spec's default, gfx_core_helper_base.inl), except FLAT on
    # Xe HPC (gfx_core_helper_xe_hpc_core.cpp) from 23.43.27642 (commit 3fdcf049bf, Oct 2023).
    # The driver version needs Level Zero's core API, so on a Max FLAT is assumed, and said.
    if cards and (cards[0].arch == "pvc" or "Data Center GPU Max" in cards[0].name):  # Xe HPC
        return Hierarchy.FLAT, (
            f"{ENV_FLAT_DEVICE_HIERARCHY} unset: FLAT assumed (the default on Data Center GPU "
            f"Max from driver 23.43; older drivers default to COMPOSITE), set it to be sure"
        )
    return Hierarchy.COMPOSITE, ""


def _tile_uuid(card_uuid: str | None, tiles: tuple[int, ...] | None) -> str | None:
    """The UUID the driver gives a device that is one tile of a card, else the card's."""
    # compute-runtime builds UUIDs from PCI bus info with the sub-device id in the last byte: 0
    # for the card, tile + 1 for a tile. torch.xpu lists the tiles of a Max 1550 at bus 0x1a as
    # 8680d50b-2f00-0000-1a00-000000000001 and ...-000000000002 (intel/torch-xpu-ops#3585).
    if card_uuid is None or tiles is None or len(tiles) != 1 or not card_uuid.endswith("00"):
        return card_uuid
    return f"{card_uuid[:-2]}{tiles[0] + 1:02x}"


def _order(cards: list[_Card]) -> list[_Card]:
    # Level Zero core's order, which Sysman does not follow: discrete first, then PCI address;
    # sorting precedes the mask (execution_environment.cpp comparePciIdBusNumber).
    # The loader's getenv_tobool (source/inc/ze_util.h) accepts only "1"; the spec lists {0, 1}.
    if os.environ.get(ENV_PCI_ORDER) == "1":
        return sorted(cards, key=lambda c: pci_sort_key(c.pci_bus_id))
    return sorted(cards, key=lambda c: (c.integrated, pci_sort_key(c.pci_bus_id)))


def _scan_sysfs(sysfs: Path) -> tuple[list[_Card], str]:
    """Return the Intel GPUs bound to xe/i915 under ``sysfs``, and a note when there are none."""
    drm = sysfs / "class" / "drm"
    found, note = vendor_cards(drm, INTEL_VENDOR_ID, _files.read_text)
    if note:
        return [], note
    cards: list[_Card] = []
    others: list[str] = []
    for entry, device, pci in found:
        driver = _driver(device)
        if driver not in _DRIVERS:
            others.append(f"{entry} ({driver or 'no driver'})")
            continue
        integrated = pci == _INTEGRATED_SLOT
        # xe lists device/tile<N>, i915 gt<N>; an integrated i915 GPU lists its media GT as gt1
        where, pattern = (device, _TILE_RE) if driver == "xe" else (drm / entry / "gt", _GT_RE)
        tiles = 1
        with contextlib.suppress(OSError):
            if driver == "xe" or not integrated:
                tiles = max(1, sum(1 for n in _files.listdir(where) if pattern.match(n)))
        device_id = read_or_empty(device / "device").strip()
        arch: str | None = None
        with contextlib.suppress(ValueError):
            arch = xe_arch(int(device_id, 16))
        name = f"Intel GPU {device_id}".strip()
        cards.append(_Card(pci, name, None, integrated, tiles, driver, None, arch))
    note = "" if cards else no_intel_gpu(drm)
    if others and not cards:
        note += f" (Intel devices with other drivers: {', '.join(others)})"
    return _order(cards), note


def _driver(device: Path) -> str:
    link = device / "driver"
    with contextlib.suppress(OSError):
        if link.is_symlink() or _files.exists(link):
            return os.path.basename(_files.realpath(link))
    return parse_key_values(read_or_empty(device / "uevent"), sep="=").get("DRIVER", "")


_PLATFORMS: weakref.WeakSet[XpuPlatform] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for platform in list(_PLATFORMS):
        platform._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class XpuPlatform(BasePlatform):
    """Intel GPUs through Level Zero (``docs/backends/xpu.md``); ``None`` arguments: detected."""

    name: ClassVar[str] = "xpu"
    device_type: ClassVar[str] = "xpu"
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {
        "bf16": (FeatureRule(archs=("pvc", "dg2", "bmg", "lnl", "mtl", "arl")),),
        # vLLM's supports_fp8() is true on every XPU (vllm/platforms/xpu.py); no Xe matrix
        # engine of these has fp8, so it is emulated, and there is no fp8-native rule.
        "fp8": (FeatureRule(value="e4m3fn", note=EMULATED_FP8),),
    }  # bfloat16 on every Xe architecture torch's XPU builds target; no fp4 hardware rule
    visible_devices_env: ClassVar[str | None] = ENV_AFFINITY_MASK  # vLLM's device_control_env_var
    default_memory_utilization: ClassVar[float] = 0.9  # vLLM's test runner on XPU (conftest.py)
    preferred_start_method: ClassVar[StartMethod] = "spawn"  # vLLM: the only one XPU supports
    # Sysman's zesDeviceProcessesGetState names processes by host pid (no pid-namespace support).
    holder_pids_are_host_pids: ClassVar[bool] = True
    # vLLM's helper waits on XPU as on ROCm ("reclaims GPU memory more lazily than CUDA"): 2 s of
    # stability, up to 240 s. No idle floor: vLLM applies none on XPU.
    RELEASE: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=True, stable_duration_s=2.0, settle_timeout_s=240.0, idle_floor_bytes=0
    )

    def __init__(
        self,
        *,
        sysfs_root: str | os.PathLike[str] | None = None,  # default ACCELPLAT_SYSFS_ROOT or /sys
        level_zero: Any = None,  # a library object instead of libze_loader.so.1; False: none
        allow_torch: bool | None = None,  # may accelplat import torch (an imported one is used)
        usage_visible: bool | None = None,  # does the kernel show usage (None: from proc_root)
        proc_root: str | os.PathLike[str] | None = None,  # self/status and self/uid_map
    ) -> None:
        self._sysfs_arg = None if sysfs_root is None else Path(sysfs_root)
        self._lz_arg = level_zero
        self._allow_torch = allow_torch
        self._usage_visible = usage_visible
        self._proc = Path(proc_root) if proc_root is not None else Path("/proc")
        self._lock = threading.RLock()
        self._sysman: lz.Sysman | None = None
        self._sysman_failure: str | None = None
        self._sysman_cards: list[_Card] | None = None
        self._torch_import_failure: str | None = None
        self._torch_totals: dict[int, int] = {}
        _PLATFORMS.add(self)

    def _after_fork(self) -> None:
        # "Each forked process must call" zesInit (zes_api.h): the parent's handles are not valid.
        self._lock = threading.RLock()
        self._sysman_cards = None
        self._torch_totals = {}
        if self._sysman is not None:
            self._sysman.after_fork()

    def _sysfs(self) -> Path:
        return self._sysfs_arg or Path(os.environ.get(ENV_SYSFS_ROOT) or "/sys")

    def _torch_allowed(self) -> bool:
        return self._allow_torch if self._allow_torch is not None else _flag(ENV_ALLOW_TORCH)

    def _cards_from_level_zero(self) -> list[_Card] | None:
        # Sysman's Intel GPUs, or None (the reason is kept in _sysman_failure).
        with self._lock:
            if self._sysman_cards is None and self._sysman_failure is None:
                self._sysman_cards, self._sysman_failure = self._scan_level_zero()
            cards = self._sysman_cards
        return None if cards is None else _order(cards)  # the order variable is read every time

    def _scan_level_zero(self) -> tuple[list[_Card] | None, str | None]:
        """Sysman's Intel GPUs, or ``None`` and why not."""
        if self._sysman is None:
            lib = self._lz_arg
            if lib is False:
                return None, "Level Zero disabled"
            if lib is None:
                name = level_zero_loader_name()
                try:
                    lib = lz.load_loader(name)
                except OSError as exc:
                    return None, level_zero_not_found(name, exc)
            self._sysman = lib if isinstance(lib, lz.Sysman) else lz.Sysman(lib)
        try:
            failed = "Sysman unavailable"
            self._sysman.init()
            failed = "device enumeration failed"
            found = self._sysman.devices()
        except LevelZeroError as exc:
            self._sysman = None
            return None, f"Level Zero {failed}: {exc}"
        drivers = {c.pci_bus_id: c.kernel_driver for c in _scan_sysfs(self._sysfs())[0]}
        cards: list[_Card] = []
        for d in found:
            tiles = max(1, d.num_subdevices)
            driver, arch = drivers.get(d.pci_bus_id, ""), xe_arch(d.device_id)
            cards.append(_Card(d.pci_bus_id, d.name, d.uuid, d.integrated, tiles, driver, d, arch))
        return cards, None

    def _torch(self) -> tuple[Any, str]:
        torch = sys.modules.get("torch")
        if torch is None:
            if not self._torch_allowed():
                return None, (
                    f"torch is not imported by the caller; set {ENV_ALLOW_TORCH}=1 to let "
                    f"accelplat import it (torch.xpu creates a device context)"
                )
            if self._torch_import_failure is not None:
                return None, self._torch_import_failure
            try:
                torch = import_quietly("torch")
            except Exception as exc:
                self._torch_import_failure = f"import torch failed: {type(exc).__name__}: {exc}"
                return None, self._torch_import_failure
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            return None, f"torch {getattr(torch, '__version__', '?')} has no torch.xpu"
        try:
            available = bool(xpu.is_available())
        except Exception as exc:
            return None, f"torch.xpu.is_available() failed: {type(exc).__name__}: {exc}"
        if not available:
            return None, "torch.xpu.is_available() is False (no XPU build, driver or device)"
        return torch, ""

    def _uses_torch(self) -> bool:
        return not self._cards_from_level_zero()

    def _targets(self) -> tuple[list[_Card], list[XpuTarget], Hierarchy]:
        cards = self._cards_from_level_zero() or _scan_sysfs(self._sysfs())[0]
        default, _ = _default_hierarchy(cards)
        hierarchy = parse_hierarchy(os.environ.get(ENV_FLAT_DEVICE_HIERARCHY), default)
        targets = visible_targets([c.tiles for c in cards], os.environ, default) if cards else []
        return cards, targets, hierarchy

    def _on_level_zero(
        self, device: int
    ) -> tuple[lz.Sysman, lz.SysmanDevice, _Card, XpuTarget] | None:
        """Sysman, the card and the target of visible ``device`` when Level Zero lists the GPUs."""
        cards = self._cards_from_level_zero()
        if not cards or self._sysman is None:
            return None
        target = self._targets()[1][device]
        card = cards[target.card]
        assert card.sysman is not None  # every card Level Zero lists carries its handle
        return self._sysman, card.sysman, card, target

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible devices in torch's order (``torch.xpu``'s when torch answers)."""
        if self._uses_torch():
            torch, _ = self._torch()
            if torch is not None:
                try:
                    count = int(torch.xpu.device_count())
                except Exception as exc:
                    raise BackendError("xpu", f"torch.xpu.device_count() failed: {exc}") from exc
                found = []
                for i in range(count):
                    name = "Intel GPU"
                    with contextlib.suppress(Exception):
                        name = str(torch.xpu.get_device_properties(i).name)
                    found.append(DeviceInfo(i, i, name))
                return found
        cards, targets, hierarchy = self._targets()
        # Unmasked, the driver lists one device per tile in FLAT/COMBINED mode: a tile's
        # physical index is its place in that list, as ZE_AFFINITY_MASK counts it. torch lists a
        # Max 1550 host in FLAT mode as one device per tile (intel/torch-xpu-ops#3585).
        unmasked = default_devices([c.tiles for c in cards], hierarchy)
        out: list[DeviceInfo] = []
        for index, target in enumerate(targets):
            card = cards[target.card]
            tiles = target.tiles or ()
            shown = f" (tile{'s' if len(tiles) > 1 else ''} {', '.join(map(str, tiles))})"
            name = card.name + (shown if tiles else "")
            physical = unmasked.index(target) if target in unmasked else target.card
            uuid = _tile_uuid(card.uuid, target.tiles)
            out.append(DeviceInfo(index, physical, name, uuid, card.pci_bus_id, arch=card.arch))
        return out

    @override
    def visible_devices_environment(self, devices: Sequence[DeviceInfo]) -> dict[str, str | None]:
        """Return ``ZE_AFFINITY_MASK`` for ``devices``, without the selector (it would index it)."""
        cards, targets, hierarchy = self._targets()
        if not cards or len(targets) < len(devices):
            mask = ",".join(str(d.physical_index) for d in devices)
        else:
            chosen = [targets[d.index] for d in devices]
            mask = affinity_mask_for(chosen, [c.tiles for c in cards], hierarchy)
        return {ENV_AFFINITY_MASK: mask, ENV_DEVICE_SELECTOR: None}

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        found = self._on_level_zero(device)
        if found is None:
            why = self._sysman_failure or "no Intel GPU in Level Zero"
            return self._torch_memory(device, why=why)
        sysman, handle, card, target = found
        # compute-runtime answers an integrated GPU from /proc/meminfo: free = MemFree, size =
        # MemAvailable (sysman_os_memory_imp.cpp:44-57); torch refuses it too (DPC++ tests).
        if card.integrated:
            raise BackendError(
                "xpu",
                f"device {device} is an integrated GPU: Level Zero reports the host's "
                f"MemFree/MemAvailable for it, not GPU memory (its 'used' would be roughly "
                f"the page cache), and torch cannot query it either; hide it with "
                f"{ENV_AFFINITY_MASK} or ONEAPI_DEVICE_SELECTOR",
            )
        try:
            modules = sysman.memory_modules(handle)
        except LevelZeroError as exc:
            why = f"Level Zero memory query for device {device} failed"
            raise BackendError("xpu", why, exc.vendor_error) from exc
        if not modules:
            raise BackendError("xpu", f"Level Zero reports no memory module on device {device}")
        free, total = lz.sum_modules(modules, target.tiles)
        used = max(0, total - free)
        # Sysman's free is the kernel's unallocated size (sysman_os_memory_imp.cpp:80), which
        # hides usage from a process that is not perfmon_capable(): never trust that zero.
        if used == 0 and not self._kernel_shows_usage():
            why = _hidden_usage(card.kernel_driver)
            return self._torch_memory(device, why=why, zero_is_suspect=True)
        where = f"xpu device {device} (Level Zero Sysman)"
        return checked_memory("xpu", where, free=free, total=total, used=used, source=SOURCE_SYSMAN)

    def _kernel_shows_usage(self) -> bool:
        if self._usage_visible is None:  # unreadable: no capability known, the initial namespace
            own = self._proc / "self"
            status, uid_map = read_or_empty(own / "status"), read_or_empty(own / "uid_map")
            self._usage_visible = usage_visible_to_this_process(status, uid_map)
        return self._usage_visible

    def _torch_memory(self, device: int, *, why: str, zero_is_suspect: bool = False) -> MemoryInfo:
        torch, reason = self._torch()
        if torch is None:
            raise BackendError("xpu", f"no memory source for device {device}: {why}; {reason}")
        # What vLLM 0.33 trusts: torch.accelerator.get_memory_info, which it routes to its own
        # op because torch.xpu.mem_get_info "returns wrong memory info with latest UMD".
        fn: Any = getattr(getattr(torch, "accelerator", None), "get_memory_info", None)
        source = SOURCE_ACCELERATOR
        if fn is None:
            fn, source = getattr(torch.xpu, "mem_get_info", None), SOURCE_TORCH
        if fn is None:
            fn, source = self._ipex_mem_get_info(torch), SOURCE_IPEX
        if fn is None:
            version = getattr(torch, "__version__", "?")
            raise BackendError(
                "xpu",
                f"torch {version} has neither torch.accelerator.get_memory_info nor "
                f"torch.xpu.mem_get_info (torch >= 2.6 has the second; "
                f"intel-extension-for-pytorch offers one to older stacks)",
            )
        name = source.split(" (")[0]
        info = torch_reading("xpu", fn, device, source, f"xpu device {device}")
        self._check_torch_reading(torch, device, info.total, name)
        if zero_is_suspect and info.free == info.total:
            raise BackendError(
                "xpu",
                f"{why}. {name} reports no usage either, and it reads the same kernel figure "
                f"(SYCL's free-memory query comes from Level Zero), so it cannot tell",
            )
        return info

    def _check_torch_reading(self, torch: Any, device: int, total: int, name: str) -> None:
        """Reject a shifted total, which the shared plausibility rule cannot see."""
        # With some Intel user-mode drivers the total jumped (24385683456 to 25669140480 bytes on
        # BMG, vllm-xpu-kernels tests/test_get_memory_info.py) while free stayed below it.
        first = self._torch_totals.setdefault(device, total)
        references = [("the total first reported in this process", first)]
        with contextlib.suppress(Exception):
            props = torch.xpu.get_device_properties(device)
            references.insert(0, ("get_device_properties().total_memory", int(props.total_memory)))
        for label, reference in references:
            if abs(total - reference) > max(1, reference // _TOTAL_TOLERANCE_DIVISOR):
                raise BackendError(
                    "xpu",
                    f"{name} reported total={total} for device {device}, but {label} is "
                    f"{reference}: a shifted total, as some Intel user-mode drivers report; "
                    f"the reading is not used",
                )

    def _ipex_mem_get_info(self, torch: Any) -> Any:
        # Old stacks only: IPEX releases stopped after 2.8 (IPEX #867); torch.xpu replaces it.
        if "intel_extension_for_pytorch" not in sys.modules and not self._torch_allowed():
            return None
        with contextlib.suppress(Exception):
            ipex = import_quietly("intel_extension_for_pytorch")
            fn = getattr(getattr(ipex, "xpu", None), "mem_get_info", None)
            # Importing IPEX may give torch.xpu a mem_get_info of its own.
            return fn if fn is not None else getattr(torch.xpu, "mem_get_info", None)
        return None

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the processes using the card of ``device`` (not per tile), or ``None``."""
        found = self._on_level_zero(self.check_device(device))
        if found is None:
            return None
        sysman, handle, _, _ = found
        with contextlib.suppress(LevelZeroError):
            return [make_holder(pid, used) for pid, used in sysman.processes(handle) if used > 0]
        return None

    @property
    def context_free(self) -> bool:  # type: ignore[override]
        return not self._uses_torch()  # False when torch must answer

    @property
    def memory_source(self) -> str:
        """The memory source queries use: Level Zero Sysman, torch, or ``""`` (loads no torch)."""
        if not self._uses_torch():
            return SOURCE_SYSMAN
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(getattr(torch, "accelerator", None), "get_memory_info"):
            return SOURCE_ACCELERATOR
        if torch is not None or self._torch_allowed():
            return SOURCE_TORCH
        return ""

    @property
    @override
    def graph(self) -> GraphSupport:
        """XPU graphs through ``torch.xpu.XPUGraph``, from torch 2.11."""
        # XPUGraph landed in pytorch PRs 166285, 173042, 174046; vLLM gates on 2.11.0.dev.
        return graph_support("torch.xpu.XPUGraph", (2, 11), label="XPU graphs", flavour="xpu")

    @classmethod
    @override
    @never_raises
    def probe(cls) -> ProbeResult:
        """Say whether an Intel GPU is usable here (sysfs, else Level Zero); never imports torch."""
        platform = cls(allow_torch=False)
        found, note = _scan_sysfs(platform._sysfs())
        origin = "sysfs"
        if not found:
            found, origin = platform._cards_from_level_zero() or [], "Level Zero"
            if not found:
                failure = platform._sysman_failure
                return ProbeResult(False, f"{note}; {failure}" if failure else note)
        # Nearly every Intel laptop and desktop has an integrated GPU: not alone, unless asked.
        if not _flag(ENV_INTEGRATED) and all(c.integrated for c in found):
            return ProbeResult(
                False,
                f"only integrated Intel GPU(s) found ({origin}); set {ENV_INTEGRATED}=1 to use "
                f"them as the xpu platform",
            )
        default, assumed = _default_hierarchy(found)
        if os.environ.get(ENV_FLAT_DEVICE_HIERARCHY) in {h.value for h in Hierarchy}:
            assumed = ""  # the variable names the model
        targets = visible_targets([c.tiles for c in found], os.environ, default)
        if not targets:
            return ProbeResult(
                False,
                f"{len(found)} Intel GPU(s) found ({origin}), but ZE_AFFINITY_MASK / "
                f"ONEAPI_DEVICE_SELECTOR hide all",
            )
        drivers = sorted({c.kernel_driver for c in found}) if origin == "sysfs" else ["level-zero"]
        note = f"; {assumed}" if assumed else ""
        return ProbeResult(
            True,
            f"{len(targets)} XPU device(s) visible on {len(found)} Intel GPU(s) "
            f"({origin}: {', '.join(drivers)}){note}",
        )
