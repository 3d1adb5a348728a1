"""Real GPUs: memory shares put several torch processes on one GPU, within their budgets.

Run on a host with an NVIDIA GPU and torch::

    python -m pytest tests/gpu/test_lease_shares_real.py

Three children lease ``memory="16GiB"`` each on the same GPU at once, apply the share's
``ACCELPLAT_LEASE_MEMORY_FRACTION``, allocate 12 GiB and hold it; the driver's per-process
figures must show each within its budget, and a child asking for more than its share is stopped
by torch's allocator. This process never imports torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu import require_nvidia_gpu

GPUS = require_nvidia_gpu()
if importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys, time
import torch
torch.cuda.set_per_process_memory_fraction(float(os.environ["ACCELPLAT_LEASE_MEMORY_FRACTION"]))
want = int(sys.argv[1])
try:
    x = torch.empty(want * 2**30, dtype=torch.uint8, device="cuda"); x.fill_(1)
    torch.cuda.synchronize()
    oom = False
except torch.OutOfMemoryError:
    oom = True
import accelplat
holders = accelplat.current_platform().memory_holders(0) or []
mine = sum(h.used_bytes or 0 for h in holders if h.pid == os.getpid())
uuid = os.environ["CUDA_VISIBLE_DEVICES"]
print(json.dumps({"oom": oom, "held": mine, "uuid": uuid, "at": time.time()}), flush=True)
time.sleep(float(sys.argv[2]))
"""


def _leased(memory: str, want_gib: int, hold_s: float, lock_dir: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "accelplat", "lease", "-q", "--memory", memory]
    argv += ["--lock-dir", str(lock_dir), "--", sys.executable, "-c", CHILD]
    return subprocess.Popen(
        [*argv, str(want_gib), str(hold_s)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_three_shares_run_on_one_gpu_within_their_budgets(tmp_path: Path) -> None:
    children = [_leased("16GiB", 12, 3.0, tmp_path) for _ in range(3)]
    rows = []
    for child in children:
        out, _ = child.communicate(timeout=600)
        assert child.returncode == 0
        rows.append(json.loads(out.strip().splitlines()[-1]))
    assert not any(r["oom"] for r in rows)
    assert len({r["uuid"] for r in rows}) <= GPUS
    for row in rows:
        if row["held"]:  # the driver's per-process figure, where this namespace sees it
            assert 12 * 2**30 <= row["held"] <= 16 * 2**30
    # all three held their memory at once (each holds it 3 s after saying so), not one by one
    assert max(r["at"] for r in rows) < min(r["at"] for r in rows) + 3.0


def test_a_process_asking_for_more_than_its_share_is_stopped_by_the_fraction(
    tmp_path: Path,
) -> None:
    child = _leased("8GiB", 12, 0.0, tmp_path)
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 0
    assert json.loads(out.strip().splitlines()[-1])["oom"] is True
