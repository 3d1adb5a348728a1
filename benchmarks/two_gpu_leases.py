"""Device leases and multi-GPU waits on a real host with two (or more) NVIDIA GPUs.

Each section runs on its own and appends its outcome, as one JSON object per line, to
``--out`` (default ``two_gpu_results.jsonl``) the moment it ends, so one failure loses nothing
else. This process never imports torch; children do.

Sections:

* ``info``: driver, torch and the GPUs (NVML UUIDs).
* ``concurrent``: two ``accelplat lease -n 1 -- CMD`` started together get different GPUs (the
  UUID torch reports in each CMD) and run at the same time.
* ``two_waits``: while one GPU is leased for 3 s, ``accelplat lease -n 2`` waits, then gets both.
* ``sigkill``: a holder leases a GPU, fills 8 GiB on it and is killed with SIGKILL while a
  contender that sees only that GPU waits; reports when the lock was free, when the memory was
  back (1 ms oracle) and when the contender got the lease.
* ``pytest_xdist``: ``pytest -n 2 --accelplat-lease tests/gpu/test_lease_real.py``: single-GPU
  tests run concurrently on distinct GPUs (UUIDs from torch in a child of each test); then the
  two-GPU test without workers.
* ``cvd1_wait``: under ``CUDA_VISIBLE_DEVICES=1``, visible device 0 reads physical GPU 1, and a
  wait on it returns when the memory a child held there is back.
* ``usage_stats``: ``record_usage_stats()`` over both GPUs while children hold 4 and 12 GiB.
* ``staggered``: children on GPU 0 and GPU 1 released 1 s apart (SIGKILL, then normal exit);
  accelplat's two-device wait against a fixed 5 s poller (vLLM's default) and the oracle.

Run: ``PYTHONPATH=. python benchmarks/two_gpu_leases.py --out results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import accelplat
from accelplat import GIB
from accelplat._memory import wait_for_memory_to_clear

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_settle import fixed_interval_wait, parent_holds_memory  # noqa: E402

TORCH_UUID = (
    "import json, sys, time, torch\n"
    "t0 = time.time()\n"
    "x = torch.ones(256 * 1024**2, dtype=torch.uint8, device='cuda:0'); torch.cuda.synchronize()\n"
    "u = ['GPU-' + str(torch.cuda.get_device_properties(i).uuid) "
    "for i in range(torch.cuda.device_count())]\n"
    "time.sleep(float(sys.argv[1]))\n"
    "print(json.dumps({'uuids': u, 'start': t0, 'end': time.time()}))\n"
)

HOLDER = r"""
import sys, time
gib = int(sys.argv[1])
import torch
x = torch.empty(gib * 1024**3, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        sys.exit(0)
"""

LEASED_HOLDER = r"""
import sys, time, json
import accelplat
held = accelplat.lease(1, timeout_s=60).acquire()
held.apply()
import torch
x = torch.empty(8 * 1024**3, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print(json.dumps({"uuid": held.devices[0].uuid, "ready": time.time()}), flush=True)
time.sleep(600)
"""

CONTENDER = r"""
import json, time
import accelplat
t0 = time.time()
with accelplat.lease(1, timeout_s=120) as held:
    print(json.dumps({"start": t0, "leased": time.time(), "waited_s": held.waited_s,
                      "uuid": held.devices[0].uuid}), flush=True)
"""


class Results:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed = 0

    def section(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        started = time.time()
        try:
            doc = {"section": name, "ok": True, **fn()}
        except Exception as exc:
            self.failed += 1
            doc = {"section": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
        doc["seconds"] = round(time.time() - started, 2)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(doc) + "\n")
        print(json.dumps(doc), flush=True)


def env_with(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def physical_used(uuid: str) -> int:
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def wait_line(proc: subprocess.Popen[str], timeout: float = 180) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError("child printed nothing in time")
    return proc.stdout.readline().strip()


class Oracle(threading.Thread):
    """Samples used memory of GPUs (by UUID) every millisecond; records when each came back."""

    def __init__(self, targets: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.targets = targets
        self.back: dict[str, float] = {}
        self.stop = threading.Event()
        self.parent_held = 0

    def run(self) -> None:
        last = 0.0
        while not self.stop.is_set():
            now = time.time()
            for uuid, target in self.targets.items():
                if uuid not in self.back and physical_used(uuid) <= target:
                    self.back[uuid] = now
            if now - last > 0.05:
                self.parent_held = max(self.parent_held, parent_holds_memory())
                last = now
            time.sleep(0.001)


# --------------------------------------------------------------------------------------------


def info() -> dict[str, Any]:
    plat = accelplat.current_platform()
    probe = "import torch; print(torch.__version__, torch.version.cuda)"
    torch_version = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    ).stdout.strip()
    return {
        "platform": plat.name,
        "driver": plat.driver_version(),  # type: ignore[attr-defined]
        "torch": torch_version,
        "gpus": [{"index": d.index, "uuid": d.uuid, "name": d.name} for d in plat.devices()],
    }


def cli_lease(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "accelplat", "lease", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def concurrent() -> dict[str, Any]:
    procs = [cli_lease("-n", "1", "--", sys.executable, "-c", TORCH_UUID, "2") for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            raise RuntimeError(f"lease CLI exited {proc.returncode}: {err[-500:]}")
        outs.append({**json.loads(out.strip().splitlines()[-1]), "stderr": err.strip()[-300:]})
    uuids = [o["uuids"] for o in outs]
    overlap = min(o["end"] for o in outs) - max(o["start"] for o in outs)
    assert all(len(u) == 1 for u in uuids), uuids
    assert uuids[0] != uuids[1], f"both leases ran on {uuids[0]}"
    assert overlap > 0, "the two leases did not run at the same time"
    return {"uuids": uuids, "overlap_s": round(overlap, 3), "children": outs}


def two_waits() -> dict[str, Any]:
    holder = cli_lease("-n", "1", "--", sys.executable, "-c",
                       "import time; print('ready', flush=True); time.sleep(3)")  # fmt: skip
    if wait_line(holder) != "ready":
        raise RuntimeError("holder did not start")
    t_start = time.time()
    script = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], time.time())"
    both = cli_lease("-n", "2", "--", sys.executable, "-c", script)
    out, err = both.communicate(timeout=120)
    holder.communicate(timeout=60)
    visible, t_run = out.split()
    waited = float(t_run) - t_start
    assert len(visible.split(",")) == 2, visible
    assert waited > 2.0, f"the two-GPU lease did not wait for the held GPU ({waited:.2f} s)"
    return {"visible": visible, "waited_s": round(waited, 3), "stderr": err.strip()[-300:]}


def sigkill() -> dict[str, Any]:
    holder = subprocess.Popen([sys.executable, "-c", LEASED_HOLDER],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    line = wait_line(holder)
    meta = json.loads(line)
    uuid = meta["uuid"]
    held_used = physical_used(uuid)
    contender = subprocess.Popen(
        [sys.executable, "-c", CONTENDER], stdout=subprocess.PIPE, text=True,
        env=env_with(CUDA_VISIBLE_DEVICES=uuid),
    )  # fmt: skip
    time.sleep(1.5)  # the contender is polling the lock by now
    assert contender.poll() is None, "the contender got a GPU that is held"
    oracle = Oracle({uuid: 1 * GIB})
    oracle.start()
    time.sleep(0.1)
    t_kill = time.time()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    out = wait_line(contender, 120)
    contender.wait(timeout=60)
    time.sleep(0.05)
    oracle.stop.set()
    oracle.join()
    got = json.loads(out)
    t_back = oracle.back.get(uuid, float("nan"))
    after_back = got["leased"] - t_back
    assert got["uuid"] == uuid
    assert after_back < 1.0, f"leased {after_back:.3f} s after the memory came back"
    assert got["leased"] >= t_back - 0.005, "leased before the memory was back"
    return {
        "uuid": uuid,
        "held_used_gib": round(held_used / GIB, 2),
        "memory_back_after_kill_s": round(t_back - t_kill, 4),
        "leased_after_kill_s": round(got["leased"] - t_kill, 4),
        "leased_after_memory_back_s": round(after_back, 4),
        "parent_held_bytes": oracle.parent_held,
    }


def pytest_xdist(out_dir: Path) -> dict[str, Any]:
    log = out_dir / "pytest_lease_log.jsonl"
    log.unlink(missing_ok=True)
    env = env_with(LEASE_GPU_LOG=str(log), ACCELPLAT_LEASE_DIR=str(out_dir / "pytest-locks"))
    base = [sys.executable, "-m", "pytest", "-p", "accelplat.pytest_plugin", "-p",
            "no:cacheprovider", "-q", "tests/gpu/test_lease_real.py"]  # fmt: skip

    def pytest(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *options], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip

    first = pytest("-n", "2", "--accelplat-lease", "-k", "single")
    second = pytest("--accelplat-lease", "-k", "two")
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    singles = [r for r in rows if r["test"].startswith("single")]
    per_worker: dict[str, set[str]] = {}
    for r in singles:
        per_worker.setdefault(r["worker"], set()).update(r["uuids"])
    spans = sorted((r["start"], r["end"], r["worker"]) for r in singles)
    concurrent_pairs = sum(
        1 for i, a in enumerate(spans) for b in spans[i + 1 :] if a[2] != b[2] and b[0] < a[1]
    )
    doc = {
        "xdist_rc": first.returncode,
        "xdist_tail": first.stdout[-600:],
        "two_gpu_rc": second.returncode,
        "two_gpu_tail": second.stdout[-400:],
        "per_worker_uuids": {k: sorted(v) for k, v in per_worker.items()},
        "overlapping_cross_worker_pairs": concurrent_pairs,
        "two_gpu_rows": [r for r in rows if r["test"] == "two"],
    }
    assert first.returncode == 0, doc
    assert second.returncode == 0, doc
    assert len(per_worker) == 2, doc
    assert all(len(v) == 1 for v in per_worker.values()), doc
    (a, b) = per_worker.values()
    assert a != b, doc
    assert concurrent_pairs > 0, doc
    return doc


def cvd1_wait() -> dict[str, Any]:
    plat = accelplat.current_platform()
    physical = {d.index: d.uuid or "" for d in plat.devices()}
    uuid1 = physical[1]
    child = subprocess.Popen([sys.executable, "-c", HOLDER, "8"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env=env_with(CUDA_VISIBLE_DEVICES="1"))  # fmt: skip
    if wait_line(child) != "ready":
        raise RuntimeError("child did not allocate")
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = "1"
    try:
        (dev,) = plat.devices()
        seen = plat.memory_info(0).used
        truth1, truth0 = physical_used(uuid1), physical_used(physical[0])
        assert dev.uuid == uuid1, dev
        assert dev.physical_index == 1, dev
        oracle = Oracle({uuid1: 1 * GIB})
        oracle.start()
        time.sleep(0.1)
        t_release = time.time()
        assert child.stdin is not None
        child.stdin.write("exit\n")
        child.stdin.flush()
        result = wait_for_memory_to_clear([0], threshold_bytes=1 * GIB, timeout_s=60)
        t_done = time.time()
        child.wait(timeout=60)
        oracle.stop.set()
        oracle.join()
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
        if child.poll() is None:
            child.kill()
    t_back = oracle.back.get(uuid1, float("nan"))
    return {
        "visible0": {"uuid": dev.uuid, "physical_index": dev.physical_index},
        "visible0_used_gib": round(seen / GIB, 3),
        "nvml_physical1_used_gib": round(truth1 / GIB, 3),
        "nvml_physical0_used_gib": round(truth0 / GIB, 3),
        "memory_back_after_exit_s": round(t_back - t_release, 4),
        "wait_returned_after_exit_s": round(t_done - t_release, 4),
        "wait_beyond_memory_back_ms": round((t_done - t_back) * 1000, 1),
        "polls": result.polls,
    }


def start_holders(sizes: dict[int, int]) -> dict[int, subprocess.Popen[str]]:
    children = {}
    for index, gib in sizes.items():
        children[index] = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(gib)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env_with(CUDA_VISIBLE_DEVICES=str(index)),
        )  # fmt: skip
    for child in children.values():
        if wait_line(child) != "ready":
            raise RuntimeError("child did not allocate")
    return children


def usage_stats() -> dict[str, Any]:
    plat = accelplat.current_platform()
    uuids = {d.index: d.uuid for d in plat.devices()}
    before = accelplat.record_usage_stats([0, 1])
    children = start_holders({0: 4, 1: 12})
    try:
        during = accelplat.record_usage_stats([0, 1])
        truth = {i: physical_used(u or "") / GIB for i, u in uuids.items() if i in (0, 1)}
    finally:
        for child in children.values():
            child.kill()
            child.wait()
    grew = {i: during[i][0] - before[i][0] for i in (0, 1)}
    assert 4.0 <= grew[0] < 5.5, grew
    assert 12.0 <= grew[1] < 13.5, grew
    return {
        "before": before,
        "during": during,
        "grew_gib": grew,
        "nvml_v2_used_gib": truth,
    }


def staggered(release: str, gap_s: float = 1.0) -> dict[str, Any]:
    plat = accelplat.current_platform()
    uuids = {d.index: d.uuid or "" for d in plat.devices()}
    baseline = {i: plat.memory_info(i).used for i in (0, 1)}
    targets = {i: baseline[i] + GIB for i in (0, 1)}
    children = start_holders({0: 8, 1: 8})
    oracle = Oracle({uuids[i]: targets[i] for i in (0, 1)})
    oracle.start()
    time.sleep(0.2)
    box: dict[str, float] = {}

    def ours() -> None:
        wait_for_memory_to_clear([0, 1], threshold_bytes=targets, timeout_s=60)
        box["accelplat"] = time.time()

    def fixed() -> None:
        fixed_interval_wait(
            lambda: max(plat.memory_info(i).used - targets[i] for i in (0, 1)),
            threshold=0, interval_s=5.0, window_s=0.0, timeout_s=60, clock=_Clock(),
        )  # fmt: skip
        box["fixed"] = time.time()

    def free(child: subprocess.Popen[str]) -> None:
        if release == "kill":
            child.kill()
        else:
            assert child.stdin is not None
            child.stdin.write("exit\n")
            child.stdin.flush()

    threads = [threading.Thread(target=ours), threading.Thread(target=fixed)]
    t0 = time.time()
    for t in threads:
        t.start()
    free(children[0])
    time.sleep(gap_s)
    t1 = time.time()
    free(children[1])
    for t in threads:
        t.join()
    for child in children.values():
        child.wait(timeout=60)
    oracle.stop.set()
    oracle.join()
    back = max(oracle.back.get(uuids[i], float("nan")) for i in (0, 1))
    doc = {
        "release": release,
        "gap_s": gap_s,
        "gpu0_back_s": round(oracle.back.get(uuids[0], float("nan")) - t0, 4),
        "gpu1_back_s": round(oracle.back.get(uuids[1], float("nan")) - t0, 4),
        "second_release_s": round(t1 - t0, 4),
        "accelplat_s": round(box["accelplat"] - t0, 4),
        "fixed_5s_poller_s": round(box["fixed"] - t0, 4),
        "accelplat_beyond_both_back_ms": round((box["accelplat"] - back) * 1000, 1),
        "speedup_vs_fixed": round((box["fixed"] - t0) / (box["accelplat"] - t0), 2),
        "parent_held_bytes": oracle.parent_held,
    }
    assert box["accelplat"] >= back - 0.005, "returned before both GPUs were back"
    return doc


class _Clock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default="two_gpu_results.jsonl")
    parser.add_argument("--only", default="", help="comma-separated sections to run")
    parser.add_argument("--work", default=None, help="scratch directory (default: a new one)")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="two-gpu-leases-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ACCELPLAT_LEASE_DIR", str(work / "locks"))
    results = Results(out)
    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "info": info,
        "concurrent": concurrent,
        "two_waits": two_waits,
        "sigkill": sigkill,
        "pytest_xdist": lambda: pytest_xdist(work),
        "cvd1_wait": cvd1_wait,
        "usage_stats": usage_stats,
        "staggered_kill": lambda: staggered("kill"),
        "staggered_exit": lambda: staggered("exit"),
    }
    only = {s for s in args.only.split(",") if s}
    for name, fn in sections.items():
        if not only or name in only:
            results.section(name, fn)
    torch_loaded = "torch" in sys.modules
    print(f"failed sections: {results.failed}; torch imported by this process: {torch_loaded}")
    return 1 if results.failed or torch_loaded else 0


if __name__ == "__main__":
    sys.exit(main())
