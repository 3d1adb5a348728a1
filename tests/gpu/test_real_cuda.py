"""The CUDA backend on a real NVIDIA GPU, checked against NVML, the CUDA driver and torch.

Skips the whole module unless ``pynvml`` (nvidia-ml-py) imports and NVML finds a GPU. Needs only
pytest, nvidia-ml-py and psutil; the comparisons with torch skip when torch is not installed.
Every check that could create a CUDA context (torch, the CUDA driver) runs in a subprocess, so
this process stays context-free and can assert that accelplat keeps it so.

Run from the repository root::

    PYTHONPATH=. python -m pytest tests/gpu -q
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import require_nvidia_gpu

_COUNT = require_nvidia_gpu()

import pynvml  # noqa: E402

from accelplat import _registry as registry  # noqa: E402
from accelplat._backends.cuda import CudaPlatform, cuda_order_uuids  # noqa: E402
from accelplat._types import GIB, MIB, HolderState  # noqa: E402

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


@pytest.fixture(autouse=True)
def _plain_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


def _env(cvd: str | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ACCELPLAT_") and k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    return env


def _run_json(script: str, cvd: str | None = None, timeout: float = 300) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(cvd),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class _Paused:
    """A child that runs ``script``, prints one JSON line, then waits until told to exit."""

    def __init__(self, script: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script + "\nimport sys\nsys.stdin.readline()\n"],
            env=_env(),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise AssertionError(
                f"child failed: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        self.report: Any = json.loads(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
                self.proc.wait(30)


def _physical() -> list[tuple[int, str, Any]]:
    out = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        out.append((index, str(pynvml.nvmlDeviceGetUUID(handle)), handle))
    return out


def _compute_entries() -> set[tuple[str, int, int | None]]:
    """Every (GPU UUID, pid, used bytes) NVML lists as a compute process, seen from here."""
    entries: set[tuple[str, int, int | None]] = set()
    for _, uuid, handle in _physical():
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            entries.add((uuid, int(proc.pid), proc.usedGpuMemory))
    return entries


def _pids(entries: set[tuple[str, int, int | None]]) -> set[tuple[str, int]]:
    return {(u, p) for u, p, _ in entries}


@pytest.fixture
def platform() -> CudaPlatform:
    registry.reset()
    p = registry.current_platform()
    assert isinstance(p, CudaPlatform)
    return p


# -- detection and memory --------------------------------------------------------------------


def test_cuda_is_detected(platform: CudaPlatform) -> None:
    assert platform.name == "cuda"
    result = CudaPlatform.probe()
    assert result.available, result.reason
    assert platform.device_count() >= 1
    assert platform.driver_version() == str(pynvml.nvmlSystemGetDriverVersion())


def test_memory_info_is_nvml_total_less_reserved(platform: CudaPlatform) -> None:
    for dev in platform.devices():
        info = platform.memory_info(dev.index)
        handle = pynvml.nvmlDeviceGetHandleByUUID(dev.uuid)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        assert info.source == "nvml-v2"
        assert info.total == v2.total - v2.reserved
        assert info.reserved == v2.reserved
        assert abs(info.free - v2.free) <= 64 * MIB  # other processes may move it a little
        # the vendor fact the backend relies on: v1 counts the reserved memory as used
        assert abs(v1.used - (v2.used + v2.reserved)) <= 64 * MIB
        assert v1.total == v2.total


def test_devices_match_nvml(platform: CudaPlatform) -> None:
    physical = {uuid: index for index, uuid, _ in _physical()}
    for dev in platform.devices():
        assert dev.uuid is not None
        if dev.uuid.startswith("GPU-"):
            assert physical[dev.uuid] == dev.physical_index
        handle = pynvml.nvmlDeviceGetHandleByIndex(dev.physical_index)
        assert dev.pci_bus_id is not None
        bus = str(pynvml.nvmlDeviceGetPciInfo(handle).busId).lower()
        assert bus.endswith(dev.pci_bus_id)


def test_cuda_visible_devices_1_maps_visible_0_to_physical_1(
    platform: CudaPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _COUNT < 2:
        pytest.skip("needs two GPUs")
    _, uuid1, handle1 = _physical()[1]
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (dev,) = platform.devices()
    assert (dev.physical_index, dev.uuid) == (1, uuid1)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle1, version=pynvml.nvmlMemory_v2)
    assert platform.memory_info(0).total == v2.total - v2.reserved


# -- no context, no torch --------------------------------------------------------------------

_ACCELPLAT_WORK = """
import json, sys
import accelplat
p = accelplat.current_platform()
mem = [p.memory_info(i) for i in range(p.device_count())]
holders = p.memory_holders(0)
graph = p.graph
print(json.dumps({"name": p.name, "torch": "torch" in sys.modules,
                  "free": [m.free for m in mem], "holders": holders is not None}), flush=True)
