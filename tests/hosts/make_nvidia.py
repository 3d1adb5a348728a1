"""Build every NVIDIA host bundle that is not a capture: ``python -m tests.hosts.make_nvidia``.

Each host is shaped from a public source kept in ``tests/hosts/nvml-mock/`` (NVIDIA's nvml-mock
profiles and two real ``nvidia-smi -q -x`` captures from NVIDIA/k8s-test-infra, Apache-2.0) or
from a public dump quoted below, through ``tools/nvml_mock.py``: the fake NVML is set up with
the source's facts, captured with ``accelplat capture``'s recorder, and the golden ``info.json``
is what replaying the result prints. Run it again after a change to the CUDA backend, the
capability table or the capture format; ``--check`` only reports which bundles would change.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.nvml_mock import (
    MIB,
    build_bundle,
    parse_smi_xml,
    parse_yaml,
    profile_facts,
    read_document,
    smi_profile,
)

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "nvml-mock"
REPOSITORY = "NVIDIA/k8s-test-infra"
_CONFIGS = "pkg/gpu/mocknvml/configs"
_CAPTURES = "tests/e2e/go/assertions/nvidiasmi/testdata/hardware"
_BUILT = (
    "Beyond NVML every built host answers alike: torch 2.9.1+cu128, nvidia-ml-py 13.580.82, no "
    "AMD or Intel stack (no /sys/class/drm, no amdsmi, no Level Zero loader), Python 3.12.0 on "
    "Linux, no visible-devices variable."
)


@dataclass(frozen=True)
class Source:
    """One bundle: its file name, what it is shaped from, and how that source is cited."""

    bundle: str
    kind: str  # "profile", "smi" or "dump"
    file: str  # under tests/hosts/nvml-mock/ ("" for a dump quoted here)
    origin: str  # repository path, or the public thread
    commit: str
    date: str
    note: str = ""


HOSTS = (
    Source(
        "nvidia-t4-x4.tar.gz",
        "profile",
        "mock-nvml-config-t4.yaml",
        f"{_CONFIGS}/mock-nvml-config-t4.yaml",
        "204019fb69e4d49285625a6829ff0e5b143bba3b",
        "2026-08-01",
    ),
    Source(
        "nvidia-a100-x8.tar.gz",
        "profile",
        "mock-nvml-config-a100.yaml",
        f"{_CONFIGS}/mock-nvml-config-a100.yaml",
        "204019fb69e4d49285625a6829ff0e5b143bba3b",
        "2026-08-01",
    ),
    Source(
        "nvidia-l40s-x8.tar.gz",
        "profile",
        "mock-nvml-config-l40s.yaml",
        f"{_CONFIGS}/mock-nvml-config-l40s.yaml",
        "204019fb69e4d49285625a6829ff0e5b143bba3b",
        "2026-08-01",
    ),
    Source(
        "nvidia-h100-x8.tar.gz",
        "profile",
        "mock-nvml-config-h100.yaml",
        f"{_CONFIGS}/mock-nvml-config-h100.yaml",
        "b89d7e87de9e89626d9fefbffc6dc411c0891a04",
        "2026-08-21",
    ),
    Source(
        "nvidia-b200-x8.tar.gz",
        "profile",
        "mock-nvml-config-b200.yaml",
        f"{_CONFIGS}/mock-nvml-config-b200.yaml",
        "204019fb69e4d49285625a6829ff0e5b143bba3b",
        "2026-08-01",
    ),
    Source(
        "nvidia-gb200-x8.tar.gz",
        "profile",
        "mock-nvml-config-gb200.yaml",
        f"{_CONFIGS}/mock-nvml-config-gb200.yaml",
        "b89d7e87de9e89626d9fefbffc6dc411c0891a04",
        "2026-08-21",
        "A Grace Blackwell superchip: the host CPU is Arm (aarch64).",
    ),
    Source(
        "nvidia-gb300-x8.tar.gz",
        "profile",
        "mock-nvml-config-gb300.yaml",
        f"{_CONFIGS}/mock-nvml-config-gb300.yaml",
        "b89d7e87de9e89626d9fefbffc6dc411c0891a04",
        "2026-08-21",
        "The profile gives compute capability 10.0; NVIDIA lists the GB300 as 10.3 (sm_103), "
        "as nvidia-gb300-x4-smi.tar.gz has it. Kept as the profile says: the bundle is the "
        "profile's host. The host CPU is Arm (aarch64).",
    ),
    Source(
        "nvidia-a100-x1-smi.tar.gz",
        "smi",
        "qx-a100.xml",
        f"{_CAPTURES}/qx-a100.xml",
        "5f8956ad20dc5f5bf80f8a58c530c0039bf7727b",
        "2026-08-21",
        "A real `nvidia-smi -q -x` of one A100-SXM4-40GB (a rented single-GPU VM, driver "
        "570.148.08; identifiers scrubbed by the source). nvidia-smi prints memory in MiB: "
        "bytes are MiB x 1 MiB and free is total less reserved and used. Compute capability "
        "8.0 from NVIDIA's CUDA GPU table (the XML has none).",
    ),
    Source(
        "nvidia-gb300-x4-smi.tar.gz",
        "smi",
        "qx-gb300.xml",
        f"{_CAPTURES}/qx-gb300.xml",
        "5f8956ad20dc5f5bf80f8a58c530c0039bf7727b",
        "2026-08-21",
        "A real `nvidia-smi -q -x` of a 4-GPU GB300 node (driver 580.173.02; identifiers "
        "scrubbed by the source). Memory as for the A100 capture; compute capability 10.3 "
        "from NVIDIA's CUDA GPU table; the host CPU is Arm (aarch64, Grace).",
    ),
    Source(
        "nvidia-a100-mig.tar.gz",
        "dump",
        "",
        "https://github.com/DataDog/datadog-agent/pull/33120",
        "",
        "2025-01-20",
        "An A100-SXM4-80GB split into seven MIG 1g.10gb devices. From the public dump "
        "(`nvidia-smi -L` and `nvidia-smi` in the pull request's description): the GPU's name, "
        "UUID and bus id, the driver 535.216.01, the total 81920 MiB, and each MIG device's "
        "UUID and profile. From NVIDIA's documentation: compute capability 8.0, the PCI device "
        "id 0x20B2 (A100 SXM4 80GB), MIG device names '<GPU name> MIG <profile>', GPU instance "
        "ids 7-13 and compute instance 0 for seven 1g instances (MIG User Guide), 9.5 GiB "
        "(9728 MiB) per 1g.10gb device (`nvidia-smi mig -lgip` on an A100 80GB; the 2g.20gb's "
        "19968 MiB in XuehaiPan/nvitop#8 is twice that plus 512 MiB of the second slice). "
        "Not in the dump: reserved and used memory (0 here), the PCI subsystem id (0).",
    ),
)

_MIG_UUIDS = (
    "MIG-feb88891-0321-5fef-9c87-d4af3b54259e",
    "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973",
    "MIG-50f1c4c9-1508-5e8d-bb06-d08145b22e01",
    "MIG-36c795f2-5cf7-55d6-af30-e535e79b7bb6",
    "MIG-3f45d38c-8cee-503e-b806-a1f1bdceedeb",
    "MIG-96655de9-9525-58f9-a62b-0e4c1cc1c265",
    "MIG-1aae4990-b962-574e-8375-119d6d9b9687",
)


def mig_profile() -> dict[str, Any]:
    """The A100-SXM4-80GB with seven MIG 1g.10gb devices, as an nvml-mock profile document."""
    name = "NVIDIA A100-SXM4-80GB"
    return {
        "version": "1.0",
        "system": {"driver_version": "535.216.01"},
        "devices": [
            {
                "index": 0,
                "name": name,
                "uuid": "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16",
                "pci": {"bus_id": "0000:00:05.0", "device_id": 0x20B210DE},
                "compute_capability": {"major": 8, "minor": 0},
                "memory": {"total_bytes": 81920 * MIB},
                "mig": {"mode_current": "enabled", "max_gpu_instances": 7},
            }
        ],
        "x-accelplat": {
            "mig_devices": [
                {
                    "gpu": 0,
                    "slot": slot,
                    "uuid": uuid,
                    "name": f"{name} MIG 1g.10gb",
                    "gpu_instance_id": 7 + slot,
                    "compute_instance_id": 0,
                    "memory": {"total_bytes": 9728 * MIB},
                }
                for slot, uuid in enumerate(_MIG_UUIDS)
            ]
        },
    }


def provenance(source: Source) -> str:
    """The head of the bundle's CONTENTS.txt: where each fact came from."""
    if source.kind == "dump":
        head = f"Shaped from a public dump: {source.origin} ({source.date})."
    else:
        what = "NVIDIA nvml-mock profile" if source.kind == "profile" else "nvidia-smi -q -x"
        label = "shaped from" if source.kind == "profile" else "shaped from a public dump:"
        head = (
            f"Built host, {label} {what} {source.file} (repository {REPOSITORY}, "
            f"path {source.origin}, commit {source.commit}, {source.date}; Apache-2.0, copy in "
            "tests/hosts/nvml-mock/)."
        )
    lines = [
        head,
        "NVML facts (GPU names, UUIDs, PCI ids, compute capability, memory, MIG) come from it; "
        "the fake NVML answered them and accelplat's recorder captured the answers.",
        *([source.note] if source.note else []),
        _BUILT,
        "Rebuild: python -m tests.hosts.make_nvidia",
    ]
    return "\n".join(lines)


