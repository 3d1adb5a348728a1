"""The modelled hosts of the vocabulary proof, and accelplat's answers on each.

Each host is a set of vendor facts (platform, arch, compute capability, torch, libraries).
accelplat answers on a host by replaying its bundle from ``tests/hosts`` in a child interpreter
(``ACCELPLAT_REPLAY``), through the same code as a live host; the bundle is checked to be that
host (platform, arch, and a compute capability equal to vLLM's number).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_model import Host, capability

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "tests" / "hosts"

HOSTS = (
    Host("nvidia-sm75", "cuda", "Tesla T4", "sm_75", (7, 5), bundles=("nvidia-t4*",)),
    Host(
        "nvidia-sm80",
        "cuda",
        "A100",
        "sm_80",
        (8, 0),
        bundles=("nvidia-a100-x1*", "nvidia-a100-x8*"),
    ),
    Host("nvidia-sm89", "cuda", "L40S", "sm_89", (8, 9), bundles=("nvidia-l40s*", "nvidia-l4-*")),
    Host("nvidia-sm90", "cuda", "H200", "sm_90", (9, 0), bundles=("nvidia-h200-x1*",)),
    Host("nvidia-sm100", "cuda", "B200", "sm_100", (10, 0), bundles=("nvidia-b200*",)),
    Host(
        "amd-gfx90a",
        "rocm",
        "MI250X",
        "gfx90a",
        gcn_arch="gfx90a:sramecc+:xnack-",
        bundles=("amd-mi250*",),
    ),
    Host(
        "amd-gfx942",
        "rocm",
        "MI300X",
        "gfx942",
        gcn_arch="gfx942:sramecc+:xnack-",
        bundles=("amd-mi300x-x2*",),
    ),
    Host(
        "amd-gfx950",
        "rocm",
        "MI355X",
        "gfx950",
        gcn_arch="gfx950:sramecc+:xnack-",
        bundles=("amd-mi355*", "amd-mi350*"),
    ),
    Host(
        "amd-gfx1100",
        "rocm",
        "Radeon RX 7900 XTX",
        "gfx1100",
        gcn_arch="gfx1100",
        bundles=("amd-rx7900*",),
    ),
    Host("intel-max", "xpu", "Intel Data Center GPU Max 1550", "pvc", bundles=("intel-max*",)),
    Host("intel-bmg", "xpu", "Intel Arc B580", "bmg", bundles=("intel-arc-b580*",)),
    Host("cpu", "cpu", "x86_64 CPU", "x86-64-v4", bundles=("cpu-x86_64*",)),
)
# Host settings where vLLM's own platform is not the hardware's (vllm/platforms/__init__.py):
# its CPU-only CI jobs reuse an accelerator wheel on accelerator hosts with VLLM_TARGET_DEVICE=cpu
# (the comment in resolve_current_platform_cls_qualname; .buildkite/scripts/hardware_ci/
# run-amd-test.sh), and a GPU build of vLLM on a host without a GPU activates no platform.
_CPU_TARGET = (("VLLM_TARGET_DEVICE", "cpu"),)
SETTINGS = (
    Host("nvidia-sm90-cpu-target", "cuda", "H200", "sm_90", (9, 0), bundles=("nvidia-h200-x1*",),
         vllm_platform="cpu", vllm_version="0.34.0", env=_CPU_TARGET),
    Host("amd-gfx942-cpu-target", "rocm", "MI300X", "gfx942", gcn_arch="gfx942:sramecc+:xnack-",
         bundles=("amd-mi300x-x2*",), vllm_platform="cpu", vllm_version="0.34.0+rocm",
         env=_CPU_TARGET),
    Host("nvidia-sm80-cpu-build", "cuda", "A100", "sm_80", (8, 0), bundles=("nvidia-a100-x1*",),
         vllm_platform="cpu", vllm_version="0.34.0+cpu"),
    Host("cpu-gpu-build", "cpu", "x86_64 CPU", "x86-64-v4", bundles=("cpu-x86_64*",),
         vllm_platform="unspecified", vllm_version="0.34.0"),
)  # fmt: skip
ALL = HOSTS + SETTINGS


def bundle(host: Host, directory: Path = BUNDLES) -> Path | None:
    """The host's replay bundle in ``directory`` (``tests/hosts``), if one is there."""
    for pattern in host.bundles:
        found = sorted(directory.glob(pattern + ".tar.gz"))
        if found:
            return found[0]
    return None


_CHILD = """
import dataclasses, json, sys
import accelplat
from accelplat.replay import load_bundle, replaying
from accelplat._replay._bundle import Answer, RecordEntry
path, version, texts = json.load(sys.stdin)
bundle = load_bundle(path)
if version is not None:  # the host setting's vLLM, installed: what the build says it is
    vllm = RecordEntry("dist", ["version", "vllm"], (Answer(value=version),))
    bundle = dataclasses.replace(bundle, records=(*bundle.records, vllm))
replay = replaying(bundle)
replay.__enter__()  # for the whole child
platform = accelplat.current_platform()
devices = platform.devices()
first = devices[0] if devices else None
facts = {
    "platform": platform.name,
    "arch": first.arch if first else None,
    "capability": list(first.compute_capability) if first and first.compute_capability else None,
}
print(json.dumps({"facts": facts, "answers": {t: bool(accelplat.has(t)) for t in texts}}))
"""


def replayed_answers(
    path: Path, texts: list[str], host: Host | None = None
) -> tuple[dict[str, object], dict[str, bool]]:
    """The replayed host's platform, arch and capability, and accelplat's answers.

    A host setting's vLLM version is answered as installed and its variables are set.
    """
    env = {k: v for k, v in os.environ.items() if not k.endswith("VISIBLE_DEVICES")}
    env = {k: v for k, v in env.items() if not k.startswith(("ACCELPLAT_", "VLLM_"))}
    env.update(PYTHONPATH=str(REPO), **dict(host.env if host else ()))
    version = host.vllm_version if host else None
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], input=json.dumps([str(path), version, texts]),
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    return doc["facts"], doc["answers"]


def answers(host: Host, texts: list[str], directory: Path = BUNDLES) -> tuple[dict[str, bool], str]:
    """Accelplat's answers on ``host`` from its replayed bundle, and the bundle's name.

    Raises:
        FileNotFoundError: The host has no bundle in ``directory``.
        ValueError: The bundle is another host (platform, arch or capability differ).
    """
    path = bundle(host, directory)
    if path is None:
        raise FileNotFoundError(f"{host.name}: no bundle {host.bundles} in {directory}")
    facts, said = replayed_answers(path, texts, host)
    cc = capability(host, host.platform)  # vLLM's number: accelplat's DeviceInfo must say the same
    mine = {"platform": host.platform, "arch": host.arch, "capability": cc and list(cc)}
    if facts != mine:  # the wrong bundle, or a capability number that is not vLLM's
        raise ValueError(f"{path.name} replays {facts}, not {mine} ({host.name})")
    setting = " ".join(f"{k}={v}" for k, v in host.env)
    vllm = f", vllm {host.vllm_version} installed" if host.vllm_version else ""
    return said, f"replayed {path.name}{vllm}{' ' + setting if setting else ''}"
