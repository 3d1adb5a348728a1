"""A fake ``nvidia-cuda-mps-control``, NVIDIA's MPS control program, for ``PATH`` in a test.

From NVIDIA's MPS documentation: ``-d`` starts the control daemon, which writes
``nvidia-cuda-mps-control.pid`` into ``CUDA_MPS_PIPE_DIRECTORY`` (``/tmp/nvidia-mps`` when unset);
without ``-d`` the program reads commands on stdin (``get_server_list``, ``quit``), and fails when
no daemon runs for that pipe directory. Every call is appended to ``$MPS_FAKE_LOG`` as
``<command or option> <pipe directory>``.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = """#!PYTHON
import os, sys, pathlib
pipe = pathlib.Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
said = " ".join(sys.argv[1:]) or sys.stdin.read().strip()
with open(os.environ["MPS_FAKE_LOG"], "a") as fh:
    fh.write(f"{said} {pipe}\\n")
pid = pipe / "nvidia-cuda-mps-control.pid"
if said == "-d":
    pid.write_text(str(os.getpid()))
elif not pid.exists():
    sys.exit("Cannot find MPS control daemon process")
elif said == "quit":
    pid.unlink()
"""


def install_mps_control(bin_dir: Path, script: str = SCRIPT) -> Path:
    """Write the fake (or ``script``) as ``bin_dir/nvidia-cuda-mps-control``; return its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(script.replace("#!PYTHON", f"#!{sys.executable}", 1))
    control.chmod(0o755)
    return control