def facts_of(source: Source) -> Any:
    """The host facts of ``source``, read and checked as any user's input is."""
    if source.kind == "dump":
        return profile_facts(mig_profile(), source.origin)
    path = SOURCES / source.file
    if source.kind == "profile":
        return profile_facts(parse_yaml(read_document(path, 4 * MIB), source.file), source.file)
    doc = smi_profile(parse_smi_xml(read_document(path, 16 * MIB), source.file), source.file)
    return profile_facts(doc, source.file)


def build(source: Source) -> bytes:
    """Return the bundle's bytes (reproducible: no time, no temporary path inside)."""
    return build_bundle(facts_of(source), provenance=provenance(source))


def write_bundles(bundles: Iterable[tuple[str, Callable[[], bytes]]], argv: list[str]) -> int:
    """Write each ``(file name, build)`` bundle beside this script that differs from its build.

    ``--check`` in ``argv``: only report those that differ, and return 1 if any.
    """
    check = "--check" in argv
    stale = []
    for name, make in bundles:
        out = HERE / name
        data = make()
        if out.exists() and out.read_bytes() == data:
            continue
        stale.append(name)
        if not check:
            out.write_bytes(data)
            print(f"wrote {out.name} ({len(data)} bytes)")
    if check and stale:
        print("would change: " + ", ".join(stale))
    return 1 if check and stale else 0


def main(argv: list[str]) -> int:
    """Write every bundle (``--check``: only report those that differ; exit 1 if any)."""
    return write_bundles(((s.bundle, functools.partial(build, s)) for s in HOSTS), argv)


if __name__ == "__main__":
    try:
        import yaml  # noqa: F401 - NVIDIA's profiles are YAML
    except ModuleNotFoundError:
        sys.exit("reading NVIDIA's nvml-mock profiles needs PyYAML: pip install pyyaml")
    raise SystemExit(main(sys.argv[1:]))