"""


def test_accelplat_creates_no_context_and_imports_no_torch() -> None:
    before = _compute_entries()
    child = _Paused(_ACCELPLAT_WORK)
    try:
        during = _compute_entries()
    finally:
        child.close()
    assert child.report["name"] == "cuda"
    assert child.report["torch"] is False
    new = _pids(during) - _pids(before)
    assert not new, f"a process appeared in NVML's compute list while accelplat ran: {new}"
    assert child.pid not in {p for _, p in _pids(during)}


_TORCH_VS_ACCELPLAT = """
import json, sys
import accelplat
p = accelplat.current_platform()
devices = sorted({0, p.device_count() - 1})
before = {i: p.memory_info(i) for i in devices}
import torch
out = {}
for i in devices:
    free_t, total_t = torch.cuda.mem_get_info(i)
    after = p.memory_info(i)
    out[i] = {"torch_free": free_t, "torch_total": total_t, "free": after.free,
              "total": after.total, "before_free": before[i].free, "before_total": before[i].total}
print(json.dumps(out), flush=True)
"""


@needs_torch
def test_memory_agrees_with_torch_mem_get_info() -> None:
    before = _compute_entries()
    child = _Paused(_TORCH_VS_ACCELPLAT)
    try:
        during = _compute_entries()
    finally:
        child.close()
    # positive control: torch's context does show up, so the no-context test above has teeth
    assert _pids(during) - _pids(before), "torch's CUDA context did not appear in NVML's list"
    for index, row in child.report.items():
        assert row["total"] == row["torch_total"], (index, row)
        assert row["before_total"] == row["torch_total"], (index, row)
        assert abs(row["free"] - row["torch_free"]) <= 16 * MIB, (index, row)
        # the context torch created is visible to accelplat as memory gone
        assert row["before_free"] - row["free"] >= 64 * MIB, (index, row)


_HOLDER = """
import json, os, torch
x = torch.empty(1024**3, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid()}), flush=True)
"""


@needs_torch
def test_holders_show_a_torch_child_and_memory_returns_eagerly(platform: CudaPlatform) -> None:
    baseline = platform.memory_info(0).used
    child = _Paused(_HOLDER)
    try:
        holders = platform.memory_holders(0)
        assert holders is not None
        big = [h for h in holders if h.used_bytes is not None and h.used_bytes >= 1 * GIB]
        assert big, holders
        for holder in holders:
            if holder.pid == child.pid:
                assert holder.state is HolderState.CHILD
        assert platform.memory_info(0).used >= baseline + 1 * GIB
    finally:
        child.close()
    deadline = time.monotonic() + 15
    while platform.memory_info(0).used > baseline + 256 * MIB:
        assert time.monotonic() < deadline, "memory did not come back within 15 s"
        time.sleep(0.05)


# -- CUDA_VISIBLE_DEVICES forms against the CUDA driver and torch ----------------------------


def _forms(uuids: list[str]) -> list[str | None]:
    n = len(uuids)
    u0 = uuids[0]
    forms: list[str | None] = [
        None,
        "",
        "NoDevFiles",
        "0",
        str(n - 1),
        "0,0",
        f"0,{n}",
        f"0,{n},0",
        "0abc",
        "+0",
        "-0",
        " 0 ",
        "0,-1",
        u0,
        u0[:12],
        "GPU-",
        f"{u0},0",
        f"0,{u0}",
        f"{u0},{u0[:12]}",
        f" {u0}",
        "GPU-" + u0[4:].upper(),
        "gpu-" + u0[4:],
        f"{u0},GPU-ffffffff",
        "GPU-" + u0[4:12].upper(),
        f"{u0},GPU-{u0[4:].upper()}",
        u0 + " ",
        u0[:5],
        u0[:13],
        u0[:12] + "x",
        "GPU-" + u0[4:].replace("-", ""),
        "GPU-" + u0[4:].replace("-", "")[:12],
        "GPU-" + u0[4:7] + "-" + u0[7:12],
        u0[:12] + " ",
        u0[:12] + "\t",
        u0 + "x",
        u0 + "0",
        u0 + "-",
        u0[:12] + "-x",
        "MIG-",
        "0 1",
        "\t0",
        "0,\t0",
        "00",
        "0x1",
    ]
    if n >= 2:
        u1 = uuids[1]
        forms += ["1,0", "1", f"{u1},{u0}", f"{u1[:12]},0", f"1,{n},0", "0,1,0", "1gpu2,0"]
    return forms


_DRIVER_VIEW = r"""
import ctypes, json
lib = ctypes.CDLL("libcuda.so.1")
rc = lib.cuInit(0)
uuids = []
if rc == 0:
    n = ctypes.c_int(0)
    lib.cuDeviceGetCount(ctypes.byref(n))
    for i in range(n.value):
        dev = ctypes.c_int(0)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        raw = (ctypes.c_ubyte * 16)()
        lib.cuDeviceGetUuid(raw, dev)
        h = bytes(raw).hex()
        uuids.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
