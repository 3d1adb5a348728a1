"""The fault matrix (docs/reliability.md): rows the backend test files do not already prove.

Every fault here either falls back and says so (``MemoryInfo.source``, a probe reason, a
``detect()`` candidate) or raises an :class:`~accelplat.errors.AccelplatError` subclass that names
the vendor error. None may crash ``import accelplat``, hang a wait, or leak a vendor traceback or
warning. Vendor libraries are faked at their boundary only (tests/fakes/nvml.py); clocks are
virtual, so no test sleeps for real.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import accelplat
import accelplat.errors
from accelplat import _registry as registry
from accelplat._backends import cpu as cpu_backend
from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.simulated import SimulatedClock
from accelplat._types import GIB, UsageSnapshot
from accelplat._vendor import nvml as _nvml
from accelplat.errors import AccelplatError, BackendError, MemoryNotSettledError
from tests._proc import run_python
from tests.conftest import Install
from tests.fakes.hostfs import HostFS
from tests.fakes.nvml import FakeNvml, NVMLLibraryMismatchError, h200

REPO = Path(__file__).resolve().parents[2]


class Polls:
    """``on_poll`` callback that counts samples and may change the fake GPU after some."""

    def __init__(self, action: Callable[[int], None] | None = None) -> None:
        self.count = 0
        self.action = action

    def __call__(self, snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        self.count += 1
        if self.action is not None:
            self.action(self.count)


def _v2(handle: object, version: int | None = None) -> bool:
    return version is not None


def _v1(handle: object, version: int | None = None) -> bool:
    return version is None


def _busy_h200() -> FakeNvml:
    """One H200 holding 10 GiB: a wait for <= 1 GiB has to poll."""
    return FakeNvml([h200(0, used=10 * GIB)])


# -- NVML faults in the middle of a wait -------------------------------------------------------


def _wait(kind: str, clock: SimulatedClock, polls: Polls) -> None:
    """Wait for the busy H200 to drop to about 1 GiB, with the clear or the settle wait."""
    if kind == "clear":
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=1 * GIB, timeout_s=60, clock=clock, on_poll=polls
        )
    else:
        accelplat.wait_for_memory_to_settle(
            threshold_ratio=0.01, timeout_s=60, clock=clock, on_poll=polls
        )


MID_WAIT_FAULTS = [
    pytest.param("GpuIsLost", "NVMLError_GpuIsLost", id="GpuIsLost"),
    pytest.param("LibRmVersionMismatch", "NVMLError_LibRmVersionMismatch", id="LibRmVersion"),
    pytest.param("ResetRequired", "NVMLError_ResetRequired", id="ResetRequired"),
    pytest.param(
        NVMLLibraryMismatchError("Unversioned function called"),
        "NVMLLibraryMismatchError",
        id="NVMLLibraryMismatchError",
    ),
    pytest.param(AttributeError("pynvml has no attribute"), "AttributeError", id="shadowed"),
]


@pytest.mark.parametrize("kind", ["clear", "settle"])
@pytest.mark.parametrize(("error", "vendor_error"), MID_WAIT_FAULTS)
def test_a_fault_in_the_middle_of_a_wait_ends_it_with_a_backend_error(
    install: Install,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    error: Any,
    vendor_error: str,
) -> None:
    fake = install(_busy_h200())
    clock = SimulatedClock()
    polls = Polls()
    fake.fail("nvmlDeviceGetMemoryInfo", error, after=4)
    caplog.set_level(logging.DEBUG, logger="accelplat._memory")
    with pytest.raises(BackendError) as info:
        _wait(kind, clock, polls)
    err = info.value
    assert isinstance(err, AccelplatError)
    assert err.platform == "cuda"
    assert err.vendor_error == vendor_error
    assert vendor_error in str(err)
    assert "cuda device 0" in str(err)
    assert err.__cause__ is not None  # the vendor exception is kept, not shown bare
    assert polls.count == 4  # four good samples, then the fault: the wait was under way
    assert 0 < clock.monotonic() < 60  # it ended at the fault, not at the timeout
    events = [getattr(r, "accelplat_wait", {}) for r in caplog.records]
    ends = [e for e in events if e.get("event") == "end"]
    assert [e["ok"] for e in ends] == [False]
    assert _nvml._state.active == 0  # no NVML call left counted as in flight
    # the failure is not sticky: once the GPU answers again, waits work
    fake.clear_faults()
    fake.gpus[0].used = 0
    result = accelplat.wait_for_memory_to_clear(threshold_bytes=1 * GIB, clock=clock)
    assert result.already_settled


def test_unknown_from_v2_in_the_middle_of_a_wait_falls_back_to_v1_for_that_sample(
    install: Install,
) -> None:
    fake = install(_busy_h200())
    clock = SimulatedClock()
    seen: list[str] = []

    def release(count: int) -> None:
        if count == 6:
            fake.gpus[0].used = 0

    def record(snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        seen.append(snap.memory[0].source)
        polls(snap, targets)

    polls = Polls(release)
    fake.fail("nvmlDeviceGetMemoryInfo", "Unknown", after=3, times=1, when=_v2)
    result = accelplat.wait_for_memory_to_clear(
        threshold_bytes=1 * GIB, timeout_s=60, clock=clock, on_poll=record
    )
    assert not result.already_settled
    assert result.snapshot.memory[0].source == "nvml-v2"  # v2 is tried again after Unknown
    assert seen[3] == "nvml-v1"  # the faulted sample came from v1 (WSL behaviour)
    assert seen.count("nvml-v1") == 1


def test_unknown_from_both_struct_versions_in_the_middle_of_a_wait_is_a_backend_error(
    install: Install,
) -> None:
    fake = install(_busy_h200())
    fake.fail("nvmlDeviceGetMemoryInfo", "Unknown", after=3, when=_v2)
    fake.fail("nvmlDeviceGetMemoryInfo", "Unknown", when=_v1)
    with pytest.raises(BackendError) as info:
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=1 * GIB, timeout_s=60, clock=SimulatedClock()
        )
    assert info.value.vendor_error == "NVMLError_Unknown"
    assert "unknown error" in str(info.value)


def test_gpu_lost_while_listing_holders_at_the_timeout_still_reports_the_timeout(
    install: Install,
) -> None:
    fake = install(_busy_h200())
    fake.gpus[0].processes = [(os.getpid(), 10 * GIB)]
    fake.fail("nvmlDeviceGetComputeRunningProcesses", "GpuIsLost")
    with pytest.raises(MemoryNotSettledError) as info:
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=1 * GIB, timeout_s=5, clock=SimulatedClock()
        )
    assert "holders: unknown" in str(info.value)
    assert info.value.snapshot.holders == {}


@pytest.mark.parametrize("name", ["NotSupported", "NoPermission"])
def test_a_process_list_the_driver_will_not_give_leaves_holders_unknown_in_a_timeout(
    install: Install, name: str
) -> None:
    fake = install(_busy_h200())
    fake.fail("nvmlDeviceGetComputeRunningProcesses", name)
    with pytest.raises(MemoryNotSettledError) as info:
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=1 * GIB, timeout_s=5, clock=SimulatedClock()
        )
    assert "holders: unknown (the platform cannot tell)" in str(info.value)


def test_gpu_lost_in_snapshot_and_record_usage_stats_is_a_backend_error(install: Install) -> None:
    fake = install(FakeNvml([h200(0), h200(1)]))
    assert accelplat.snapshot().memory[1].source == "nvml-v2"
    fake.fail("nvmlDeviceGetMemoryInfo", "GpuIsLost", when=lambda h, version=None: h.gpu == 1)
    with pytest.raises(BackendError, match=r"cuda device 1 .*NVMLError_GpuIsLost"):
        accelplat.snapshot()
    with pytest.raises(BackendError, match="NVMLError_GpuIsLost"):
        accelplat.record_usage_stats([1])
    assert accelplat.record_usage_stats([0])[0][0] == 0.0  # the other GPU still answers


# -- MIG mode faults ---------------------------------------------------------------------------


def _mig_capable_h200() -> FakeNvml:
    gpu = h200(0)
    gpu.mig_capable = True  # MIG off: GetMigMode answers (0, 0)
    return FakeNvml([gpu])


@pytest.mark.parametrize("name", ["NotSupported", "FunctionNotFound", "InvalidArgument"])
def test_mig_mode_not_available_means_a_whole_gpu(install: Install, name: str) -> None:
    fake = install(_mig_capable_h200())
    fake.fail("nvmlDeviceGetMigMode", name)
    assert CudaPlatform.probe().available
    p = CudaPlatform()
    (dev,) = p.devices()
    assert dev.uuid is not None
    assert dev.uuid.startswith("GPU-")
    assert p.memory_info(0).source == "nvml-v2"


def test_gpu_lost_while_reading_mig_mode_is_an_unavailable_probe_and_a_backend_error(
    install: Install,
) -> None:
    fake = install(_mig_capable_h200())
    fake.fail("nvmlDeviceGetMigMode", "GpuIsLost")
    result = CudaPlatform.probe()
    assert not result.available
    assert "MIG mode" in result.reason
    assert "NVMLError_GpuIsLost" in result.reason
    with pytest.raises(BackendError) as info:
        CudaPlatform().devices()
    assert info.value.vendor_error == "NVMLError_GpuIsLost"
    report = registry.detect()
    assert report.chosen != "cuda"
    (cuda,) = [c for c in report.candidates if c.name == "cuda"]
    assert "NVMLError_GpuIsLost" in cuda.reason


# -- the deprecated "pynvml" PyPI package --------------------------------------------------------


HOOK_MODULE = textwrap.dedent(
    """
    import warnings
    from importlib.abc import MetaPathFinder


    class DeprecatedPynvmlHook(MetaPathFinder):
        \"\"\"Acts like the import hook of the deprecated ``pynvml`` PyPI package.

        The first time any ``pynvml*`` module is imported it emits the package's FutureWarning,
        then lets the import go on to nvidia-ml-py's module.
        \"\"\"

        def __init__(self):
            self.fired = 0

        def find_spec(self, name, path=None, target=None):
            if name.startswith("pynvml") and not self.fired:
                self.fired += 1
                warnings.warn(
                    "The pynvml package is deprecated. Please install nvidia-ml-py instead. "
                    "If you did not install pynvml directly, please report this to the "
                    "maintainers of the package that installed pynvml for you.",
                    FutureWarning,
                    stacklevel=2,
                )
            return None
    """
)
"""Source of a stand-in for the deprecated ``pynvml`` package's import hook."""


