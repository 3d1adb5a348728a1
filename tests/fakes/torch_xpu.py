"""A fake ``torch`` with ``torch.xpu``, ``torch.accelerator`` and ``torch.cuda``, for sys.modules.

Only what accelplat touches, with torch's documented shapes: ``torch.xpu.mem_get_info(i)`` and
``torch.accelerator.get_memory_info(i)`` return ``(free, total)`` in bytes (and, in real torch,
create a device context — the fake records each call so tests can assert whether one would have
been created); ``torch.xpu.get_device_properties(i).name``; ``torch.version.hip`` is a string on
ROCm builds and ``None`` elsewhere; ``torch.cuda.mem_get_info`` for the ROCm fallback.

What the Intel stack does underneath, reproduced per device:

* ``umd_total_shift``: with some Intel user-mode drivers ``torch.xpu.mem_get_info`` reported a
  total that jumped (24385683456 to 25669140480 bytes on a BMG card, vllm-xpu-kernels
  ``tests/test_get_memory_info.py``) while ``get_device_properties(i).total_memory`` stayed put;
  vLLM 0.33 stopped using it (vLLM PRs 47016/47134). ``torch.accelerator.get_memory_info`` is not
  shifted here, since vLLM now routes it to its own op.
* ``integrated``: the free-memory query is not supported on integrated GPUs, and torch's
  ``_xpu_getMemoryInfo`` checks that aspect, so both memory calls raise.

Install with :func:`install_fake_torch`, which puts the module and its submodules in
``sys.modules`` through ``monkeypatch`` (so they are removed after the test).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class FakeXpuDevice:
    """One device as the fake torch reports it."""

    name: str = "Intel(R) Data Center GPU Max 1550"
    total: int = 64 * 1024**3
    free: int = 60 * 1024**3
    error: BaseException | None = None
    umd_total_shift: int = 0
    integrated: bool = False


def make_fake_torch(
    devices: list[FakeXpuDevice] | None = None,
    *,
    version: str = "2.11.0+xpu",
    xpu: bool = True,
    available: bool = True,
    mem_get_info: bool = True,
    accelerator: bool = True,
    hip: str | None = None,
    cuda_devices: list[FakeXpuDevice] | None = None,
) -> types.ModuleType:
    """Build a fake torch.

    Args:
        devices: The XPU devices (torch's numbering, visible variables already applied).
        version: ``torch.__version__``.
        xpu: Whether ``torch.xpu`` exists at all.
        available: What ``torch.xpu.is_available()`` returns.
        mem_get_info: Whether ``torch.xpu.mem_get_info`` exists (absent before torch ~2.6).
        accelerator: Whether ``torch.accelerator.get_memory_info`` exists (torch 2.11).
        hip: ``torch.version.hip`` (a ROCm build when set).
        cuda_devices: Devices for ``torch.cuda`` (the ROCm fallback).
    """
    devices = list(devices or [])
    cuda_devices = list(cuda_devices or [])
    torch = types.ModuleType("torch")
    torch.__version__ = version  # type: ignore[attr-defined]
    torch.calls = []  # type: ignore[attr-defined]

    def record(name: str, *args: Any) -> None:
        torch.calls.append((name, *args))  # type: ignore[attr-defined]

    def lookup(table: list[FakeXpuDevice], i: int) -> FakeXpuDevice:
        if not 0 <= i < len(table):
            raise RuntimeError(f"Invalid device argument: {i}")
        return table[i]

    def info(table: list[FakeXpuDevice], i: int, name: str) -> tuple[int, int]:
        record(name, i)
        dev = lookup(table, i)
        if dev.error is not None:
            raise dev.error
        if dev.integrated and name != "cuda.mem_get_info":
            raise RuntimeError(
                "The device (Intel(R) Graphics) doesn't support querying the available free memory"
            )
        if name == "xpu.mem_get_info":
            return dev.free, dev.total + dev.umd_total_shift
        return dev.free, dev.total

    version_mod = types.ModuleType("torch.version")
    version_mod.hip = hip  # type: ignore[attr-defined]
    version_mod.xpu = None if hip else "20250101"  # type: ignore[attr-defined]
    torch.version = version_mod  # type: ignore[attr-defined]

    if xpu:
        xpu_mod = types.ModuleType("torch.xpu")
        xpu_mod.is_available = lambda: record("xpu.is_available") or available  # type: ignore[attr-defined]
        xpu_mod.device_count = lambda: len(devices) if available else 0  # type: ignore[attr-defined]

        def get_device_properties(i: int) -> Any:
            dev = lookup(devices, i)
            return types.SimpleNamespace(name=dev.name, total_memory=dev.total)

        xpu_mod.get_device_properties = get_device_properties  # type: ignore[attr-defined]
        if mem_get_info:
            xpu_mod.mem_get_info = lambda i: info(devices, i, "xpu.mem_get_info")  # type: ignore[attr-defined]
        torch.xpu = xpu_mod  # type: ignore[attr-defined]
    if accelerator:
        acc = types.ModuleType("torch.accelerator")
        acc.get_memory_info = lambda i: info(devices, i, "accelerator.get_memory_info")  # type: ignore[attr-defined]
        torch.accelerator = acc  # type: ignore[attr-defined]
    cuda = types.ModuleType("torch.cuda")
    cuda.device_count = lambda: len(cuda_devices)  # type: ignore[attr-defined]
    cuda.is_available = lambda: bool(cuda_devices)  # type: ignore[attr-defined]
    cuda.mem_get_info = lambda i: info(cuda_devices, i, "cuda.mem_get_info")  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


def install_fake_torch(monkeypatch: pytest.MonkeyPatch, torch: types.ModuleType) -> None:
    """Put ``torch`` and its submodules in ``sys.modules`` for the current test."""
    monkeypatch.setitem(sys.modules, "torch", torch)
    for sub in ("xpu", "accelerator", "cuda", "version"):
        if hasattr(torch, sub):
            monkeypatch.setitem(sys.modules, f"torch.{sub}", getattr(torch, sub))


_IPEX_SOURCE = """
import types

import torch


def _mem_get_info(i):
    torch.calls.append(("ipex.xpu.mem_get_info", i))
    device = torch.ipex_devices[i]
    return device.free, device.total


xpu = types.SimpleNamespace(mem_get_info=_mem_get_info)
"""


def install_fake_ipex(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    torch: types.ModuleType,
    devices: list[FakeXpuDevice],
) -> None:
    """Put an ``intel_extension_for_pytorch`` package on ``sys.path``.

    It offers ``intel_extension_for_pytorch.xpu.mem_get_info`` (the documented IPEX API, now
    deprecated) for old torch builds that lack ``torch.xpu.mem_get_info``. Whether importing IPEX
    also patches ``torch.xpu`` is not documented, so the fake does not.
    """
    root = tmp_path / "site-ipex"
    pkg = root / "intel_extension_for_pytorch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(_IPEX_SOURCE)
    torch.ipex_devices = devices  # type: ignore[attr-defined]
    monkeypatch.syspath_prepend(str(root))
    # setitem (not delitem) so monkeypatch removes the module again after the test, even though
    # it was absent before: a real import during the test would otherwise outlive it.
    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch", None)
    del sys.modules["intel_extension_for_pytorch"]
