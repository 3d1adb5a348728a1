"""A fake ``amdsmi`` module, built from the documented API of ROCm's amdsmi Python package.

Two ways in:

* :func:`make_amdsmi` builds a working module (install it with
  ``monkeypatch.setitem(sys.modules, "amdsmi", module)``);
* :func:`install_broken_amdsmi` writes a real ``amdsmi`` package on ``sys.path`` whose import
  fails the way the PyPI redistribution does: without ROCm it prints to stdout and raises
  ``KeyError``; against an older ROCm it raises ``AttributeError``.

Facts followed: memory totals and usage are bytes, from
``amdsmi_get_gpu_memory_total/usage(handle, AmdSmiMemoryType.VRAM)``; ``amdsmi_get_gpu_vram_usage``
reports MB (and is stale on MI355X, so the fake counts calls to it); enumeration info carries
``hip_id`` (``"N/A"`` when unknown) and ``hip_uuid``; process lists are dicts with ``pid`` and
``memory_usage.vram_mem``; errors are ``AmdSmiLibraryException`` (a subclass of
``AmdSmiException``).
"""

from __future__ import annotations

import enum
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class FakeAmdGpu:
    """One GPU as the fake amdsmi reports it."""

    bdf: str
    vram_total: int
    vram_used: int = 0
    hip_id: int | str = "N/A"
    hip_uuid: str = ""
    market_name: str = "AMD Instinct MI300X"
    target_graphics_version: str = "gfx942"
    processes: list[tuple[int, int]] = field(default_factory=list)
    gtt_used: int = 123 * 1024**2
    fail_memory: bool = False


class _Handle:
    """Stands in for ``amdsmi_processor_handle`` (an opaque ctypes pointer)."""

    def __init__(self, gpu: FakeAmdGpu) -> None:
        self.gpu = gpu

    def __repr__(self) -> str:
        return f"<amdsmi_processor_handle {self.gpu.bdf}>"


