"""Real GPUs under ``--accelplat-lease``: torch, in a child, runs on the GPU this worker leased.

Run on a host with two or more NVIDIA GPUs::

    LEASE_GPU_LOG=/tmp/lease.jsonl \\
        python -m pytest -n 2 --accelplat-lease tests/gpu/test_lease_real.py

Each test starts torch in a child process (this process never imports it), asks which physical
GPU ``cuda:0`` is (its UUID), and checks that it is the one the lease put in
``CUDA_VISIBLE_DEVICES``. With ``LEASE_GPU_LOG`` set, each test appends the worker, the UUID and
its start and end times there, so a driver can check that the workers ran at the same time on
different GPUs. Without ``--accelplat-lease`` the module skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.gpu import require_nvidia_gpu

GPUS = require_nvidia_gpu()

CHILD = (
    "import json, torch\n"
    "n = torch.cuda.device_count()\n"
    "x = torch.ones(256 * 1024**2, dtype=torch.uint8, device='cuda:0'); torch.cuda.synchronize()\n"
    "print(json.dumps(['GPU-' + str(torch.cuda.get_device_properties(i).uuid) "
    "for i in range(n)]))\n"
)


@pytest.fixture(autouse=True)
def _needs_lease(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--accelplat-lease", default=False):
        pytest.skip("runs under --accelplat-lease (see the module docstring)")


def torch_uuids() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, check=True
    )
    uuids: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return uuids


def log(name: str, uuids: list[str], start: float) -> None:
    path = os.environ.get("LEASE_GPU_LOG")
    if not path:
        return
    row = {
        "test": name,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "uuids": uuids,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "start": start,
        "end": time.time(),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("i", range(4))
def test_single_gpu_test_runs_on_the_leased_gpu(i: int) -> None:
    start = time.time()
    leased = os.environ["CUDA_VISIBLE_DEVICES"]
    uuids = torch_uuids()
    time.sleep(1.0)  # long enough for the other worker's test to overlap
    log(f"single{i}", uuids, start)
    assert uuids == [leased]


@pytest.mark.accelplat_requires(devices=2)
def test_two_gpu_test_gets_both_gpus_for_its_duration() -> None:
    start = time.time()
    leased = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    uuids = torch_uuids()
    log("two", uuids, start)
    assert len(leased) == 2
    assert uuids == leased
