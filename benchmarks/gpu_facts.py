"""What an NVIDIA card shows that accelplat's simulations and enforcement assume.

Prints, for GPU 0 of this host:

* the driver, NVML and card identity, MIG mode and the compute mode (read, never changed);
* the device memory a torch process's context takes (NVML's per-process figure after
  ``torch.cuda.init()`` and one small tensor), the figure the simulated platform uses;
* after SIGKILL of a process holding 4 GiB: when NVML's process list drops it and when the
  device's used memory is back (the simulated release delay), over several trials;
* whether NVIDIA's MPS binaries are present, and if so, with a control daemon started for this
  run only (private pipe and log directories, quit at the end; the compute mode is never
  changed): whether ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` stops a client that allocates past its
  limit, and what NVML's process lists show for MPS clients.

Run: ``python benchmarks/gpu_facts.py [--trials 5] [--json facts.json]`` (needs torch and
nvidia-ml-py; this process imports neither torch nor creates a context).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pynvml

GIB = 1 << 30
MIB = 1 << 20

HOLDER = r"""
import sys, time, torch
torch.cuda.init()
x = torch.ones(1, device="cuda")
torch.cuda.synchronize()
print("context", flush=True)
sys.stdin.readline()
block = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print("held", flush=True)
sys.stdin.readline()
try:
    more = torch.empty(int(float(sys.argv[2]) * 2**30), dtype=torch.uint8, device="cuda")
    more.fill_(1)
    torch.cuda.synchronize()
    print("more ok", flush=True)
except torch.OutOfMemoryError as exc:
    print("more oom " + str(exc).splitlines()[0][:160], flush=True)