def _deprecated_package(directory: Path) -> None:
    """Write the hook module and a ``pynvml`` whose ``nvmlInit`` fails as without a driver."""
    (directory / "deprecated_pynvml_hook.py").write_text(HOOK_MODULE)
    (directory / "pynvml.py").write_text(
        textwrap.dedent(
            """
            class NVMLError(Exception):
                pass

            class NVMLError_LibraryNotFound(NVMLError):
                def __str__(self):
                    return "NVML Shared Library Not Found"

            class NVMLLibraryMismatchError(Exception):
                pass

            def nvmlInit():
                raise NVMLError_LibraryNotFound()
            """
        )
    )


def test_the_deprecated_package_hook_warning_never_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _deprecated_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))  # restored after
    monkeypatch.delitem(sys.modules, "pynvml")
    hook_module = importlib.import_module("deprecated_pynvml_hook")
    hook = hook_module.DeprecatedPynvmlHook()
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    monkeypatch.setattr(_nvml, "library_missing", lambda: None)  # NVML's library loads here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # as under -W error: a leaked warning would raise
        result = CudaPlatform.probe()
    assert hook.fired == 1
    assert caught == []
    assert not result.available
    assert "NVMLError_LibraryNotFound" in result.reason
    assert sys.modules["pynvml"].__file__ == str(tmp_path / "pynvml.py")


