"""Package-level promises: lazy import, public names resolvable, no torch, typed."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accelplat


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_import_loads_no_backend_vendor_library_or_torch() -> None:
    proc = _run(
        "import sys, accelplat\n"
        "bad = [m for m in ('torch', 'pynvml', 'amdsmi', 'accelplat.backends.cuda',"
        " 'accelplat.registry', 'accelplat.memory') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_detect_and_query_never_import_torch() -> None:
    proc = _run(
        "import sys, accelplat\n"
        "p = accelplat.current_platform()\n"
        "p.memory_info(0)\n"
        "accelplat.snapshot()\n"
        "accelplat.record_usage_stats()\n"
        "print('torch' in sys.modules)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_every_public_name_resolves() -> None:
    for name in accelplat.__all__:
        assert getattr(accelplat, name) is not None, name
    assert sorted(accelplat.__all__) == sorted(set(accelplat.__all__))


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        accelplat.no_such_name


def test_package_is_typed() -> None:
    spec = importlib.util.find_spec("accelplat")
    assert spec is not None
    assert spec.origin is not None
    assert (Path(spec.origin).parent / "py.typed").is_file()
