"""A short GPU session that loads and frees device memory, to show the timeline report.

Run on a machine with a CUDA (or ROCm) GPU and torch installed::

    pytest benchmarks/timeline_demo -p no:cacheprovider \\
        --accelplat-timeline=timeline.html --accelplat-timeline-json=timeline.json

(add ``-p accelplat.pytest_plugin`` when accelplat is not installed, so its entry point is not
registered: the demo uses the plugin's
``settled_device_memory`` fixture). Open ``timeline.html``: it shows the CUDA context of the
first test, a ramp to 24 GiB and back, a child process whose memory comes back only after it
exits, a settle wait, and one planted leak of 4 GiB that a later test frees. Without a GPU every
test skips.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA/ROCm device visible to torch", allow_module_level=True)

GIB = 1024**3
_kept: list[object] = []  # the planted leak lives here between tests


def _alloc(gib: float) -> object:
    return torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")


def _pause(seconds: float = 0.4) -> None:
    torch.cuda.synchronize()
    time.sleep(seconds)  # let the sampler see each step


@pytest.fixture
def free_cache() -> Iterator[None]:
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_cuda_context() -> None:
    """Creating the CUDA context holds ~0.5 GiB for the rest of the process: a 'leak' by design."""
    torch.zeros(1, device="cuda")
    _pause()


def test_ramp_up_and_free(free_cache: None) -> None:
    blocks = []
    for _ in range(6):
        blocks.append(_alloc(4))
        _pause(0.3)
    del blocks
    _pause()


def test_child_process_frees_on_exit() -> None:
    code = (
        "import time, torch; x = torch.empty(16 * 1024**3, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); time.sleep(1.5)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_after_child(settled_device_memory: object, free_cache: None) -> None:
    x = _alloc(8)
    _pause()
    del x


def test_planted_leak() -> None:
    _kept.append(_alloc(4))  # never freed by this test: the report must flag it
    _pause()


@pytest.mark.parametrize("gib", [2, 6, 10])
def test_short_bursts(gib: int, free_cache: None) -> None:
    x = _alloc(gib)
    _pause(0.2)
    del x


def test_cleanup_of_the_leak(free_cache: None) -> None:
    _kept.clear()
    _pause()