def test_deprecated_package_under_w_error_in_a_fresh_interpreter(tmp_path: Path) -> None:
    _deprecated_package(tmp_path)
    script = textwrap.dedent(
        """
        import json, sys
        from deprecated_pynvml_hook import DeprecatedPynvmlHook
        hook = DeprecatedPynvmlHook()
        sys.meta_path.insert(0, hook)
        import accelplat
        import accelplat._vendor.nvml
        accelplat._vendor.nvml.library_missing = lambda: None  # as where NVML's library loads
        platform = accelplat.current_platform()
        report = accelplat.detect()
        reasons = {c.name: c.reason for c in report.candidates}
        print(json.dumps({"fired": hook.fired, "chosen": platform.name, "cuda": reasons["cuda"]}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "CUDA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    done = run_python(script, env=env, timeout=120, flags=["-W", "error"])
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["fired"] == 1  # the hook did warn, under -W error, and nothing broke
    assert report["chosen"] != "cuda"
    assert "NVMLError_LibraryNotFound" in report["cuda"]


# -- a hostile environment: import and detection never crash -----------------------------------


def test_import_and_detection_survive_a_hostile_environment(tmp_path: Path) -> None:
    # A pynvml that explodes on import, an amdsmi that prints and raises KeyError (as without
    # ROCm), a torch that raises on import, and malformed variables everywhere.
    (tmp_path / "pynvml.py").write_text("raise RuntimeError('corrupt install')\n")
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text(
        "print('Unable to find libamd_smi.so')\nraise KeyError('ROCM_PATH')\n"
    )
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise OSError('libcudart.so.13 missing')\n")
    script = textwrap.dedent(
        """
        import json, os
        import accelplat
        import accelplat._vendor.nvml
        accelplat._vendor.nvml.library_missing = lambda: None  # as where NVML's library loads
        out = {"import": "ok"}
        report = accelplat.detect()
        out["detect_error"] = report.error
        try:
            accelplat.current_platform()
        except accelplat.errors.AccelplatError as exc:
            out["current"] = type(exc).__name__
        del os.environ["ACCELPLAT_PLATFORM"], os.environ["ACCELPLAT_PROBE_TIMEOUT_S"]
        accelplat._registry.reset()
        platform = accelplat.current_platform()
        out["chosen"] = platform.name
        out["used"] = platform.memory_info(0).used >= 0
        out["reasons"] = {c.name: c.reason for c in accelplat.detect().candidates}
        print(json.dumps(out))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]),
        ACCELPLAT_PLATFORM="../../etc/passwd",
        ACCELPLAT_PROBE_TIMEOUT_S="nan",
        ACCELPLAT_PLUGINS=",,,",
        CUDA_VISIBLE_DEVICES="1" * 5000,
        HIP_VISIBLE_DEVICES="0,,x",
        ROCR_VISIBLE_DEVICES=",",
        ZE_AFFINITY_MASK="-1.-1.-1",
        ONEAPI_DEVICE_SELECTOR="opencl:;level_zero",
        ACCELPLAT_XPU_ALLOW_TORCH="1",
    )
    done = run_python(script, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stdout.strip().splitlines()  # what amdsmi printed was held back
    out = json.loads(line)
    assert out["import"] == "ok"
    assert "ACCELPLAT_PROBE_TIMEOUT_S" in out["detect_error"]
    assert out["current"] == "ConfigurationError"
    assert out["chosen"] == "cpu"
    assert out["used"] is True
    assert "corrupt install" in out["reasons"]["cuda"]
    assert "KeyError" in out["reasons"]["rocm"]


# -- host: a cgroup file that cannot be read ---------------------------------------------------


def test_a_cgroup_limit_that_cannot_be_read_falls_back_to_meminfo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = HostFS(tmp_path / "host")
    fs.meminfo(total=32 * GIB, available=30 * GIB, free=28 * GIB)
    fs.cgroup_v2("/job")
    fs.v2_level("/job", max=4 * GIB, current=GIB)
    assert fs.platform().memory_info(0).source == "cgroup-v2"
    real_read = cpu_backend._read_text

    def read(path: Path) -> str:
        if Path(path).name == "memory.max":  # what a file mode of 000 gives a non-root reader
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(cpu_backend, "_read_text", read)
    info = fs.platform().memory_info(0)
    assert (info.total, info.free, info.source) == (32 * GIB, 30 * GIB, "meminfo")
