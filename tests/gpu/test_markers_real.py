"""The pytest plugin's markers on a real NVIDIA GPU: what runs, what skips, and why.

Skips cleanly (module level) where NVML finds no GPU. Runs a small test file through pytest in a
subprocess, so the plugin sees the real CUDA platform exactly as a user's suite would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.gpu import require_nvidia_gpu

require_nvidia_gpu()

SUITE = textwrap.dedent(
    """
    import pytest

    @pytest.mark.accelplat_requires(platforms="cuda")
    def test_runs_on_cuda(accel_platform):
        assert accel_platform.name == "cuda"

    @pytest.mark.accelplat_requires(platforms=["rocm", "xpu"])
    def test_skips_off_rocm_and_xpu():
        raise AssertionError("must be skipped on CUDA")

    @pytest.mark.accelplat_requires("graphs")
    def test_graph_capable(accel_platform):
        assert accel_platform.graph.available

    @pytest.mark.accelplat_requires(device_memory="10000GiB")
    def test_needs_ten_thousand_gib():
        raise AssertionError("must be skipped: no GPU has 10,000 GiB")

    @pytest.mark.accelplat_requires(devices=64)
    def test_needs_64_devices():
        raise AssertionError("must be skipped")

    def test_settled(settled_device_memory):
        pass
    """
)


def test_markers_run_and_skip_with_reasons_on_the_real_gpu(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "accelplat.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-rs",
            "-q",
            str(tmp_path / "test_suite.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "3 passed, 3 skipped" in out, out
    assert "needs 10000.0 GiB device memory, cuda device 0 has" in out, out
    assert "64" in out, out
