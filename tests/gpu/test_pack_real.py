"""Real GPUs under ``--accelplat-pack``: several tests on one GPU at once, each held to its budget.

Run on a host with an NVIDIA GPU and torch (``-p accelplat.pytest_plugin`` where accelplat is
not installed), with MPS started for the run where the host has it::

    PACK_GPU_LOG=/tmp/pack.jsonl ACCELPLAT_ENFORCE=mps python -m pytest \\
        -p accelplat.pytest_plugin -n 6 --accelplat-pack tests/gpu/test_pack_real.py

Each share test declares 12 GiB and allocates 8 GiB with torch in its body (a new process: the
worker never imports torch), holding it for 3 s. With ``PACK_GPU_LOG`` set, each appends its GPU
and when it held the memory, so a driver can check that tests shared a GPU at the same time; the
terminal summary must name no test over budget. Where the session enforces budgets (MPS, or
torch's fraction: the header says which), a test that declares 4 GiB and asks for 8 GiB must run
out of memory itself. Without ``--accelplat-pack`` the module skips.
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

    assert int(os.environ["ACCELPLAT_LEASE_MEMORY_BYTES"]) == 12 * 2**30
    block = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    start = time.time()
    time.sleep(3.0)
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    if path := os.environ.get("PACK_GPU_LOG"):
        row = {"test": i, "uuid": uuid, "start": start, "end": time.time(),
               "enforce": os.environ.get("ACCELPLAT_ENFORCE")}  # fmt: skip
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
    assert torch.cuda.device_count() == 1  # the body sees only its leased GPU


@pytest.mark.accelplat_requires(device_memory="4GiB")
def test_a_test_over_its_enforced_budget_runs_out_of_memory_itself() -> None:
    import torch

    if os.environ.get("ACCELPLAT_ENFORCE", "none") == "none":
        pytest.skip("this session's budgets are promises (the header says why)")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda").fill_(1)
