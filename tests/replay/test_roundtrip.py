"""Capture then replay, over the vendor fakes: a replayed host answers ``info``, devices, memory
and holders exactly as the captured one did, through the backends' own code paths, with the
vendor library gone. The fakes stand at the vendor boundary only (fake pynvml, a compiled fake
Level Zero loader, a fake amdsmi)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from accelplat import _boundary
from accelplat._describe import collect_info
from accelplat._registry import current_platform
from accelplat._replay._bundle import parse_bundle
from accelplat._types import HolderState
from accelplat.replay import Capture, capture, compare_info, replaying
from tests._hosts import HOSTS, clear_vendor_variables
from tests.conftest import Install
from tests.fakes.levelzero import arc, build_c_library, c_compiler, pvc
from tests.fakes.nvml import GIB, FakeNvml, h200


def no_sleep(_: float) -> None:
    return None


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_vendor_variables(monkeypatch, "ACCELPLAT_PLATFORM", "ACCELPLAT_REPLAY")
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setitem(sys.modules, "torch", None)


def two_h200(install: Install) -> FakeNvml:
    gpus = [h200(0, used=3 * GIB), h200(1)]
    gpus[0].processes = [(4242, 3 * GIB)]
    return install(FakeNvml(gpus))


def replayed_info(cap: Capture) -> dict[str, Any]:
    with replaying(parse_bundle(cap.data)):
        return collect_info()


def test_a_two_gpu_nvml_host_replays_exactly_without_nvml(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = two_h200(install)
    cap = capture(samples=3, sleep=no_sleep)
    assert cap.info["platform"] == "cuda"
    assert len(cap.info["devices"]) == 2
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML is gone: only the bundle answers
    calls_before = sum(fake.calls.values())
    with replaying(parse_bundle(cap.data)):
        info = collect_info()
        platform = current_platform()
        holders = platform.memory_holders(0)
        memory = platform.memory_info(1)
    assert info == cap.info
    assert compare_info(cap.info, info) == []
    assert sum(fake.calls.values()) == calls_before
    assert holders is not None
    assert [(h.pid, h.used_bytes) for h in holders] == [(4242, 3 * GIB)]
    assert holders[0].state is HolderState.GONE  # as classified on the captured host
    assert memory.total == cap.info["devices"][1]["memory"]["total"]
    assert _boundary.active() is None  # the replay ended with the block


def test_visible_devices_are_resolved_by_the_backend_over_replayed_answers(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_h200(install)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    cap = capture(samples=0, sleep=no_sleep)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the replay applies the captured value
    with replaying(parse_bundle(cap.data)):
        info = collect_info()
        assert [d["physical_index"] for d in info["devices"]] == [1]
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # changed during the replay: re-resolved
        platform = current_platform()
        assert [d.physical_index for d in platform.devices()] == [1, 0]
    assert info == cap.info
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # restored after the replay


def test_memory_samples_replay_in_order_then_hold_the_last(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = two_h200(install)
    seen: list[int] = []

    def sleep(_: float) -> None:
        fake.gpus[1].used += GIB
        seen.append(fake.gpus[1].used)

    cap = capture(samples=3, sleep=sleep)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with replaying(parse_bundle(cap.data)):
        collect_info()
        platform = current_platform()
        used = [platform.memory_info(1).used for _ in range(5)]
    assert used == [*seen, seen[-1], seen[-1]]


def test_no_processes_leaves_holders_out_of_the_bundle_and_the_replay(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_h200(install)
    cap = capture(processes=False, samples=0, sleep=no_sleep)
    assert b"4242" not in cap.data
    assert "4242" not in str(cap.host)
    assert "left out" in cap.contents
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with replaying(parse_bundle(cap.data)):
        assert current_platform().memory_holders(0) == ()


def test_an_nvml_failure_is_replayed_as_the_same_vendor_error(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = two_h200(install)
    fake.fail("nvmlDeviceGetMemoryInfo", "GpuIsLost", when=lambda *a, **k: True)
    cap = capture(samples=0, sleep=no_sleep)
    assert "NVMLError_GpuIsLost" in (cap.info["devices"][0]["error"] or "")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert replayed_info(cap) == cap.info


def test_a_cpu_host_without_nvml_replays_the_reasons_of_every_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", "/nonexistent/libze_loader.so.1")
    cap = capture(samples=0, sleep=no_sleep)
    assert cap.info["platform"] == "cpu"
    assert replayed_info(cap) == cap.info


@pytest.mark.skipif(c_compiler() is None, reason="needs a C compiler for the fake loader")
def test_a_level_zero_host_replays_through_ctypes_out_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = pvc(0x3A, used=(2 * GIB, 0))
    card.processes = [(777, 2 * GIB)]
    lib = build_c_library([card, arc(0x9C, used=GIB)], tmp_path / "ze")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tmp_path / "no-sysfs"))
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", str(lib))
    cap = capture(samples=1, sleep=no_sleep)
    assert cap.info["platform"] == "xpu"
    lib.unlink()  # the loader is gone: only the bundle answers
    with replaying(parse_bundle(cap.data)):
        info = collect_info()
        holders = current_platform().memory_holders(0)
    assert info == cap.info
    assert holders is not None
    assert [(h.pid, h.used_bytes) for h in holders] == [(777, 2 * GIB)]


def test_cuda_enumeration_order_of_mixed_models_is_recorded_not_rerun(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat._backends import cuda

    gpus = [h200(0), h200(1)]
    gpus[1].name = "NVIDIA H100 80GB HBM3"
    install(FakeNvml(gpus))
    fastest_first = [gpus[1].uuid, gpus[0].uuid]
    monkeypatch.setattr(cuda, "_cuda_order_live", lambda env: list(fastest_first))
    cap = capture(samples=0, sleep=no_sleep)
    assert [d["physical_index"] for d in cap.info["devices"]] == [1, 0]

    def no_subprocess(env: object) -> list[str]:
        raise AssertionError("a replay must not run the CUDA enumeration subprocess")

    monkeypatch.setattr(cuda, "_cuda_order_live", no_subprocess)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert replayed_info(cap) == cap.info


def test_a_project_capability_table_in_the_working_directory_stays_out_of_the_capture(
    install: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from accelplat._capabilities import clear_project_capabilities

    two_h200(install)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.accelplat.capabilities]\nmy-kernel = { platforms = ["cuda"] }\n'
    )
    monkeypatch.chdir(tmp_path)
    try:
        cap = capture(samples=0, sleep=no_sleep)
    finally:
        clear_project_capabilities()
    assert "my-kernel" not in cap.info["capabilities"]
    assert "fp8" in cap.info["capabilities"]
    assert Path.cwd() == tmp_path


def test_a_replay_answers_host_files_from_the_bundle_and_user_files_from_this_machine(
    tmp_path: Path,
) -> None:
    from accelplat import _files

    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    with replaying(HOSTS / "cpu-x86_64.tar.gz"):
        assert _files.read_text(trace) == "{}"
        assert _files.read_text("/proc/meminfo", limit=1 << 20).startswith("MemTotal:")
        with pytest.raises(FileNotFoundError, match="not in the capture bundle"):
            _files.read_text("/proc/self/never-read")
        assert not _files.exists("/sys/class/never-looked-at")


def test_caches_registered_with_on_reset_are_dropped_when_a_replay_starts_and_ends() -> None:
    calls: list[object] = []
    _boundary.on_reset(lambda: calls.append(_boundary.active()))
    try:
        with replaying(HOSTS / "cpu-x86_64.tar.gz") as replayer:
            assert calls == [replayer]
        assert calls == [replayer, None]
    finally:
        _boundary._on_reset.pop()


def test_the_variable_is_applied_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelplat._replay._install import activate_from_environment

    monkeypatch.setenv("ACCELPLAT_REPLAY", "  ")
    assert activate_from_environment() is None
    assert _boundary.active() is None


def test_a_bundle_that_cannot_load_raises_its_error_at_every_question_not_at_activation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat import _files
    from accelplat._replay._install import activate_from_environment
    from accelplat.errors import BundleError

    monkeypatch.setenv("ACCELPLAT_REPLAY", str(tmp_path / "missing.tar.gz"))
    try:
        assert activate_from_environment() is None
        with pytest.raises(BundleError, match=r"missing\.tar\.gz: cannot open") as first:
            _files.read_text("/proc/meminfo")
        with pytest.raises(BundleError) as again:
            _boundary.vendor("nvml", lambda: (None, "", ""))
        assert again.value is first.value
        with pytest.raises(BundleError) as checked:
            _boundary.check()
        assert checked.value is first.value
        with pytest.raises(BundleError):
            current_platform().devices()
    finally:
        _files.set_host_files(None)
        _boundary.install(None)


def test_the_replay_formats_import_no_detection_and_capture_is_loaded_on_first_use() -> None:
    import subprocess

    code = (
        "import sys, accelplat.replay as r\n"
        "above = ('accelplat._capture', 'accelplat._registry')\n"
        "print(sorted(m for m in above if m in sys.modules))\n"
        "print(r.capture.__module__, r.compare_info.__module__, r.Capture.__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split("\n")[:2] == ["[]", "accelplat._capture accelplat._capture Capture"]


def test_what_a_capture_prints_and_keeps_in_contents_cannot_drive_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelplat._cli import main

    title = "\x1b]0;owned\x07"
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text(f"0::/job{title}\u202e\n")
    monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(tmp_path / "proc"))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    monkeypatch.setenv("SLURM_JOB_GPUS", f"0{title}")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "\x1b[2J")
    cap = capture(samples=0, sleep=no_sleep)
    assert cap.host["summary"]["scheduler"]["variables"]["SLURM_JOB_GPUS"] == f"0{title}"
    assert all(line.isprintable() for line in cap.contents.split("\n"))
    assert "SLURM_JOB_GPUS=0\\x1b]0;owned\\x07" in cap.contents
    assert "/job\\x1b]0;owned\\x07\\u202e" in cap.contents
    assert "driver: unknown" in cap.contents  # no driver on a CPU host: never "None"
    assert main(["capture", "--out", str(tmp_path / "host.tar.gz"), "--samples", "0"]) == 0
    out = capsys.readouterr().out
    assert all(line.isprintable() for line in out.split("\n"))
    assert "driver: None" not in out
