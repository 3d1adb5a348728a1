"""Fresh Python interpreters on the checkout: the one helper tests use to run a child script."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_python(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    flags: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``python [flags] -c code args…`` in the checkout; its output is captured as text.

    The exit status is the caller's to check (``check=False``).
    """
    return subprocess.run(
        [sys.executable, *flags, "-c", code, *args],
        cwd=REPO,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
