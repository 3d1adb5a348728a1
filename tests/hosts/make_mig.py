"""Build the H200 MIG hosts where vLLM's GPU CI runs: ``python -m tests.hosts.make_mig``.

Two hosts, from NVML's documented MIG API and public logs (cited in each bundle's CONTENTS.txt),
through ``tools/nvml_mock.py`` as ``make_nvidia.py`` builds the others: the fake NVML is set up
with the facts, captured with accelplat's recorder, and the golden ``info.json`` is what
replaying the result prints. Run it again after a change to the CUDA backend, the capability
table or the capture format; ``--check`` only reports which bundles would change.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

from tests.hosts.make_nvidia import write_bundles
from tools.nvml_mock import MIB, build_bundle, profile_facts

H200 = "NVIDIA H200"
H200_TOTAL_MIB = 143771  # NVML's total on the captured H200 (nvidia-h200-x1.tar.gz)
_COMMON = (
    "From NVIDIA's documentation: an H200 is compute capability 9.0 with PCI device id 0x2335; "
    "a MIG device is named '<GPU name> MIG <profile>' and is queried through its own handle "
    "(nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetHandleByUUID; NVML API reference, "
    "MIG User Guide); a CUDA process sees at most one MIG device. Profile sizes from "
    "`nvidia-smi mig -lgip` on an H200 (NVIDIA/mig-parted#120): 1g.18gb, profile id 19, 7 "
    "instances, 16.00 GiB; 1g.35gb, profile id 15, 4 instances, 32.25 GiB. UUIDs and bus ids "
    "are made up (the logs do not print them). Beyond NVML the host is make_nvidia.py's built "
    "host: torch 2.9.1+cu128, nvidia-ml-py 13.580.82, no AMD or Intel stack."
)


@dataclass(frozen=True)
class Host:
    """One bundle: its file name, its nvml-mock profile, and where its facts came from."""

    bundle: str
    profile: dict[str, Any]
    provenance: str


def _gpu(uuid: str, bus: str, *, memory_mib: int = H200_TOTAL_MIB) -> dict[str, Any]:
    return {
        "name": H200,
        "uuid": uuid,
        "pci": {"bus_id": bus, "device_id": 0x233510DE},
        "compute_capability": {"major": 9, "minor": 0},
        "memory": {"total_bytes": memory_mib * MIB},
        "mig": {"mode_current": "enabled", "max_gpu_instances": 7},
    }


def _mig(slot: int, uuid: str, profile: str, mib: int, gi: int) -> dict[str, Any]:
    return {
        "gpu": 0,
        "slot": slot,
        "uuid": uuid,
        "name": f"{H200} MIG {profile}",
        "gpu_instance_id": gi,
        "compute_instance_id": 0,
        "memory": {"total_bytes": mib * MIB},
    }


def bare_metal() -> Host:
    """One H200 split into seven 1g.18gb MIG devices, seen from the host itself."""
    migs = [
        _mig(slot, f"MIG-{slot + 1:08x}-4a5e-5c1d-9f00-18a6b0c0ffee", "1g.18gb", 16384, 7 + slot)
        for slot in range(7)
    ]
    profile = {
        "version": "1.0",
        "system": {"driver_version": "580.159.04"},
        "devices": [
            {"index": 0, **_gpu("GPU-5a1ce018-0000-4d2a-8c3b-0000000000a0", "0000:18:00.0")}
        ],
        "x-accelplat": {"mig_devices": migs},
    }
    provenance = (
        "Built from vendor facts and public logs: a bare-metal H200 in seven 1g.18gb MIG "
        "devices, as each GPU of vLLM's `h200_18gb` CI machines is split (vllm-project/ci-infra"
        "#560: queue h200_18gb, spawn=56 for 8 GPUs x 7 MIG slices; #580/#581: the runbook, "
        "1g.18gb -> 56 agents; vllm#38956, vllm#43024, vllm#56695: the jobs moved there). "
        "GPU instance ids 7-13 and compute instance 0 for seven 1g instances, as the A100's "
        "(nvidia-a100-mig.tar.gz). Driver 580.159.04, the captured H200's. A scheduler hands "
        "each of seven workers one slice (CUDA_VISIBLE_DEVICES=MIG-<uuid>): accelplat's lease "
        "units. " + _COMMON
    )
    return Host("nvidia-h200-mig-7x1g18gb.tar.gz", profile, provenance)


def ci_container() -> Host:
    """A vLLM-CI-like container given one 1g.35gb slice: NVML refuses the parent GPU."""
    slice_ = _mig(0, "MIG-0c1f35a0-7e2b-5d4c-a1b2-35c0ffee0001", "1g.35gb", 33024, 3)
    profile = {
        "version": "1.0",
        "system": {"driver_version": "595.71.05"},
        "devices": [
            {"index": 0, **_gpu("GPU-5a1ce035-0000-4d2a-8c3b-0000000000b0", "0000:9a:00.0")}
        ],
        "x-accelplat": {"mig_devices": [slice_], "nvml": {"parent_queries": False}},
    }
    provenance = (
        "Built from vendor facts and public logs: a container of vLLM's `h200_35gb` CI queue, "
        "given one 1g.35gb MIG device of an H200 (vllm-project/ci-infra#580/#581: 1g.35gb -> "
        "32 agents per 8 GPUs, devices injected by CDI; vllm#56695 and vllm#56747: CI jobs on "
        "the 35gb slices, their memory read from the MIG handle). Inside, NVML lists the parent "
        "GPU and only this MIG device ('GPU 0: NVIDIA H200 / MIG 2g.35gb Device 0' in "
        "vllm#55381's collect_env, driver 595.71.05), and refuses the parent's own memory and "
        "process queries with NVML_ERROR_NO_PERMISSION (vllm#50463: 'Insufficient Permissions' "
        "on the parent H200, which made vLLM's large_gpu_mark read 0 bytes and skip; "
        "NVIDIA/nvidia-container-toolkit#842; vllm#39874). vllm#50463 calls the slice 32.5 "
        "GiB; NVML's total here is -lgip's 32.25 GiB. GPU instance 3 and compute instance 0 "
        "are assumed (not in the logs). The parent's total, never answered, is the captured "
        "H200's. " + _COMMON
    )
    return Host("nvidia-h200-mig-1g35gb-container.tar.gz", profile, provenance)


HOSTS = (bare_metal(), ci_container())


def build(host: Host) -> bytes:
    """Return the bundle's bytes (reproducible: no time, no temporary path inside)."""
    facts = profile_facts(host.profile, host.bundle)
    rebuild = "Rebuild: python -m tests.hosts.make_mig"
    return build_bundle(facts, provenance=f"{host.provenance}\n{rebuild}")


def main(argv: list[str]) -> int:
    """Write every bundle (``--check``: only report those that differ; exit 1 if any)."""
    return write_bundles(((h.bundle, functools.partial(build, h)) for h in HOSTS), argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
