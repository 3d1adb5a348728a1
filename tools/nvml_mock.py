"""NVIDIA nvml-mock GPU profiles and ``nvidia-smi -q -x`` XML to accelplat bundles, and back.

NVIDIA's nvml-mock (repository NVIDIA/k8s-test-infra, ``pkg/gpu/mocknvml``) is a mock
``libnvidia-ml.so`` driven by a YAML profile (``system``, ``device_defaults``, ``devices``: each
device's settings are the defaults overlaid with its own entry). This tool

* **imports** a profile as an accelplat capture bundle: the fake NVML of ``tests/fakes/nvml.py``
  is set up with the profile's facts and ``accelplat capture``'s own recorder captures it, so the
  bundle holds exactly the questions accelplat's CUDA backend asks; the golden ``info.json`` is
  what replaying the result prints;
* **imports** ``nvidia-smi -q -x`` XML the same way, through a profile made from it;
* **exports** an accelplat CUDA bundle as a profile that nvml-mock loads. What its schema has no
  place for (MIG devices, the NVML API generation, the host beyond NVML: environment, files,
  versions) goes under the top-level key ``x-accelplat``, which nvml-mock ignores; importing the
  exported profile rebuilds a bundle whose ``accelplat info --json`` equals the original's.

Profiles and XML are untrusted input: read through ``accelplat._files`` with a size limit, every
field checked (a problem is a :class:`ProfileError` naming the field), YAML without aliases, XML
without entity declarations or an internal DTD subset. Reading YAML needs PyYAML.

Usage (from the repository root)::

    python -m tools.nvml_mock import PROFILE.yaml --out host.tar.gz [--source TEXT]
    python -m tools.nvml_mock import-smi QX.xml --out host.tar.gz [--source TEXT]
    python -m tools.nvml_mock export host.tar.gz --out profile.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from accelplat import _files
from accelplat._capture import bundle_contents, capture
from accelplat._cli._args import output_option
from accelplat._describe import collect_info
from accelplat._files import write_text_atomic
from accelplat._replay._bundle import Bundle, bundle_bytes, load_bundle, parse_bundle
from accelplat._replay._codec import Handle, Record, encode, key_text
from accelplat._replay._install import considered
from accelplat.errors import FileTooLargeError, NotARegularFileError
from accelplat.replay import replaying

MIB = 1024**2
PROFILE_LIMIT = 4 * MIB  # nvml-mock's largest shipped profile is about 17 KB
XML_LIMIT = 16 * MIB  # an 8-GPU ``nvidia-smi -q -x`` is about 360 KB
MAX_GPUS = 64
MAX_MIG = 7  # NVIDIA MIG User Guide: at most seven GPU instances per GPU
EXTENSION = "x-accelplat"
EXTENSION_FORMAT = 1
_U32, _U64 = 2**32 - 1, 2**64 - 1
_NVML_NAME_LIMIT = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
_ROOT_VARIABLES = (
    "ACCELPLAT_SYSFS_ROOT",
    "ACCELPLAT_DEV_ROOT",
    "ACCELPLAT_PROC_ROOT",
    "ACCELPLAT_CGROUP_ROOT",
)
_CLEARED = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "ACCELPLAT_PLATFORM",
    "ACCELPLAT_LEVEL_ZERO_LIB",
)
_BLOCKED = ("pynvml", "amdsmi", "torch")

# What a host built from a profile answers beyond NVML: no AMD or Intel stack, a CUDA torch.
BUILT_CREATED = "2026-01-01T00:00:00+00:00"
BUILT_TORCH = "2.9.1+cu128"
BUILT_NVIDIA_ML_PY = "13.580.82"
BUILT_PYTHON = "3.12.0"
_NO_AMDSMI = {"present": False, "reason": "amdsmi is not installed", "vendor_error": ""}
_NO_LEVEL_ZERO = {
    "present": False,
    "reason": "libze_loader.so.1: cannot open shared object file: No such file or directory",
    "vendor_error": "OSError",
}

_UUID_RE = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_MIG_UUID_RE = re.compile(
    r"^MIG-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_BUS_RE = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")
_MIB_RE = re.compile(r"^\s*(\d{1,12})\s*MiB\s*$")
_DOCTYPE_RE = re.compile(
    r"<!DOCTYPE\s+[A-Za-z_][\w.-]*(\s+(SYSTEM|PUBLIC)(\s+\"[^\"<>\[\]]*\"){1,2})?\s*>"
)


class ProfileError(ValueError):
    """A profile, XML document or bundle this tool cannot use; names the source and the field."""

    def __init__(self, source: str, where: str, why: str) -> None:
        super().__init__(f"{source}: {where}: {why}" if where else f"{source}: {why}")
        self.source, self.where, self.why = source, where, why


# -- the facts a bundle is built from -----------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """NVML v2 memory figures in bytes: ``free = total - reserved - used``."""

    total: int
    reserved: int = 0
    used: int = 0

    @property
    def free(self) -> int:
        """What NVML reports free: neither reserved by the driver nor used."""
        return self.total - self.reserved - self.used


@dataclass(frozen=True)
class Process:
    """A process NVML lists on a device (``used=None``: NVML does not know its memory)."""

    pid: int
    used: int | None = None
    name: str = ""


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (compute instance) of a GPU, at ``slot`` of its parent."""

    slot: int
    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    memory: Memory
    processes: tuple[Process, ...] = ()