print(json.dumps({"init": rc, "uuids": uuids}))
"""


def test_forms_agree_with_the_cuda_driver(
    platform: CudaPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the CUDA driver itself makes visible (cuInit in a fresh process) is what we say."""
    order = cuda_order_uuids(_env())  # every GPU, in the driver's order
    assert set(order) <= {u for _, u, _ in _physical()}
    rows = []
    for form in _forms(order):
        driver = _run_json(_DRIVER_VIEW, cvd=form)
        if form is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", form)
        ours = [d.uuid for d in platform.devices()]
        rows.append((form, driver["init"], driver["uuids"], ours))
    short = {u: f"#{i}" for i, u in enumerate(order)}
    print("\nCUDA_VISIBLE_DEVICES -> cuInit, CUDA driver's devices | accelplat's devices")
    for form, init, theirs, ours in rows:
        mark = "" if theirs == ours else "   <-- MISMATCH"
        print(
            f"  {form!r:60} -> {init:3d} {[short.get(u, u) for u in theirs]} | "
            f"{[short.get(u, u) for u in ours]}{mark}"
        )
    mismatches = [r for r in rows if r[2] != r[3]]
    assert not mismatches, mismatches


_TORCH_UUIDS = """
import json, torch
n = torch._C._cuda_getDeviceCount()
print(json.dumps({"n": n, "torch_count": torch.cuda.device_count(),
                  "uuids": ["GPU-" + str(torch.cuda.get_device_properties(i).uuid)
                            for i in range(n)]}), flush=True)
"""


@needs_torch
def test_forms_agree_with_torch_cuda_device_uuids(
    platform: CudaPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = cuda_order_uuids(_env())
    u0 = order[0]
    forms = ["0", u0[:12], f"0,{len(order)}", str(len(order) - 1)]
    for form in forms:
        report = _run_json(_TORCH_UUIDS, cvd=form)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", form)
        assert [d.uuid for d in platform.devices()] == report["uuids"], (form, report)


def test_the_order_resolver_lists_every_gpu() -> None:
    uuids = cuda_order_uuids(_env())
    physical = {u for _, u, _ in _physical()}
    assert len(uuids) == len(set(uuids))
    assert set(uuids) == physical or all(u.startswith("GPU-") for u in uuids)


def test_the_real_backend_passes_the_conformance_kit() -> None:
    from accelplat.testing import run_conformance

    registry.reset()
    report = run_conformance("cuda", empty_visible_hides_all=True)
    failures = {r.name: r.detail for r in report.failures}
    assert not failures, report.summary()


# -- concurrency and fork --------------------------------------------------------------------


def test_32_threads_read_memory_at_once(platform: CudaPlatform) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(32)
    count = platform.device_count()

    def worker(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(50):
                assert platform.memory_info(i % count).total > 0
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reads_memory(platform: CudaPlatform) -> None:
    total = platform.memory_info(0).total
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if platform.memory_info(0).total == total else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