time.sleep(3600)
"""


def _procs(handle: Any) -> dict[int, int]:
    """pid -> bytes from the compute list and, where the binding has it, the MPS list."""
    out: dict[int, int] = {}
    readers = [pynvml.nvmlDeviceGetComputeRunningProcesses]
    mps = getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
    if mps is not None:
        readers.append(mps)
    for read in readers:
        try:
            for proc in read(handle):
                used = proc.usedGpuMemory
                out[proc.pid] = -1 if used is None else int(used)
        except pynvml.NVMLError:
            continue
    return out


def _lists(handle: Any) -> dict[str, list[tuple[int, int]]]:
    shown: dict[str, list[tuple[int, int]]] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        read = getattr(pynvml, name, None)
        if read is None:
            shown[name] = []
            continue
        try:
            shown[name] = [
                (p.pid, -1 if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in read(handle)
            ]
        except pynvml.NVMLError as exc:
            shown[name] = [(-1, -1)]
            print(f"  {name}: {exc}")
    return shown


def _used(handle: Any) -> int:
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)


def _holder(hold_gib: float, more_gib: float, env: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(hold_gib), str(more_gib)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def _wait_for(predicate: Any, limit_s: float, step_s: float = 0.0005) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(step_s)
    return None


def identity(handle: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "nvml": pynvml.nvmlSystemGetNVMLVersion(),
        "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion_v2(),
        "name": pynvml.nvmlDeviceGetName(handle),
        "binding": getattr(pynvml, "__version__", "?"),
    }
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    facts.update(total=int(v2.total), reserved=int(v2.reserved), used=int(v2.used))
    for key, call in (
        ("mig_mode", lambda: pynvml.nvmlDeviceGetMigMode(handle)),
        ("max_mig_devices", lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)),
        ("compute_mode", lambda: pynvml.nvmlDeviceGetComputeMode(handle)),
    ):
        try:
            facts[key] = call()
        except pynvml.NVMLError as exc:
            facts[key] = f"error: {exc}"
    facts["binding_has"] = {
        name: hasattr(pynvml, name)
        for name in (
            "nvmlDeviceGetMPSComputeRunningProcesses",
            "nvmlDeviceSetMemoryLimits",
            "nvmlDeviceSetMemoryLimits_v1",
            "nvmlDeviceGetMigDeviceHandleByIndex",
            "nvmlDeviceGetGpuInstanceProfileInfoV",
        )
    }
    return facts


def context_and_release(handle: Any, trials: int) -> dict[str, Any]:
    contexts: list[int] = []
    dropped: list[float] = []
    back: list[float] = []
    gaps: list[float] = []
    for _ in range(trials):
        base = _used(handle)
        child = _holder(4, 0)
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdout.readline()
        time.sleep(0.2)
        contexts.append(_procs(handle).get(child.pid, -1))
        child.stdin.write("\n")
        child.stdin.flush()
        child.stdout.readline()
        time.sleep(0.2)
        held = _used(handle)
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        pid = child.pid
        gone = _wait_for(lambda pid=pid: pid not in _procs(handle), 30)
        after_list = time.monotonic()
        floor = base + 64 * MIB
        freed = _wait_for(lambda floor=floor: _used(handle) <= floor, 30)
        child.wait()
        if gone is not None:
            dropped.append(gone)
        if freed is not None:
            back.append(after_list - killed + freed)
            gaps.append(freed)
        print(
            f"  trial: context {contexts[-1] / MIB:.0f} MiB, held {(held - base) / GIB:.2f} GiB, "
            f"list dropped {gone}, memory back {freed} s after that"
        )
    return {
        "context_bytes": contexts,
        "sigkill_to_list_drop_s": dropped,
        "sigkill_to_memory_back_s": back,
        "list_drop_to_memory_back_s": gaps,
        "median_list_drop_s": statistics.median(dropped) if dropped else None,
        "median_memory_back_s": statistics.median(back) if back else None,
    }


def mps(handle: Any) -> dict[str, Any]:
    control = shutil.which("nvidia-cuda-mps-control")
    facts: dict[str, Any] = {
        "control": control,
        "server": shutil.which("nvidia-cuda-mps-server"),
    }
    if control is None:
        return facts
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    env = dict(os.environ)
    env.update(CUDA_MPS_PIPE_DIRECTORY=str(root / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(root / "log"))
    (root / "pipe").mkdir()
    (root / "log").mkdir()
    started = subprocess.run(
        [control, "-d"], check=False, env=env, capture_output=True, text=True, timeout=20
    )
    facts["start_rc"] = started.returncode
    facts["start_err"] = started.stderr[-400:]
    try:
        client_env = dict(env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=3G")
        t = time.monotonic()
        child = _holder(1, 4, client_env)
        assert child.stdin is not None
        assert child.stdout is not None
        facts["client_context"] = child.stdout.readline().strip()
        facts["client_start_s"] = time.monotonic() - t
        child.stdin.write("\n")
        child.stdin.flush()
        facts["client_hold_1gib"] = child.stdout.readline().strip()
        time.sleep(0.3)
        facts["lists_while_client_holds"] = _lists(handle)
        facts["client_pid"] = child.pid
        child.stdin.write("\n")
        child.stdin.flush()
        facts["client_beyond_limit"] = child.stdout.readline().strip()
        child.kill()
        child.wait()
        unlimited = _holder(1, 4, env)
        assert unlimited.stdin is not None
        assert unlimited.stdout is not None
        unlimited.stdout.readline()
        unlimited.stdin.write("\n\n")
        unlimited.stdin.flush()
        unlimited.stdout.readline()
        facts["unlimited_client_4gib_more"] = unlimited.stdout.readline().strip()
        unlimited.kill()
        unlimited.wait()
    except Exception as exc:  # report what broke; the daemon is quit below either way
        facts["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        quit_ = subprocess.run(
            [control],
            check=False,
            input="quit\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        facts["quit_rc"] = quit_.returncode
        logs = root / "log" / "control.log"
        if logs.is_file():
            facts["control_log_tail"] = logs.read_text(errors="replace")[-1500:]
    return facts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-mps", action="store_true")
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    facts: dict[str, Any] = {"identity": identity(handle)}
    print(json.dumps(facts["identity"], indent=1))
    print("context size and release after SIGKILL:")
    facts["release"] = context_and_release(handle, args.trials)
    if not args.no_mps:
        print("MPS:")
        facts["mps"] = mps(handle)
        print(json.dumps(facts["mps"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