@dataclass(frozen=True)
class Mig:
    """A MIG-capable GPU's mode (current, pending), slot count and MIG devices."""

    current: bool = False
    pending: bool = False
    max_devices: int = MAX_MIG
    devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML describes it (``bus_id`` in the sysfs spelling)."""

    name: str
    uuid: str
    bus_id: str
    memory: Memory
    compute_capability: tuple[int, int] | None = None
    device_id: int = 0
    subsystem_id: int = 0
    mig: Mig | None = None  # None: not MIG-capable (NVML answers NotSupported)
    processes: tuple[Process, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    """Everything a bundle is built from: the driver, the GPUs, and the host beyond NVML."""

    driver_version: str
    gpus: tuple[Gpu, ...]
    memory_v2: bool = True  # False: a driver before R510 (nvmlDeviceGetMemoryInfo_v2 missing)
    processes_v3: bool = True  # False: only nvmlDeviceGetComputeRunningProcesses_v2 answers
    # False: NVML refuses a MIG-enabled GPU's own memory and process queries (NoPermission), as
    # inside a container given one of its MIG devices (NVIDIA/nvidia-container-toolkit#842)
    parent_queries: bool = True
    machine: str = "x86_64"
    captured: Mapping[str, Any] | None = None  # a captured host's non-NVML part (an export's)
    notes: tuple[str, ...] = field(default=())  # where the facts came from, for CONTENTS.txt


# -- reading untrusted documents ----------------------------------------------------------------


def read_document(path: str | os.PathLike[str], limit: int) -> str:
    """Return the UTF-8 text of the regular file at ``path`` (at most ``limit`` bytes).

    Raises:
        ProfileError: Not a regular file, unreadable, over the limit, or not UTF-8.
    """
    source = os.fspath(path)
    try:
        data = _files.read_live(source, limit=limit)
    except FileTooLargeError:
        raise ProfileError(source, "", f"over the limit of {limit} bytes") from None
    except NotARegularFileError:
        raise ProfileError(source, "", "not a regular file") from None
    except OSError as exc:
        raise ProfileError(source, "", f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(source, "", "not UTF-8 text") from None


def parse_yaml(text: str, source: str = "<profile>") -> dict[str, Any]:
    """Return the mapping a YAML profile holds; anchors, aliases and tags are refused.

    Raises:
        ProfileError: Not YAML, not a mapping, nested too deeply, or using an alias.
        ModuleNotFoundError: PyYAML is not installed.
    """
    import yaml

    class _Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = f"line {event.start_mark.line + 1}" if event.start_mark else "?"
                raise ProfileError(source, mark, "YAML anchors and aliases are not accepted")
            tag = getattr(event, "tag", None)
            if tag and not tag.startswith("tag:yaml.org,2002:") and tag != "!":
                raise ProfileError(source, "", f"the YAML tag {tag[:40]!r} is not accepted")
            return super().compose_node(parent, index)

    if len(text) > PROFILE_LIMIT:
        raise ProfileError(source, "", f"over the limit of {PROFILE_LIMIT} characters")
    try:
        doc = yaml.load(text, Loader=_Loader)  # a SafeLoader without aliases
    except yaml.YAMLError as exc:
        raise ProfileError(source, "", f"not valid YAML: {str(exc)[:300]}") from None
    except RecursionError:
        raise ProfileError(source, "", "nested too deeply") from None
    if not isinstance(doc, dict):
        raise ProfileError(source, "", "a profile must be a YAML mapping")
    return doc


def parse_smi_xml(text: str, source: str = "<nvidia-smi>") -> ET.Element:
    """Return the root of ``nvidia-smi -q -x`` output; entity declarations are refused.

    Raises:
        ProfileError: Not XML, an ``<!ENTITY>`` or internal DTD subset, or another root.
    """
    if len(text) > XML_LIMIT:
        raise ProfileError(source, "", f"over the limit of {XML_LIMIT} characters")
    # nvidia-smi writes `<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">`, which expat
    # does not fetch. An internal subset or an entity declaration is never nvidia-smi's: refused
    # before parsing, so no entity is expanded (no "billion laughs", no external file).
    if "<!ENTITY" in text:
        raise ProfileError(source, "DOCTYPE", "entity declarations are not accepted")
    for match in re.finditer(r"<!DOCTYPE", text):
        if not _DOCTYPE_RE.match(text, match.start()):
            raise ProfileError(source, "DOCTYPE", "only an external DTD reference is accepted")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ProfileError(source, "", f"not valid XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ProfileError(source, root.tag[:40], "the root must be <nvidia_smi_log>")
    return root


# -- checked fields -----------------------------------------------------------------------------


class _Fields:
    """Typed field checks; a failure is a ProfileError naming the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, why: str) -> ProfileError:
        return ProfileError(self.source, where, why)

    def mapping(self, value: object, where: str, *, optional: bool = False) -> dict[str, Any]:
        if value is None and optional:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.fail(where, f"must be a mapping, not {_shown(value)}")
        return value

    def array(self, value: object, where: str, limit: int) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list, not {_shown(value)}")
        if len(value) > limit:
            raise self.fail(where, f"has {len(value)} entries, more than {limit}")
        return value

    def integer(self, value: object, where: str, lo: int = 0, hi: int = _U64) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(where, f"must be an integer from {lo} to {hi}, not {_shown(value)}")
        return value

    def text(self, value: object, where: str, limit: int = 256) -> str:
        if not isinstance(value, str) or not value or len(value) > limit:
            raise self.fail(where, f"must be text of 1-{limit} characters, not {_shown(value)}")
        if not value.isprintable():
            raise self.fail(where, "must be printable text")
        return value

    def matching(self, value: object, where: str, pattern: re.Pattern[str], what: str) -> str:
        text = self.text(value, where)
        if not pattern.match(text):
            raise self.fail(where, f"must be {what}, not {_shown(text)}")
        return text

    def choice(self, value: object, where: str, choices: Sequence[str]) -> str:
        if value not in choices:
            raise self.fail(where, f"must be one of {', '.join(choices)}, not {_shown(value)}")
        assert isinstance(value, str)
        return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``, mappings merged key by key, as nvml-mock overlays devices."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = (
            _merged(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
        )
    return out


