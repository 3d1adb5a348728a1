"""Fork safety on a real NVIDIA GPU: accelplat in a parent never gets in the way of a child's CUDA.

A process that asks accelplat about the GPU (detection, snapshots, waits: all through NVML) must
stay free of any CUDA context, so it can still ``fork()`` workers that use CUDA, and it must see
those workers' memory come and go. The scenario runs in a fresh interpreter (the "parent") that
never imports torch; its forked child imports torch, initialises CUDA and allocates.

Skips unless NVML finds a GPU; the scenario skips when torch cannot use CUDA. Run from the
repository root::

    PYTHONPATH=. python -m pytest tests/gpu -q
"""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests._proc import run_python
from tests.gpu import require_nvidia_gpu

_COUNT = require_nvidia_gpu()

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
ALLOC_BYTES = 1 << 30
"""What the child allocates with torch (1 GiB), on top of its CUDA context."""

PARENT = textwrap.dedent(
    """
    import json, os, sys, threading, time

    import accelplat
    from accelplat._vendor import nvml as _nvml

    ALLOC = int(sys.argv[1])
    MIB = 1 << 20
    report = {}

    def say(doc):
        sys.stdout.write(json.dumps(doc) + "\\n")
        sys.stdout.flush()

    # -- the parent uses accelplat the way a test suite does --------------------------------
    platform = accelplat.current_platform()
    report["platform"] = platform.name
    baseline = accelplat.snapshot([0])
    accelplat.wait_for_memory_to_settle(threshold_ratio=1.0, devices=[0], timeout_s=30)
    accelplat.wait_for_memory_to_clear(
        [0], threshold_ratio=1.0, stable_duration_s=0.2, timeout_s=30
    )
    report["baseline_used"] = baseline.memory[0].used
    report["parent_holders_before"] = [h.pid for h in baseline.holders.get(0, ())]

    # threads keep polling NVML while the fork happens
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            platform.memory_info(0)

    pollers = [threading.Thread(target=poll, daemon=True) for _ in range(4)]
    for t in pollers:
        t.start()
    time.sleep(0.05)

    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # -- the child: torch, a CUDA context, an allocation -----------------------
        code = 1
        try:
            os.close(to_child_w)
            os.close(from_child_r)
            out = {"nvml_initialized_at_start": _nvml.initialized()}
            out["accelplat_in_child"] = accelplat.current_platform().memory_info(0).source
            import torch

            out["cuda_available"] = torch.cuda.is_available()
            if out["cuda_available"]:
                x = torch.empty(ALLOC, dtype=torch.uint8, device="cuda:0")
                x.fill_(7)
                torch.cuda.synchronize()
                out["allocated"] = int(torch.cuda.memory_allocated(0))
                out["computed"] = int(x[:1024].to(torch.int64).sum().item())
            os.write(from_child_w, (json.dumps(out) + "\\n").encode())
            os.read(to_child_r, 1)  # hold the memory until the parent has looked
            code = 0
        except BaseException as exc:
            os.write(from_child_w, (json.dumps({"error": repr(exc)}) + "\\n").encode())
        finally:
            os._exit(code)

    # -- the parent, while the child holds memory ------------------------------------------------
    os.close(to_child_r)
    os.close(from_child_w)
    stop.set()
    for t in pollers:
        t.join(10)
    with os.fdopen(from_child_r) as fh:
        child = json.loads(fh.readline())
    report["child"] = child
    if child.get("allocated"):
        deadline = time.monotonic() + 20
        while True:  # NVML lists a new context within moments; give it a little time
            snap = accelplat.snapshot([0])
            holders = {h.pid: h.state.value for h in snap.holders.get(0, ())}
            if pid in holders or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        report["holders_while_child_holds"] = {str(k): v for k, v in holders.items()}
        report["used_delta"] = snap.memory[0].used - baseline.memory[0].used
    report["torch_in_parent"] = "torch" in sys.modules
    report["parent_cuda_context"] = os.getpid() in {
        h.pid for h in accelplat.snapshot([0]).holders.get(0, ())
    }
    os.write(to_child_w, b"x")
    _, status = os.waitpid(pid, 0)
    report["child_exit"] = os.waitstatus_to_exitcode(status)

    # -- the child is gone: its memory comes back, and the parent saw none of it ----------------
    result = accelplat.wait_for_memory_to_clear(
        [0], threshold_bytes=baseline.memory[0].used + 256 * MIB, timeout_s=60
    )
    report["cleared_after_s"] = result.waited_s
    report["pid_listed_after"] = pid in {
        h.pid for h in accelplat.snapshot([0]).holders.get(0, ())
    }
    report["torch_in_parent_at_end"] = "torch" in sys.modules
    report["parent_pid"] = os.getpid()
    say(report)
    """
)


def _run_parent() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)  # device 0 for torch and for accelplat alike
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    done = run_python(PARENT, str(ALLOC_BYTES), env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def scenario() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the child cannot create a CUDA context")
    report = _run_parent()
    child = report["child"]
    assert "error" not in child, child["error"]
    if not child["cuda_available"]:
        pytest.skip("torch is installed but cannot use CUDA here")
    return report


def test_the_parent_never_imports_torch_nor_holds_a_cuda_context(
    scenario: dict[str, Any],
) -> None:
    assert scenario["platform"] == "cuda"
    assert scenario["torch_in_parent"] is False
    assert scenario["torch_in_parent_at_end"] is False
    assert scenario["parent_cuda_context"] is False
    assert scenario["parent_pid"] not in scenario["parent_holders_before"]


def test_the_forked_child_starts_afresh_and_its_cuda_works(scenario: dict[str, Any]) -> None:
    child = scenario["child"]
    assert child["nvml_initialized_at_start"] is False  # the parent's NVML session was dropped
    assert child["accelplat_in_child"].startswith("nvml")  # NVML answers in the child too
    assert child["allocated"] >= ALLOC_BYTES
    assert child["computed"] == 7 * 1024
    assert scenario["child_exit"] == 0


def test_the_parent_sees_the_childs_memory_and_names_it(scenario: dict[str, Any]) -> None:
    holders = scenario["holders_while_child_holds"]
    child_pids = [pid for pid, state in holders.items() if state == "child"]
    assert len(child_pids) == 1, holders
    assert str(scenario["parent_pid"]) not in holders
    assert scenario["used_delta"] >= ALLOC_BYTES


def test_the_childs_memory_comes_back_after_it_exits(scenario: dict[str, Any]) -> None:
    assert scenario["cleared_after_s"] < 60
    assert scenario["pid_listed_after"] is False