def make_amdsmi(
    gpus: list[FakeAmdGpu],
    *,
    init_error: bool = False,
    enumeration: bool = True,
    legacy_process_list: bool = False,
) -> types.ModuleType:
    """Build a fake ``amdsmi`` module over ``gpus`` (handles in the list's order).

    Args:
        gpus: The GPUs, in the order ``amdsmi_get_processor_handles`` returns them.
        init_error: ``amdsmi_init`` raises ``AmdSmiLibraryException`` (driver not loaded).
        enumeration: Whether ``amdsmi_get_gpu_enumeration_info`` exists (older amdsmi lacks it).
        legacy_process_list: Process lists are opaque handles, as in older releases.
    """
    m = types.ModuleType("amdsmi")
    m.calls = []  # type: ignore[attr-defined]

    class AmdSmiException(Exception):
        pass

    class AmdSmiLibraryException(AmdSmiException):
        def __init__(self, err_code: int) -> None:
            super().__init__(f"Error code:\n\t{err_code} | AMDSMI_STATUS_...")
            self.err_code = err_code

        def get_error_code(self) -> int:
            return self.err_code

    class AmdSmiMemoryType(enum.IntEnum):
        VRAM = 0
        VIS_VRAM = 1
        GTT = 2

    class AmdSmiInitFlags(enum.IntEnum):
        INIT_ALL_PROCESSORS = 0xFFFFFFFF
        INIT_AMD_CPUS = 1 << 0
        INIT_AMD_GPUS = 1 << 1

    handles = [_Handle(g) for g in gpus]

    def record(name: str, *args: Any) -> None:
        m.calls.append((name, *args))  # type: ignore[attr-defined]

    def check(handle: object) -> FakeAmdGpu:
        if not isinstance(handle, _Handle):
            raise AmdSmiException(f"invalid processor handle {handle!r}")
        return handle.gpu

    def amdsmi_init(flag: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        record("amdsmi_init", flag)
        if init_error:
            raise AmdSmiLibraryException(34)  # AMDSMI_STATUS_DRIVER_NOT_LOADED

    def amdsmi_shut_down() -> None:
        record("amdsmi_shut_down")

    def amdsmi_get_processor_handles() -> list[_Handle]:
        record("amdsmi_get_processor_handles")
        return list(handles)

    def amdsmi_get_gpu_enumeration_info(handle: object) -> dict[str, Any]:
        gpu = check(handle)
        return {
            "drm_render": 128,
            "drm_card": 0,
            "hsa_id": "N/A",
            "hip_id": gpu.hip_id,
            "hip_uuid": gpu.hip_uuid,
        }

    def amdsmi_get_gpu_device_bdf(handle: object) -> str:
        return check(handle).bdf

    def amdsmi_get_gpu_asic_info(handle: object) -> dict[str, Any]:
        gpu = check(handle)
        return {
            "market_name": gpu.market_name,
            "vendor_id": "0x1002",
            "target_graphics_version": gpu.target_graphics_version,
        }

    def amdsmi_get_gpu_memory_total(handle: object, mem_type: object) -> int:
        gpu = check(handle)
        record("amdsmi_get_gpu_memory_total", mem_type)
        if gpu.fail_memory:
            raise AmdSmiLibraryException(43)  # AMDSMI_STATUS_NOT_SUPPORTED
        if mem_type == AmdSmiMemoryType.VRAM:
            return gpu.vram_total
        return 512 * 1024**3  # GTT / visible VRAM: a different number on purpose

    def amdsmi_get_gpu_memory_usage(handle: object, mem_type: object) -> int:
        gpu = check(handle)
        record("amdsmi_get_gpu_memory_usage", mem_type)
        if gpu.fail_memory:
            raise AmdSmiLibraryException(43)
        if mem_type == AmdSmiMemoryType.VRAM:
            return gpu.vram_used
        return gpu.gtt_used

    def amdsmi_get_gpu_vram_usage(handle: object) -> dict[str, int]:
        gpu = check(handle)
        record("amdsmi_get_gpu_vram_usage")
        return {"vram_total": gpu.vram_total // 1024**2, "vram_used": gpu.vram_used // 1024**2}

    def amdsmi_get_gpu_process_list(handle: object) -> list[Any]:
        gpu = check(handle)
        if legacy_process_list:
            return [object() for _ in gpu.processes]
        return [
            {
                "name": f"proc{pid}",
                "pid": pid,
                "mem": vram,
                "engine_usage": {"gfx": 0, "enc": 0},
                "memory_usage": {"gtt_mem": 4096, "cpu_mem": 0, "vram_mem": vram},
                "cu_occupancy": "N/A",
            }
            for pid, vram in gpu.processes
        ]

    for name, value in list(locals().items()):
        if name.startswith(("amdsmi_", "AmdSmi")):
            setattr(m, name, value)
    if not enumeration:
        del m.amdsmi_get_gpu_enumeration_info
    return m


_BROKEN_SOURCES = {
    "keyerror": """
        print("Unable to find amdsmi library try installing amd-smi-lib from your package manager")
        raise KeyError("ROCM_PATH")
    """,
    # amdsmi 7.0.2 from PyPI on a host without ROCm: its import ends in KeyError('libamd_smi.so')
    "keyerror-7.0.2": """
        raise KeyError("libamd_smi.so")
    """,
    "attributeerror": """
        import ctypes
        raise AttributeError(
            "/opt/rocm/lib/libamd_smi.so: undefined symbol: amdsmi_get_gpu_enumeration_info"
        )
    """,
}


def install_broken_amdsmi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str) -> Path:
    """Put an ``amdsmi`` package on ``sys.path`` whose import fails as ``mode`` describes.

    Args:
        monkeypatch: Undoes the path change.
        tmp_path: Where the package is written.
        mode: ``"keyerror"`` (no ROCm: prints, then ``KeyError``), ``"keyerror-7.0.2"``
            (amdsmi 7.0.2's ``KeyError: 'libamd_smi.so'``) or ``"attributeerror"`` (an older ROCm).

    Returns:
        The package directory.
    """
    root = tmp_path / f"site-{mode}"
    pkg = root / "amdsmi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(_BROKEN_SOURCES[mode]))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    return pkg