def sysfs_bus_id(text: str) -> str:
    """``"0000:07:00.0"``, ``"00000000:07:00.0"`` or ``"07:00.0"`` → ``"0000:07:00.0"``."""
    match = _BUS_RE.match(text.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {text!r:.40}")
    domain, bus, dev, fn = match.groups()
    return f"{int(domain or '0', 16):04X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{fn}"


def nvml_bus_id(text: str) -> str:
    """The NVML ``busId`` spelling (``"%08X:%02X:%02X.%X"``) of a sysfs bus id."""
    domain, rest = sysfs_bus_id(text).split(":", 1)
    return f"{int(domain, 16):08X}:{rest}"


# -- profile → facts ----------------------------------------------------------------------------


def profile_facts(doc: Mapping[str, Any], source: str = "<profile>") -> HostFacts:
    """Return the facts an nvml-mock profile (a parsed document) states.

    Each device is ``device_defaults`` overlaid with its ``devices`` entry, as nvml-mock does;
    every device must be listed with its ``uuid`` and ``pci.bus_id`` (nvml-mock makes up missing
    ones; a bundle is reproducible only with the profile's own). A ``mig`` with
    ``max_gpu_instances: 0`` is a GPU without MIG, which NVML answers NotSupported for.

    Raises:
        ProfileError: For a missing or malformed field, named.
    """
    f = _Fields(source)
    f.text(doc.get("version"), "version", 16)
    system = f.mapping(doc.get("system"), "system")
    driver = f.text(system.get("driver_version"), "system.driver_version", 64)
    defaults = f.mapping(doc.get("device_defaults"), "device_defaults", optional=True)
    entries = f.array(doc.get("devices"), "devices", MAX_GPUS)
    count = len(entries)
    if system.get("num_devices") not in (None, 0):
        count = f.integer(system.get("num_devices"), "system.num_devices", 1, MAX_GPUS)
    if count > len(entries):
        why = f"lists {len(entries)} devices; each of the {count} needs its uuid and pci.bus_id"
        raise f.fail("devices", why)
    extension = f.mapping(doc.get(EXTENSION), EXTENSION, optional=True)
    by_index: dict[int, dict[str, Any]] = {}
    for pos, raw in enumerate(entries[:count]):
        entry = f.mapping(raw, f"devices[{pos}]")
        index = f.integer(entry.get("index", pos), f"devices[{pos}].index", 0, count - 1)
        if index in by_index:
            raise f.fail(f"devices[{pos}].index", f"repeats index {index}")
        by_index[index] = entry
    migs = _extension_migs(f, extension)
    gpus = tuple(
        _gpu_facts(f, _merged(defaults, by_index[i]), f"devices[{i}]", migs.get(i, ()))
        for i in range(count)
    )
    uuids = [g.uuid.lower() for g in gpus] + [
        m.uuid.lower() for g in gpus if g.mig for m in g.mig.devices
    ]
    if len(set(uuids)) != len(uuids):
        raise f.fail("devices", "two devices share a UUID")
    nvml = f.mapping(extension.get("nvml"), f"{EXTENSION}.nvml", optional=True)
    captured = extension.get("host")
    if captured is not None:
        captured = _captured(f, captured)
    grace = isinstance(defaults.get("grace_superchip"), dict) and bool(
        defaults["grace_superchip"].get("enabled")
    )
    return HostFacts(
        driver_version=driver,
        gpus=gpus,
        memory_v2=_flag(f, nvml, "memory_v2"),
        processes_v3=_flag(f, nvml, "processes_v3"),
        parent_queries=_flag(f, nvml, "parent_queries"),
        machine="aarch64" if grace or any(_grace(g.name) for g in gpus) else "x86_64",
        captured=captured,
    )


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _captured(f: _Fields, raw: object) -> dict[str, Any]:
    """A captured host's part beyond NVML; its records are checked as a bundle's when built."""
    where = f"{EXTENSION}.host"
    host = f.mapping(raw, where)
    for name in ("options", "summary"):
        f.mapping(host.get(name), f"{where}.{name}", optional=True)
    f.array(host.get("records"), f"{where}.records", 200_000)
    env = f.mapping(host.get("env"), f"{where}.env", optional=True)
    for name, value in env.items():
        plain = isinstance(value, str) and "\0" not in value and len(value) <= 65536
        if not (_ENV_NAME_RE.match(name) and plain):
            raise f.fail(f"{where}.env.{name[:40]}", "must map variable names to text")
    return host


def _flag(f: _Fields, nvml: Mapping[str, Any], name: str) -> bool:
    value = nvml.get(name, True)
    if not isinstance(value, bool):
        raise f.fail(f"{EXTENSION}.nvml.{name}", f"must be true or false, not {_shown(value)}")
    return value


def _grace(name: str) -> bool:
    # Grace Hopper and Grace Blackwell superchips pair the GPU with an Arm (aarch64) Grace CPU.
    return bool(re.match(r"^NVIDIA (GH|GB)\d", name))


def _memory(f: _Fields, raw: object, where: str) -> Memory:
    mem = f.mapping(raw, where)
    total = f.integer(mem.get("total_bytes"), f"{where}.total_bytes")
    reserved = f.integer(mem.get("reserved_bytes", 0), f"{where}.reserved_bytes", 0, total)
    used = f.integer(mem.get("used_bytes", 0), f"{where}.used_bytes", 0, total - reserved)
    out = Memory(total, reserved, used)
    if "free_bytes" in mem:
        free = f.integer(mem.get("free_bytes"), f"{where}.free_bytes")
        if free != out.free:
            why = f"must be total_bytes - reserved_bytes - used_bytes ({out.free}), not {free}"
            raise f.fail(f"{where}.free_bytes", why)
    return out


def _processes(f: _Fields, raw: object, where: str) -> tuple[Process, ...]:
    out: list[Process] = []
    for i, item in enumerate(f.array(raw, where, 4096)):
        at = f"{where}[{i}]"
        entry = f.mapping(item, at)
        pid = f.integer(entry.get("pid"), f"{at}.pid", 1, _U32)
        used = entry.get("used_memory_mib")
        nbytes = None if used is None else f.integer(used, f"{at}.used_memory_mib", 0, _U64 // MIB)
        name = entry.get("name", "")
        out.append(
            Process(
                pid,
                None if nbytes is None else nbytes * MIB,
                "" if name == "" else f.text(name, f"{at}.name", 64),
            )
        )
    return tuple(out)


def _gpu_facts(
    f: _Fields, dev: Mapping[str, Any], where: str, mig_devices: tuple[MigDevice, ...]
) -> Gpu:
    name = f.text(dev.get("name"), f"{where}.name", _NVML_NAME_LIMIT)
    uuid = f.matching(dev.get("uuid"), f"{where}.uuid", _UUID_RE, "GPU- and 32 hex digits")
    pci = f.mapping(dev.get("pci"), f"{where}.pci")
    bus = f.text(pci.get("bus_id"), f"{where}.pci.bus_id", 16)
    try:
        bus_id = sysfs_bus_id(bus)
    except ValueError:
        raise f.fail(f"{where}.pci.bus_id", f"must be DDDD:BB:DD.F, not {_shown(bus)}") from None
    cc_raw = dev.get("compute_capability")
    capability = None
    if cc_raw is not None:
        cc = f.mapping(cc_raw, f"{where}.compute_capability")
        capability = (
            f.integer(cc.get("major"), f"{where}.compute_capability.major", 0, 99),
            f.integer(cc.get("minor"), f"{where}.compute_capability.minor", 0, 9),
        )
    mig: Mig | None = None
    if dev.get("mig") is not None:
        raw = f.mapping(dev.get("mig"), f"{where}.mig")
        modes = ("enabled", "disabled")
        slots = f.integer(raw.get("max_gpu_instances", 0), f"{where}.mig.max_gpu_instances", 0, 7)
        current = f.choice(raw.get("mode_current", "disabled"), f"{where}.mig.mode_current", modes)
        pending = f.choice(raw.get("mode_pending", current), f"{where}.mig.mode_pending", modes)
        if slots:
            mig = Mig(current == "enabled", pending == "enabled", slots, mig_devices)
        elif current == "enabled":
            raise f.fail(f"{where}.mig", "MIG is enabled on a GPU with max_gpu_instances 0")
    if mig_devices and (mig is None or not mig.current):
        raise f.fail(f"{EXTENSION}.mig_devices", f"lists MIG devices of {where}, whose MIG is off")
    if mig is not None and any(m.slot >= mig.max_devices for m in mig_devices):
        raise f.fail(f"{EXTENSION}.mig_devices", f"a slot of {where} is past max_gpu_instances")
    return Gpu(
        name=name,
        uuid=uuid,
        bus_id=bus_id,
        memory=_memory(f, dev.get("memory"), f"{where}.memory"),
        compute_capability=capability,
        device_id=f.integer(pci.get("device_id", 0), f"{where}.pci.device_id", 0, _U32),
        subsystem_id=f.integer(pci.get("subsystem_id", 0), f"{where}.pci.subsystem_id", 0, _U32),
        mig=mig,
        processes=_processes(f, dev.get("processes"), f"{where}.processes"),
    )


def _extension_migs(f: _Fields, extension: Mapping[str, Any]) -> dict[int, tuple[MigDevice, ...]]:
    out: dict[int, list[MigDevice]] = {}
    where = f"{EXTENSION}.mig_devices"
    for i, item in enumerate(f.array(extension.get("mig_devices"), where, MAX_GPUS * MAX_MIG)):
        at = f"{where}[{i}]"
        entry = f.mapping(item, at)
        gpu = f.integer(entry.get("gpu"), f"{at}.gpu", 0, MAX_GPUS - 1)
        slot = f.integer(entry.get("slot"), f"{at}.slot", 0, MAX_MIG - 1)
        if any(m.slot == slot for m in out.get(gpu, ())):
            raise f.fail(f"{at}.slot", f"repeats slot {slot} of GPU {gpu}")
        out.setdefault(gpu, []).append(
            MigDevice(
                slot=slot,
                uuid=f.matching(entry.get("uuid"), f"{at}.uuid", _MIG_UUID_RE, "MIG- and 32 hex"),
                name=f.text(entry.get("name"), f"{at}.name", _NVML_NAME_LIMIT),
                gpu_instance_id=f.integer(entry.get("gpu_instance_id"), f"{at}.gpu_instance_id"),
                compute_instance_id=f.integer(
                    entry.get("compute_instance_id"), f"{at}.compute_instance_id"
                ),
                memory=_memory(f, entry.get("memory"), f"{at}.memory"),
                processes=_processes(f, entry.get("processes"), f"{at}.processes"),
            )
        )
    return {gpu: tuple(sorted(items, key=lambda m: m.slot)) for gpu, items in out.items()}


# -- nvidia-smi -q -x → profile -----------------------------------------------------------------

# Compute capability by product model, from NVIDIA's "CUDA GPU Compute Capability" table
# (developer.nvidia.com/cuda-gpus): `nvidia-smi -q -x` names the product, not its capability.
_CAPABILITY_BY_MODEL: dict[str, tuple[int, int]] = {
    "T4": (7, 5),
    "A100": (8, 0),
    "A30": (8, 0),
    "A800": (8, 0),
    "A10": (8, 6),
    "A10G": (8, 6),
    "A16": (8, 6),
    "A2": (8, 6),
    "A40": (8, 6),
    "L4": (8, 9),
    "L20": (8, 9),
    "L40": (8, 9),
    "L40S": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "H800": (9, 0),
    "H20": (9, 0),
    "GH200": (9, 0),
    "B200": (10, 0),
    "GB200": (10, 0),
    "B300": (10, 3),
    "GB300": (10, 3),
}
_CAPABILITY_BY_ARCH = {"Turing": (7, 5), "Ada Lovelace": (8, 9), "Hopper": (9, 0)}


def capability_of(product: str, architecture: str = "") -> tuple[int, int] | None:
    """The compute capability NVIDIA lists for ``product`` (or its architecture), else None."""
    for token in re.findall(r"[A-Z0-9]+", product.upper()):
        if token in _CAPABILITY_BY_MODEL:
            return _CAPABILITY_BY_MODEL[token]
    return _CAPABILITY_BY_ARCH.get(architecture.strip())


def smi_profile(root: ET.Element, source: str = "<nvidia-smi>") -> dict[str, Any]:
    """Return the nvml-mock profile (a document) that ``nvidia-smi -q -x`` output describes.

    Memory is in MiB there: bytes are MiB x 1 MiB, and free is total less reserved and used
    (nvidia-smi rounds each figure on its own). MIG devices carry no UUID in this output, so a
    GPU with MIG enabled is refused: describe it in a profile instead.

    Raises:
        ProfileError: For a missing or malformed element, named.
    """
    f = _Fields(source)

    def text_of(node: ET.Element, path: str, where: str) -> str:
        found = node.find(path)
        if found is None or found.text is None or not found.text.strip():
            raise f.fail(f"{where}/{path}", "is missing")
        return found.text.strip()

    def mib(node: ET.Element, path: str, where: str) -> int:
        value = text_of(node, path, where)
        match = _MIB_RE.match(value)
        if not match:
            raise f.fail(f"{where}/{path}", f"must be a number of MiB, not {_shown(value)}")
        return int(match.group(1)) * MIB

    def hex32(node: ET.Element, path: str, where: str) -> int:
        value = text_of(node, path, where)
        try:
            number = int(value, 16)
        except ValueError:
            raise f.fail(f"{where}/{path}", f"must be hexadecimal, not {_shown(value)}") from None
        return f.integer(number, f"{where}/{path}", 0, _U32)

    driver = f.text(text_of(root, "driver_version", "nvidia_smi_log"), "driver_version", 64)
    gpus = root.findall("gpu")
    if not gpus or len(gpus) > MAX_GPUS:
        raise f.fail("gpu", f"must appear 1 to {MAX_GPUS} times, not {len(gpus)}")
    devices: list[dict[str, Any]] = []
    for index, gpu in enumerate(gpus):
        where = f"gpu[{index}]"
        name = f.text(text_of(gpu, "product_name", where), f"{where}/product_name", 96)
        architecture = (gpu.findtext("product_architecture") or "").strip()
        capability = capability_of(name, architecture)
        if capability is None:
            why = f"no compute capability is known for {name!r}; describe it in a profile"
            raise f.fail(f"{where}/product_name", why)
        total = mib(gpu, "fb_memory_usage/total", where)
        reserved = mib(gpu, "fb_memory_usage/reserved", where)
        used = mib(gpu, "fb_memory_usage/used", where)
        if reserved + used > total:
            raise f.fail(f"{where}/fb_memory_usage", "reserved and used exceed total")
        mig_mode = (gpu.findtext("mig_mode/current_mig") or "N/A").strip()
        pending = (gpu.findtext("mig_mode/pending_mig") or mig_mode).strip()
        if mig_mode == "Enabled":
            why = "MIG is enabled: nvidia-smi -q -x names no MIG device UUIDs; use a profile"
            raise f.fail(f"{where}/mig_mode", why)
        device: dict[str, Any] = {
            "index": index,
            "name": name,
            "uuid": text_of(gpu, "uuid", where),
            "pci": {
                "bus_id": _checked_bus(f, text_of(gpu, "pci/pci_bus_id", where), where),
                "device_id": hex32(gpu, "pci/pci_device_id", where),
                "subsystem_id": hex32(gpu, "pci/pci_sub_system_id", where),
            },
            "compute_capability": {"major": capability[0], "minor": capability[1]},
            "memory": {"total_bytes": total, "reserved_bytes": reserved, "used_bytes": used},
            # "N/A": no MIG on this board (Turing, Ada), which NVML answers NotSupported for.
            "mig": {
                "mode_current": "disabled",
                "mode_pending": "enabled" if pending == "Enabled" else "disabled",
                "max_gpu_instances": 0 if mig_mode == "N/A" else MAX_MIG,
            },
            "processes": [
                {
                    "pid": _number(f, text_of(p, "pid", f"{where}/processes"), f"{where}/pid"),
                    "name": os.path.basename(p.findtext("process_name") or "")[:64],
                    "used_memory_mib": mib(p, "used_memory", f"{where}/processes") // MIB,
                }
                for p in gpu.findall("processes/process_info")
            ],
        }
        devices.append(device)
    return {"version": "1.0", "system": {"driver_version": driver}, "devices": devices}


def _number(f: _Fields, text: str, where: str) -> int:
    if not text.isdigit() or len(text) > 10:
        raise f.fail(where, f"must be a number, not {_shown(text)}")
    return int(text)


def _checked_bus(f: _Fields, text: str, where: str) -> str:
    try:
        return sysfs_bus_id(text)
    except ValueError:
        raise f.fail(f"{where}/pci/pci_bus_id", f"not a PCI bus id: {_shown(text)}") from None


# -- facts → bundle -----------------------------------------------------------------------------


def _fake_nvml(facts: HostFacts) -> Any:
    from tests.fakes.nvml import FakeGpu, FakeMigDevice, FakeNvml

    def procs(items: Sequence[Process]) -> list[tuple[int, int | None]]:
        return [(p.pid, p.used) for p in items]

    gpus = []
    for gpu in facts.gpus:
        mig = gpu.mig
        gpus.append(
            FakeGpu(
                name=gpu.name,
                uuid=gpu.uuid,
                pci_bus_id=nvml_bus_id(gpu.bus_id),
                total=gpu.memory.total,
                reserved=gpu.memory.reserved,
                used=gpu.memory.used,
                processes=procs(gpu.processes),
                mig_capable=mig is not None,
                mig_mode=int(bool(mig and mig.current)),
                mig_pending=int(bool(mig and mig.pending)),
                max_mig_devices=mig.max_devices if mig else 0,
                mig_devices=[
                    FakeMigDevice(
                        uuid=m.uuid,
                        name=m.name,
                        total=m.memory.total,
                        reserved=m.memory.reserved,
                        used=m.memory.used,
                        gpu_instance_id=m.gpu_instance_id,
                        compute_instance_id=m.compute_instance_id,
                        processes=procs(m.processes),
                        slot=m.slot,
                    )
                    for m in (mig.devices if mig else ())
                ],
                compute_capability=gpu.compute_capability,
                pci_device_id=gpu.device_id,
                pci_subsystem_id=gpu.subsystem_id,
            )
        )
    fake = FakeNvml(
        gpus,
        driver_version=facts.driver_version,
        memory_v2=facts.memory_v2,
        processes_v3=facts.processes_v3,
    )
    if not facts.parent_queries:

        def parent(handle: Any, *_: object, **__: object) -> bool:
            return handle.mig is None and bool(fake.gpus[handle.gpu].mig_mode)

        for name in ("MemoryInfo", "ComputeRunningProcesses", "GraphicsRunningProcesses"):
            fake.fail(f"nvmlDeviceGet{name}", "NoPermission", when=parent)
    return fake


@contextmanager
def _isolated(root: Path, env: Mapping[str, str], nvml: Any) -> Iterator[None]:
    """This process as a host with only ``nvml``: empty host trees, no AMD/Intel stack, ``env``."""
    # Every variable a capture keeps (visible devices, host roots, grants) is the built
    # host's, never the building machine's.
    cleared = {*_CLEARED, *considered()}
    names = {*cleared, *_ROOT_VARIABLES, *env}
    saved_env = {k: os.environ.get(k) for k in names}
    saved_mods = {k: sys.modules.get(k, ...) for k in _BLOCKED}
    for name in cleared:
        os.environ.pop(name, None)
    for name in _ROOT_VARIABLES:
        path = root / name.removeprefix("ACCELPLAT_").removesuffix("_ROOT").lower()
        path.mkdir()
        os.environ[name] = str(path)
    os.environ.update({k: v for k, v in env.items() if k not in _ROOT_VARIABLES})
    for name in _BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]
    sys.modules["pynvml"] = nvml
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, module in saved_mods.items():
            if module is ...:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _rewrite(value: Any, prefix: str, roots: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for path, real in roots.items():
            value = value.replace(path, real)
        return value.replace(prefix, "")
    if isinstance(value, list):
        return [_rewrite(v, prefix, roots) for v in value]
    if isinstance(value, dict):
        return {_rewrite(k, prefix, roots): _rewrite(v, prefix, roots) for k, v in value.items()}
    return value


def _built_answer(record: Mapping[str, Any], facts: HostFacts, names: Mapping[int, str]) -> Any:
    """The answer a built host gives to a non-NVML question, or None to keep the recorded one."""
    channel, key = record["channel"], record["key"]
    if channel == "amdsmi" and key == ["load"]:
        return [{"v": {"$map": _NO_AMDSMI}}]
    if channel == "levelzero" and key == ["load"]:
        return [{"v": {"$map": _NO_LEVEL_ZERO}}]
    if channel == "dist" and key[0] == "version":
        version = {"torch": BUILT_TORCH, "nvidia-ml-py": BUILT_NVIDIA_ML_PY}.get(key[1])
        return [{"v": version}]
    if channel == "host" and key == ["machine"]:
        return [{"v": facts.machine}]
    if channel == "proc" and key[0] == "classify":
        return [{"v": ["alive", names.get(key[1], "")]}]
    return None


def build_bundle(facts: HostFacts, *, provenance: str = "") -> bytes:
    """Return the bundle of a host with ``facts``: captured from the fake NVML, then replayed.

    ``provenance`` (where the facts came from) heads ``CONTENTS.txt``. A host exported from a
    capture (``facts.captured``) gets that capture's environment, non-NVML answers, summary and
    time back; any other gets a fixed host: no AMD or Intel stack, torch ``BUILT_TORCH``.

    Raises:
        ProfileError: When the captured part does not load as a bundle.
    """
    captured = facts.captured
    env = {k: str(v) for k, v in (captured or {}).get("env", {}).items()}
    with tempfile.TemporaryDirectory(prefix="accelplat-nvml-mock-") as tmp:
        with _isolated(Path(tmp), env, _fake_nvml(facts)):
            cap = capture(samples=2, interval_s=0.0, sleep=lambda _: None)
        roots = {os.path.join(tmp, "sysfs"): "/sys", os.path.join(tmp, "dev"): "/dev"}
        roots |= {os.path.join(tmp, "proc"): "/proc", os.path.join(tmp, "cgroup"): "/sys/fs/cgroup"}
        host: dict[str, Any] = _rewrite(json.loads(json.dumps(cap.host)), tmp, roots)
    host["env"] = {k: v for k, v in host["env"].items() if k not in _ROOT_VARIABLES}
    del host["variables"]  # a built host lists none: its replay clears every one it knows
    if captured is not None:
        nvml = [r for r in host["records"] if r["channel"] == "nvml"]
        host["records"] = nvml + list(captured.get("records", []))
        for name in ("created", "accelplat_version", "options", "summary", "env", "variables"):
            if name in captured:
                host[name] = captured[name]
    else:
        names = {p.pid: p.name for g in facts.gpus for p in _all_processes(g)}
        for record in host["records"]:
            answer = _built_answer(record, facts, names)
            if answer is not None:
                record["answers"] = answer
        host["created"] = BUILT_CREATED
        host["summary"].update(
            driver=facts.driver_version, python=BUILT_PYTHON, machine=facts.machine, system="Linux"
        )
        host["summary"]["versions"].update(
            torch=BUILT_TORCH, accelplat=host["accelplat_version"], vllm=None, amdsmi=None
        )
        host["summary"]["versions"]["nvidia-ml-py"] = BUILT_NVIDIA_ML_PY
    contents = (provenance.rstrip() + "\n\n" if provenance else "") + bundle_contents(host)
    try:
        bundle = parse_bundle(bundle_bytes(host, None, contents), source="<built>")
    except ValueError as exc:  # BundleError: the captured part is malformed
        raise ProfileError("<built>", EXTENSION + ".host", str(exc)) from None
    with replaying(bundle):
        info = collect_info()
    return bundle_bytes(host, info, contents)


def _all_processes(gpu: Gpu) -> list[Process]:
    migs = gpu.mig.devices if gpu.mig else ()
    return [*gpu.processes, *(p for m in migs for p in m.processes)]


# -- bundle → profile ---------------------------------------------------------------------------


class _Asked:
    """The NVML answers of a bundle, looked up by call."""

    def __init__(self, bundle: Bundle) -> None:
        self.source = bundle.source
        self.answers = {(r.channel, key_text(r.key)): r.answers for r in bundle.records}

    def first(self, name: str, *args: object, **kwargs: object) -> Any:
        """The first answer (an Answer) to the call, or None when it was never asked."""
        key = [
            "call",
            name,
            [_key_part(a) for a in args],
            {k: _key_part(v) for k, v in sorted(kwargs.items())},
        ]
        found = self.answers.get(("nvml", key_text(key)))
        return found[0] if found else None

    def value(self, name: str, *args: object, **kwargs: object) -> Any:
        answer = self.first(name, *args, **kwargs)
        if answer is None:
            raise ProfileError(self.source, name, "never asked: the capture lacks this answer")
        if answer.error is not None:
            why = f"raised {answer.error.get('type')}, which a profile cannot express"
            raise ProfileError(self.source, name, why)
        return answer.value

    def error_type(self, name: str, *args: object, **kwargs: object) -> str | None:
        answer = self.first(name, *args, **kwargs)
        return None if answer is None or answer.error is None else str(answer.error.get("type"))


def _key_part(value: object) -> object:
    return {"$handle": value.token} if isinstance(value, Handle) else value


def _as_text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def bundle_facts(bundle: Bundle) -> HostFacts:
    """Return the NVML facts of a captured (or built) CUDA bundle.

    Raises:
        ProfileError: A bundle without NVML, or with an answer a profile cannot express.
    """
    asked = _Asked(bundle)
    load = asked.answers.get(("nvml", key_text(["load"])))
    if not load or not isinstance(load[0].value, dict) or not load[0].value.get("present"):
        raise ProfileError(bundle.source, "nvml", "the capture has no NVIDIA driver (NVML)")
    count = asked.value("nvmlDeviceGetCount")
    version_attr = asked.answers.get(("nvml", key_text(["attr", "nvmlMemory_v2"])))
    v2 = version_attr[0].value if version_attr else None
    names = {}
    for rec in bundle.records:
        first = rec.answers[0].value if rec.answers else None
        if rec.channel == "proc" and isinstance(first, list) and len(first) == 2:
            names[rec.key[1]] = _as_text(first[1])
    memory_v2 = processes_v3 = parent_queries = True
    gpus: list[Gpu] = []
    for index in range(int(count)):
        handle = asked.value("nvmlDeviceGetHandleByIndex", index)
        if not isinstance(handle, Handle):
            raise ProfileError(bundle.source, "nvmlDeviceGetHandleByIndex", "not a handle")
        pci = asked.value("nvmlDeviceGetPciInfo", handle)
        mig: Mig | None = None
        if asked.error_type("nvmlDeviceGetMigMode", handle) is None:
            current, pending = asked.value("nvmlDeviceGetMigMode", handle)
            answered = asked.first("nvmlDeviceGetMaxMigDeviceCount", handle)
            # Not asked while MIG is off: seven, the most NVIDIA's MIG User Guide allows.
            slots = MAX_MIG if answered is None else int(answered.value)
            migs = tuple(
                _bundle_mig(asked, handle, slot, v2, names)
                for slot in range(slots)
                if _mig_handle(asked, handle, slot) is not None
            )
            mig = Mig(bool(current), bool(pending), slots, migs)
        capability = None
        if asked.error_type("nvmlDeviceGetCudaComputeCapability", handle) is None:
            answer = asked.first("nvmlDeviceGetCudaComputeCapability", handle)
            if answer is not None:
                capability = (int(answer.value[0]), int(answer.value[1]))
        processes, v3 = _bundle_processes(asked, handle, names)
        processes_v3 = processes_v3 and v3
        # A driver before R510 lacks the v2 memory query: the backend then asks v1.
        old_driver = asked.error_type("nvmlDeviceGetMemoryInfo", handle, version=v2)
        memory_v2 = memory_v2 and old_driver != "NVMLError_FunctionNotFound"
        refused = old_driver == "NVMLError_NoPermission"  # a MIG container's parent GPU
        parent_queries = parent_queries and not refused
        gpus.append(
            Gpu(
                name=_as_text(asked.value("nvmlDeviceGetName", handle)),
                uuid=_as_text(asked.value("nvmlDeviceGetUUID", handle)),
                bus_id=sysfs_bus_id(_as_text(pci.busId)),
                memory=Memory(0) if refused else _bundle_memory(asked, handle, v2, memory_v2),
                compute_capability=capability,
                device_id=int(getattr(pci, "pciDeviceId", 0)),
                subsystem_id=int(getattr(pci, "pciSubSystemId", 0)),
                mig=mig,
                processes=processes,
            )
        )
    return HostFacts(
        driver_version=_as_text(asked.value("nvmlSystemGetDriverVersion")),
        gpus=tuple(gpus),
        memory_v2=memory_v2,
        processes_v3=processes_v3,
        parent_queries=parent_queries,
        machine=str(bundle.summary.get("machine") or "x86_64"),
    )


def _mig_handle(asked: _Asked, handle: Handle, slot: int) -> Handle | None:
    answer = asked.first("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
    if answer is None or answer.error is not None:
        return None
    return answer.value if isinstance(answer.value, Handle) else None


def _bundle_mig(
    asked: _Asked, parent: Handle, slot: int, v2: object, names: Mapping[int, str]
) -> MigDevice:
    handle = _mig_handle(asked, parent, slot)
    assert handle is not None
    processes, _ = _bundle_processes(asked, handle, names)
    return MigDevice(
        slot=slot,
        uuid=_as_text(asked.value("nvmlDeviceGetUUID", handle)),
        name=_as_text(asked.value("nvmlDeviceGetName", handle)),
        gpu_instance_id=int(asked.value("nvmlDeviceGetGpuInstanceId", handle)),
        compute_instance_id=int(asked.value("nvmlDeviceGetComputeInstanceId", handle)),
        memory=_bundle_memory(asked, handle, v2, True),
        processes=processes,
    )


def _bundle_memory(asked: _Asked, handle: Handle, v2: object, memory_v2: bool) -> Memory:
    if memory_v2 and asked.first("nvmlDeviceGetMemoryInfo", handle, version=v2) is not None:
        mem = asked.value("nvmlDeviceGetMemoryInfo", handle, version=v2)
        out = Memory(int(mem.total), int(mem.reserved), int(mem.used))
        if out.free != int(mem.free):
            why = "free is not total - reserved - used, which a profile cannot express"
            raise ProfileError(asked.source, "nvmlDeviceGetMemoryInfo", why)
        return out
    if asked.first("nvmlDeviceGetMemoryInfo", handle) is not None:
        mem = asked.value("nvmlDeviceGetMemoryInfo", handle)
        return Memory(int(mem.total), 0, int(mem.used))  # v1: reserved counts as used
    return Memory(0)  # never asked: the GPU was hidden from the captured process


def _bundle_processes(
    asked: _Asked, handle: Handle, names: Mapping[int, str]
) -> tuple[tuple[Process, ...], bool]:
    v3 = True
    listed = asked.first("nvmlDeviceGetComputeRunningProcesses", handle)
    if listed is not None and listed.error is not None:
        v3 = listed.error.get("type") != "NVMLLibraryMismatchError"
        listed = asked.first("nvmlDeviceGetComputeRunningProcesses_v2", handle)
    if listed is None or listed.error is not None or not isinstance(listed.value, list):
        return (), v3
    out = []
    for item in listed.value:
        if not isinstance(item, Record):
            continue
        pid = int(getattr(item, "pid", 0))
        used = getattr(item, "usedGpuMemory", None)
        nbytes = None if not isinstance(used, int) or used >= _U64 else used
        out.append(Process(pid, nbytes, names.get(pid, "")))
    return tuple(out), v3


_ARCHITECTURES = {7: "turing", 8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}


def _architecture(capability: tuple[int, int] | None) -> str | None:
    if capability is None:
        return None
    if capability == (8, 9):
        return "ada_lovelace"
    if capability[0] == 7 and capability[1] < 5:
        return "volta"
    return _ARCHITECTURES.get(capability[0])


def _memory_doc(memory: Memory) -> dict[str, int]:
    return {
        "total_bytes": memory.total,
        "reserved_bytes": memory.reserved,
        "free_bytes": memory.free,
        "used_bytes": memory.used,
    }


def _process_docs(processes: Sequence[Process]) -> list[dict[str, Any]]:
    out = []
    for p in processes:
        doc: dict[str, Any] = {"pid": p.pid, "type": "C"}
        if p.name:
            doc["name"] = p.name
        if p.used is not None:
            doc["used_memory_mib"] = p.used // MIB
        out.append(doc)
    return out


def _device_doc(gpu: Gpu) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": gpu.name}
    arch = _architecture(gpu.compute_capability)
    if arch:
        doc["architecture"] = arch
    if gpu.compute_capability is not None:
        major, minor = gpu.compute_capability
        doc["compute_capability"] = {"major": major, "minor": minor}
    doc["memory"] = _memory_doc(gpu.memory)
    doc["pci"] = {"device_id": gpu.device_id, "subsystem_id": gpu.subsystem_id}
    if gpu.mig is None:
        doc["mig"] = {
            "mode_current": "disabled",
            "mode_pending": "disabled",
            "max_gpu_instances": 0,
        }
    else:
        doc["mig"] = {
            "mode_current": "enabled" if gpu.mig.current else "disabled",
            "mode_pending": "enabled" if gpu.mig.pending else "disabled",
            "max_gpu_instances": gpu.mig.max_devices,
        }
    doc["processes"] = _process_docs(gpu.processes)
    return doc


def profile_document(facts: HostFacts) -> dict[str, Any]:
    """Return the nvml-mock profile of ``facts`` (with ``x-accelplat`` for the rest)."""
    devices = []
    for index, gpu in enumerate(facts.gpus):
        entry = {"index": index, "uuid": gpu.uuid, **_device_doc(gpu)}
        entry["pci"] = {"bus_id": gpu.bus_id, **entry["pci"]}
        devices.append(entry)
    extension: dict[str, Any] = {
        "format": EXTENSION_FORMAT,
        "nvml": {
            "memory_v2": facts.memory_v2,
            "processes_v3": facts.processes_v3,
            "parent_queries": facts.parent_queries,
        },
        "mig_devices": [
            {
                "gpu": index,
                "slot": m.slot,
                "uuid": m.uuid,
                "name": m.name,
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "memory": _memory_doc(m.memory),
                "processes": _process_docs(m.processes),
            }
            for index, gpu in enumerate(facts.gpus)
            for m in (gpu.mig.devices if gpu.mig else ())
        ],
    }
    if facts.captured is not None:
        extension["host"] = dict(facts.captured)
    return {
        "version": "1.0",
        "system": {"driver_version": facts.driver_version, "num_devices": len(facts.gpus)},
        "device_defaults": _device_doc(facts.gpus[0]) if facts.gpus else {},
        "devices": devices,
        EXTENSION: extension,
    }


def captured_host(bundle: Bundle) -> dict[str, Any]:
    """The part of a captured bundle beyond NVML: environment, summary, every other answer."""
    records = []
    for rec in bundle.records:
        if rec.channel == "nvml":
            continue
        answers = [
            {"raise": dict(a.error)} if a.error is not None else {"v": encode(a.value, _token)}
            for a in rec.answers
        ]
        records.append({"channel": rec.channel, "key": rec.key, "answers": answers})
    return {
        "created": bundle.created,
        "accelplat_version": bundle.accelplat_version,
        "options": dict(bundle.options),
        "summary": dict(bundle.summary),
        "env": dict(bundle.env),
        "records": records,
    }


def _token(value: object) -> str:
    if isinstance(value, Handle):
        return value.token
    raise TypeError(f"an opaque value outside NVML: {type(value).__name__}")


def export_profile(bundle: Bundle) -> dict[str, Any]:
    """Return the nvml-mock profile of a CUDA bundle; importing it rebuilds the same host.

    Raises:
        ProfileError: When the bundle is not a CUDA capture or holds what a profile cannot say.
    """
    try:
        facts = bundle_facts(bundle)
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        if isinstance(exc, ProfileError):
            raise
        why = f"an NVML answer is not what NVML gives: {type(exc).__name__}: {str(exc)[:200]}"
        raise ProfileError(bundle.source, "nvml", why) from None
    return profile_document(replace(facts, captured=captured_host(bundle)))


# -- YAML out -----------------------------------------------------------------------------------

_HEX_KEYS = frozenset({"device_id", "subsystem_id"})  # PCI ids, in hex as nvml-mock writes them
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def dump_yaml(doc: Mapping[str, Any], header: str = "") -> str:
    """Return ``doc`` as block YAML that nvml-mock and PyYAML read (strings JSON-quoted)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines.extend(_yaml_lines(doc, 0))
    return "\n".join(lines) + "\n"


# Plain words YAML 1.1 (PyYAML, and the Go reader nvml-mock uses) reads as booleans or null.
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = json.dumps(value)  # finite: the bundle loader refuses others
        mantissa, e, exponent = text.partition("e")
        # YAML 1.1 reads 1e-05 as text: its floats need a point in the mantissa.
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return json.dumps(str(value))


def _yaml_key(key: str) -> str:
    plain = _PLAIN_KEY.match(key) and key.lower() not in _YAML_WORDS
    return key if plain else json.dumps(key)


def _yaml_lines(value: object, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            head = f"{pad}{_yaml_key(str(key))}:"
            if isinstance(item, (Mapping, list)) and item:
                out.append(head)
                out.extend(_yaml_lines(item, indent + 2))
            else:
                hexadecimal = key in _HEX_KEYS and isinstance(item, int) and 0 <= item <= _U32
                out.append(f"{head} {f'0x{item:08X}' if hexadecimal else _flow(item)}")
        return out
    assert isinstance(value, list)
    for item in value:
        if isinstance(item, (Mapping, list)) and item:
            inner = _yaml_lines(item, indent + 2)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out.extend(inner[1:])
        else:
            out.append(f"{pad}- {_flow(item)}")
    return out


def _flow(value: object) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


# -- the command --------------------------------------------------------------------------------


def import_profile(path: str | os.PathLike[str], provenance: str = "") -> bytes:
    """Return the bundle of the nvml-mock profile file at ``path``.

    Raises:
        ProfileError: For an unreadable or malformed profile.
    """
    source = os.fspath(path)
    facts = profile_facts(parse_yaml(read_document(source, PROFILE_LIMIT), source), source)
    return build_bundle(facts, provenance=provenance)


def import_smi(
    path: str | os.PathLike[str], provenance: str = "", *, machine: str | None = None
) -> bytes:
    """Return the bundle of the ``nvidia-smi -q -x`` file at ``path``.

    Raises:
        ProfileError: For an unreadable or malformed document.
    """
    source = os.fspath(path)
    doc = smi_profile(parse_smi_xml(read_document(source, XML_LIMIT), source), source)
    facts = profile_facts(doc, source)
    if machine:
        facts = replace(facts, machine=machine)
    return build_bundle(facts, provenance=provenance)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: a problem with the input)."""
    parser = argparse.ArgumentParser(prog="python -m tools.nvml_mock", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in (("import", "an nvml-mock profile"), ("import-smi", "nvidia-smi -q -x XML")):
        cmd = sub.add_parser(name, help=f"build a bundle from {what}")
        cmd.add_argument("path")
        output_option(cmd, "--out", required=True)
        cmd.add_argument("--source", default="", help="where the input came from (CONTENTS.txt)")
    export = sub.add_parser("export", help="write a CUDA bundle as an nvml-mock profile")
    export.add_argument("path")
    output_option(export, "--out", required=True)  # the package's rules: never a special file
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            bundle = load_bundle(args.path)
            header = f"nvml-mock profile exported by accelplat from {os.path.basename(args.path)}"
            data: str | bytes = dump_yaml(export_profile(bundle), header)
        else:
            build = import_profile if args.command == "import" else import_smi
            data = build(args.path, args.source)
        # renamed over --out: a link there is replaced, never written through
        write_text_atomic(args.out, data)
    except (ProfileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a missing directory, no permission: named, no traceback
        print(f"error: cannot write {args.out!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
