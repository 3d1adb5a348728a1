"""Real GPUs under ``--accelplat-pack``: several tests on one GPU at once, each within budget.

Run on a host with an NVIDIA GPU and torch::

    PACK_GPU_LOG=/tmp/pack.jsonl \\
        python -m pytest -n 6 --accelplat-pack tests/gpu/test_pack_real.py

Each test declares 12 GiB, allocates 8 GiB with torch in its body (a new process: the worker
never imports torch), applies the share's memory fraction and holds the memory for 3 s. With
``PACK_GPU_LOG`` set, each appends its GPU and when it held the memory, so a driver can check
that tests shared a GPU at the same time; the terminal summary must name no test over budget.
Without ``--accelplat-pack`` the module skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

from tests.gpu import require_nvidia_gpu

GPUS = require_nvidia_gpu()
if importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch", allow_module_level=True)


@pytest.fixture(autouse=True)
def _needs_pack(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--accelplat-pack", default=False):
        pytest.skip("runs under --accelplat-pack (see the module docstring)")


@pytest.mark.parametrize("i", range(6))
@pytest.mark.accelplat_requires(device_memory="12GiB")
def test_a_test_holds_its_share(i: int) -> None:
    import torch

    fraction = os.environ["ACCELPLAT_LEASE_MEMORY_FRACTION"]
    assert int(os.environ["ACCELPLAT_LEASE_MEMORY_BYTES"]) == 12 * 2**30
    torch.cuda.set_per_process_memory_fraction(float(fraction))
    block = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    start = time.time()
    time.sleep(3.0)
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    if path := os.environ.get("PACK_GPU_LOG"):
        row = {"test": i, "uuid": uuid, "start": start, "end": time.time()}
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
    assert torch.cuda.device_count() == 1  # the body sees only its leased GPU
