"""pytest plugin: evaluate vLLM tests' skip decisions as a recorded GPU machine would.

Load it with ``-p replay_device`` next to ``-p record_skips`` and set
``ACCELPLAT_DEVICE_FACTS`` to a file ``device_facts.py`` wrote on the machine (e.g.
``h200-facts.json``). Before the test modules are imported (at session start, after vLLM's own
conftest) it makes both sides of the comparison answer from the recorded facts:

* the *original* predicates: ``vllm.platforms.current_platform`` becomes a stand-in whose
  ``is_cuda()``/``is_rocm()``/``has_device_capability(n)``/``supports_fp8()``… return the values
  recorded on the machine, and ``torch.cuda.is_available()``/``device_count()`` return the
  recorded torch answers — when the caller is code of the test tree; vLLM's own modules keep
  seeing the real (CPU) answers, so that they import as they do on this machine;
* the *migrated* requirements: accelplat's current platform becomes a replay of the recorded
  CUDA devices (names, arch, compute capability, memory totals, graph support), decided by the
  CUDA backend's own capability rules.

What it cannot reproduce: module-level code that needs a real GPU or vLLM's CUDA build (such
modules fail to import on both sides alike and contribute no test ids), and skips taken inside
test bodies at run time.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from accelplat._backends.cuda import CudaPlatform
from accelplat._platform import BasePlatform
from accelplat._types import DeviceInfo, GraphSupport, MemoryInfo, ProbeResult


def _from_tests(depth: int = 2) -> bool:
    """Whether the caller ``depth`` frames up is code of the test tree (not vLLM itself)."""
    filename = sys._getframe(depth).f_code.co_filename
    return f"{os.sep}tests{os.sep}" in filename and "site-packages" not in filename


def _facts() -> dict[str, Any]:
    with open(os.environ["ACCELPLAT_DEVICE_FACTS"], encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


class _VllmPlatformFacts:
    """Answers vLLM's platform predicates from recorded values; the rest from ``real``."""

    def __init__(self, real: Any, values: dict[str, bool], capability: list[int] | None) -> None:
        self._real = real
        self._values = values
        self._cap = capability[0] * 10 + capability[1] if capability else None

    def _v(self, name: str) -> bool:
        if not _from_tests(3):  # vLLM's own code keeps seeing the real (CPU) platform
            return bool(getattr(self._real, name)())
        return bool(self._values[f"current_platform.{name}()"])

    def is_cuda(self) -> bool:
        return self._v("is_cuda")

    def is_rocm(self) -> bool:
        return self._v("is_rocm")

    def is_cuda_alike(self) -> bool:
        return self._v("is_cuda_alike")

    def is_xpu(self) -> bool:
        return self._v("is_xpu")

    def is_cpu(self) -> bool:
        return self._v("is_cpu")

    def supports_fp8(self) -> bool:
        return self._v("supports_fp8")

    def supports_mx(self) -> bool:
        return self._v("supports_mx")

    def has_device_capability(self, capability: int, device_id: int = 0) -> bool:
        if not _from_tests():
            return bool(self._real.has_device_capability(capability, device_id))
        return self._cap is not None and self._cap >= int(capability)

    def is_device_capability(self, capability: int, device_id: int = 0) -> bool:
        if not _from_tests():
            return bool(self._real.is_device_capability(capability, device_id))
        return self._cap == int(capability)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _answer_tests(real: Callable[[], Any], recorded: Any) -> Callable[[], Any]:
    """``real`` for vLLM's code, the recorded value for the test tree's."""

    def answer() -> Any:
        return recorded if _from_tests() else real()

    return answer


def _replay_class(facts: dict[str, Any]) -> type[BasePlatform]:
    recorded = facts["accelplat"]
    graph = recorded["graph"]

    class ReplayedCuda(BasePlatform):
        """The recorded machine's CUDA devices, with the CUDA backend's capability rules."""

        name = "cuda"
        device_type = "cuda"
        FEATURES = CudaPlatform.FEATURES
        GRAPH = GraphSupport(graph["available"], graph["api"], graph["reason"])

        @classmethod
        def probe(cls) -> ProbeResult:
            return ProbeResult(True, "the recorded machine's devices")

        def devices(self) -> Sequence[DeviceInfo]:
            return tuple(
                DeviceInfo(
                    i,
                    i,
                    d["name"],
                    d["uuid"],
                    d["pci_bus_id"],
                    d["arch"],
                    tuple(d["compute_capability"]) if d["compute_capability"] else None,  # type: ignore[arg-type]
                )
                for i, d in enumerate(recorded["devices"])
            )

        def _memory_info(self, device: int) -> MemoryInfo:
            total = int(recorded["devices"][device]["total_memory"])
            return MemoryInfo(free=total, total=total, used=0, source="replay")

    return ReplayedCuda


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Swap in the recorded answers before any test module is imported."""
    import torch
    import vllm.platforms

    from accelplat import _registry as registry

    facts = _facts()
    t = facts["torch"]
    capability = t["devices"][0]["capability"] if t["devices"] else None
    vllm.platforms.current_platform = _VllmPlatformFacts(  # type: ignore[attr-defined]
        vllm.platforms.current_platform, facts["vllm_predicates"], capability
    )
    torch.cuda.is_available = _answer_tests(torch.cuda.is_available, bool(t["cuda_is_available"]))
    torch.cuda.device_count = _answer_tests(torch.cuda.device_count, int(t["device_count"]))
    registry.register_platform("cuda", _replay_class(facts), override=True)
    registry.set_current_platform("cuda")
