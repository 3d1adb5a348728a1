"""``tools/nvml_mock.py``: nvml-mock profiles and ``nvidia-smi -q -x`` in, profiles out.

Every CUDA bundle in ``tests/hosts/`` — the captured H200s and the hosts built from NVIDIA's
profiles and dumps — goes to a profile and back and prints the same ``accelplat info --json``;
the built hosts are exactly what ``python -m tests.hosts.make_nvidia`` makes of their sources;
malformed or hostile input is a ``ProfileError`` naming the field.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from accelplat._describe import collect_info
from accelplat._registry import current_platform
from accelplat._replay._bundle import parse_bundle
from accelplat.replay import compare_info, load_bundle, replaying
from tests._hosts import BUNDLES, HOSTS
from tests.hosts import make_nvidia
from tests.visible.test_cuda_model import ModelGpu, cuda_reference
from tools.nvml_mock import (
    MIB,
    ProfileError,
    build_bundle,
    bundle_facts,
    dump_yaml,
    export_profile,
    main,
    parse_smi_xml,
    parse_yaml,
    profile_facts,
    read_document,
    smi_profile,
)

CUDA_BUNDLES = [p for p in BUNDLES if load_bundle(p).summary.get("platform") == "cuda"]
SOURCES = HOSTS / "nvml-mock"


@pytest.fixture(autouse=True)
def _no_replay_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELPLAT_REPLAY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)


def _rebuilt(doc: dict[str, Any]) -> Any:
    return parse_bundle(build_bundle(profile_facts(doc, "<exported>")), source="<rebuilt>")


def test_the_nvidia_hosts_cover_the_architectures_and_a_mig_layout() -> None:
    archs = set()
    for path in CUDA_BUNDLES:
        info = load_bundle(path).info or {}
        archs |= {d["arch"] for d in info.get("devices", [])}
    assert {"sm_75", "sm_80", "sm_89", "sm_90", "sm_100", "sm_103"} <= archs
    assert len([p for p in CUDA_BUNDLES if not p.name.startswith("nvidia-h200")]) >= 8
    mig = load_bundle(HOSTS / "nvidia-a100-mig.tar.gz").info or {}
    # Unset CUDA_VISIBLE_DEVICES shows one MIG device per process, as CUDA does.
    assert [d["uuid"][:4] for d in mig["devices"]] == ["MIG-"]


@pytest.mark.parametrize("path", CUDA_BUNDLES, ids=lambda p: p.name)
def test_bundle_to_profile_to_bundle_prints_the_same_info(path: Path) -> None:
    bundle = load_bundle(path)
    doc = json.loads(json.dumps(export_profile(bundle)))  # plain data, as any reader gets it
    rebuilt = _rebuilt(doc)
    # Both replayed by this accelplat: the round trip holds whether or not the goldens are fresh.
    with replaying(bundle):
        original = collect_info()
    assert rebuilt.info is not None
    assert compare_info(original, rebuilt.info) == []
    assert compare_info(rebuilt.info, original) == []
    assert rebuilt.env == bundle.env
    assert rebuilt.summary == bundle.summary
    with replaying(rebuilt):
        assert [d.uuid for d in current_platform().devices()] == [
            d["uuid"] for d in bundle.info["devices"]
        ]


# The fields of nvml-mock's profile schema an export writes, with their Go types, from
# pkg/gpu/mocknvml/engine/config_types.go (YAMLConfig, SystemConfig, DeviceConfig, MemoryConfig,
# PCIConfig, MIGConfig, ProcessConfig) at NVIDIA/k8s-test-infra 3b2b865d91b1.
_U32, _U64 = 2**32 - 1, 2**64 - 1
_SCHEMA: dict[str, Any] = {
    "version": str,
    "system": {"driver_version": str, "num_devices": _U32},
    "device": {
        "index": _U32,
        "uuid": str,
        "name": str,
        "architecture": str,
        "compute_capability": {"major": _U32, "minor": _U32},
        "memory": {
            "total_bytes": _U64,
            "reserved_bytes": _U64,
            "free_bytes": _U64,
            "used_bytes": _U64,
        },
        "pci": {"bus_id": str, "device_id": _U32, "subsystem_id": _U32},
        "mig": {"mode_current": str, "mode_pending": str, "max_gpu_instances": _U32},
        "processes": [{"pid": _U32, "type": str, "name": str, "used_memory_mib": _U64}],
    },
}


def _fits(value: object, shape: object, where: str) -> None:
    if shape is str:
        assert isinstance(value, str), where
    elif isinstance(shape, int):
        assert isinstance(value, int), where
        assert not isinstance(value, bool), where
        assert 0 <= value <= shape, where
    elif isinstance(shape, list):
        assert isinstance(value, list), where
        for i, item in enumerate(value):
            _fits(item, shape[0], f"{where}[{i}]")
    else:
        assert isinstance(shape, dict)
        assert isinstance(value, dict), where
        assert set(value) <= set(shape), f"{where}: {sorted(set(value) - set(shape))}"
        for key, item in value.items():
            _fits(item, shape[key], f"{where}.{key}")


@pytest.mark.parametrize("path", CUDA_BUNDLES, ids=lambda p: p.name)
def test_the_exported_profile_fits_nvml_mocks_schema(path: Path) -> None:
    doc = export_profile(load_bundle(path))
    assert set(doc) == {"version", "system", "device_defaults", "devices", "x-accelplat"}
    _fits(doc["version"], _SCHEMA["version"], "version")
    _fits(doc["system"], _SCHEMA["system"], "system")
    _fits(doc["device_defaults"], _SCHEMA["device"], "device_defaults")
    for i, device in enumerate(doc["devices"]):
        _fits(device, _SCHEMA["device"], f"devices[{i}]")
    assert [d["index"] for d in doc["devices"]] == list(range(doc["system"]["num_devices"]))


@pytest.mark.parametrize("path", CUDA_BUNDLES, ids=lambda p: p.name)
def test_the_exported_yaml_reads_back_as_the_same_profile(path: Path) -> None:
    pytest.importorskip("yaml")
    doc = export_profile(load_bundle(path))
    text = dump_yaml(doc, f"exported from {path.name}")
    assert parse_yaml(text, path.name) == json.loads(json.dumps(doc))
    assert text.startswith(f"# exported from {path.name}\nversion: ")


@pytest.mark.parametrize("source", make_nvidia.HOSTS, ids=lambda s: s.bundle)
def test_each_built_host_is_what_its_source_makes(source: make_nvidia.Source) -> None:
    if source.kind == "profile":
        pytest.importorskip("yaml")
    committed, built = (
        _members((HOSTS / source.bundle).read_bytes()),
        _members(make_nvidia.build(source)),
    )
    stale = f"{source.bundle} is stale: run python -m tests.hosts.make_nvidia"
    # the records and the words byte for byte; the golden output as a replay compares it (a
    # platform a newer accelplat added is allowed)
    for member in ("host.json", "CONTENTS.txt"):
        assert built[member] == committed[member], stale
    assert compare_info(json.loads(committed["info.json"]), json.loads(built["info.json"])) == []
    assert committed["CONTENTS.txt"].decode().startswith(make_nvidia.provenance(source))


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # bundles of ours, loaded above
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


def test_the_readme_lists_every_nvidia_bundle_with_its_source() -> None:
    readme = (HOSTS / "README.md").read_text()
    for path in CUDA_BUNDLES:
        assert f"`{path.name}`" in readme, path.name
    for source in make_nvidia.HOSTS:
        assert source.date in readme
        assert source.commit[:12] in readme or source.kind == "dump"


@pytest.mark.parametrize("path", CUDA_BUNDLES, ids=lambda p: p.name)
def test_visible_devices_map_as_cuda_does_on_every_nvidia_host(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = load_bundle(path)
    facts = bundle_facts(bundle)
    # CUDA's default order of identical GPUs is PCI bus order (FASTEST_FIRST ties).
    gpus = sorted(facts.gpus, key=lambda g: g.bus_id)
    model = [
        ModelGpu(
            g.uuid,
            bool(g.mig and g.mig.current),
            tuple(
                (m.uuid, m.gpu_instance_id, m.compute_instance_id)
                for m in (g.mig.devices if g.mig else ())
            ),
        )
        for g in gpus
    ]
    last = len(gpus) - 1
    forms = {
        "",
        "0",
        str(last),
        f"{last},0",
        ",".join(str(i) for i in reversed(range(len(gpus)))),
        gpus[-1].uuid,
        gpus[0].uuid[:12],  # a prefix: unique or not, as CUDA decides
        f"0,{gpus[0].uuid}",  # a repeat
        f"{last},-1,0",  # stops at the invalid entry
        "NoDevFiles",
    }
    for g in gpus:
        for m in g.mig.devices if g.mig else ():
            forms |= {m.uuid, f"{m.uuid},{g.uuid}"}
    with replaying(bundle):
        platform = current_platform()
        for form in sorted(forms):
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", form)
            monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
            seen = [d.uuid for d in platform.devices()]
            assert seen == cuda_reference(form, model), form


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.name)
def test_the_capability_table_through_the_api_is_the_golden_one(path: Path) -> None:
    from accelplat import capabilities

    bundle = load_bundle(path)
    recorded = (bundle.info or {}).get("capabilities")
    if not recorded:
        pytest.skip("the host has no device")
    with replaying(bundle):
        table = {name: cap for name, cap in capabilities(0).items() if name in recorded}
    assert {
        name: {"available": cap.available, "reason": cap.reason, "value": cap.value}
        for name, cap in table.items()
    } == {name: {k: v[k] for k in ("available", "reason", "value")} for name, v in recorded.items()}


def test_a_profile_facts_come_through_as_nvml_answers() -> None:
    pytest.importorskip("yaml")
    path = SOURCES / "mock-nvml-config-l40s.yaml"
    doc = parse_yaml(read_document(path, 4 * MIB), path.name)
    doc["devices"][2]["memory"] = {  # merged over device_defaults, as nvml-mock merges it
        "reserved_bytes": 0,
        "free_bytes": 51539607552 - 5 * 1024 * MIB,
        "used_bytes": 5 * 1024 * MIB,
    }
    bundle = parse_bundle(build_bundle(profile_facts(doc, path.name)))
    with replaying(bundle):
        platform = current_platform()
        devices = list(platform.devices())
        memory = [platform.memory_info(d.index) for d in devices]
    assert [d.name for d in devices] == ["NVIDIA L40S"] * 8
    assert devices[0].pci_bus_id == "0000:17:00.0"
    assert memory[0].reserved == 536870912  # the profile's reserved_bytes
    assert memory[0].total == 51539607552 - 536870912  # NVML v2 total less reserved
    third = next(i for i, d in enumerate(devices) if d.physical_index == 2)  # NVML's GPU 2
    assert (memory[third].used, memory[third].reserved) == (5 * 1024 * MIB, 0)  # its own


def test_a_real_nvidia_smi_capture_becomes_the_same_gpus() -> None:
    root = parse_smi_xml(read_document(SOURCES / "qx-gb300.xml", 16 * MIB), "qx-gb300.xml")
    doc = smi_profile(root, "qx-gb300.xml")
    facts = profile_facts(doc, "qx-gb300.xml")
    assert facts.driver_version == "580.173.02"
    assert facts.machine == "aarch64"
    assert [g.compute_capability for g in facts.gpus] == [(10, 3)] * 4
    first = facts.gpus[0]
    assert (first.name, first.bus_id, first.device_id) == (
        "NVIDIA GB300",
        "0008:06:00.0",
        0x31C210DE,
    )
    assert (first.memory.total, first.memory.reserved) == (284208 * MIB, 947 * MIB)


# -- untrusted input ----------------------------------------------------------------------------


def _profile(**device: Any) -> dict[str, Any]:
    entry = {
        "index": 0,
        "name": "NVIDIA T4",
        "uuid": "GPU-00000074-0000-0000-0000-000000000000",
        "pci": {"bus_id": "0000:3B:00.0"},
        "memory": {"total_bytes": 16 * 1024 * MIB},
        **device,
    }
    return {"version": "1.0", "system": {"driver_version": "550.163.01"}, "devices": [entry]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"uuid": "GPU-zz"}, "devices[0].uuid"),
        ({"uuid": None}, "devices[0].uuid"),
        ({"name": "x" * 200}, "devices[0].name"),
        ({"name": "bad\x1b[2J"}, "devices[0].name"),
        ({"pci": {"bus_id": "nowhere"}}, "devices[0].pci.bus_id"),
        ({"pci": {"bus_id": "0000:3B:00.0", "device_id": -1}}, "devices[0].pci.device_id"),
        ({"memory": {"total_bytes": 2**70}}, "devices[0].memory.total_bytes"),
        ({"memory": {"total_bytes": 10, "used_bytes": 11}}, "devices[0].memory.used_bytes"),
        ({"memory": {"total_bytes": 10, "free_bytes": 3}}, "devices[0].memory.free_bytes"),
        ({"memory": "16 GiB"}, "devices[0].memory"),
        ({"compute_capability": {"major": 7, "minor": 12}}, "compute_capability.minor"),
        ({"compute_capability": {"major": True, "minor": 0}}, "compute_capability.major"),
        ({"mig": {"mode_current": "on", "max_gpu_instances": 7}}, "devices[0].mig.mode_current"),
        ({"mig": {"mode_current": "enabled"}}, "devices[0].mig"),
        ({"mig": {"max_gpu_instances": 99}}, "devices[0].mig.max_gpu_instances"),
        ({"processes": [{"pid": 0}]}, "devices[0].processes[0].pid"),
        ({"processes": "none"}, "devices[0].processes"),
    ],
)
def test_a_malformed_device_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ProfileError) as info:
        profile_facts(_profile(**change), "p.yaml")
    assert field in info.value.where
    assert str(info.value).startswith("p.yaml: ")


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"system": {"driver_version": "1"}, "devices": []}, "version"),
        ({"version": "1.0", "devices": []}, "system"),
        ({"version": "1.0", "system": {}}, "system.driver_version"),
        ({**_profile(), "system": {"driver_version": "1", "num_devices": 2}}, "devices"),
        ({**_profile(), "devices": [{"index": 5}]}, "devices[0].index"),
        ({**_profile(), "devices": [{}] * 65}, "devices"),
        ({**_profile(), "x-accelplat": {"mig_devices": [{"gpu": 0, "slot": 0}]}}, "uuid"),
        ({**_profile(), "x-accelplat": {"nvml": {"memory_v2": "yes"}}}, "memory_v2"),
    ],
)
def test_a_malformed_profile_is_refused_naming_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ProfileError) as info:
        profile_facts(doc, "p.yaml")
    assert field in info.value.where


def test_two_devices_with_one_uuid_are_refused() -> None:
    doc = _profile()
    doc["devices"].append({**doc["devices"][0], "index": 1, "pci": {"bus_id": "0000:3C:00.0"}})
    with pytest.raises(ProfileError, match="share a UUID"):
        profile_facts(doc, "p.yaml")


def test_mig_devices_of_a_gpu_whose_mig_is_off_are_refused() -> None:
    doc = make_nvidia.mig_profile()
    doc["devices"][0]["mig"]["mode_current"] = "disabled"
    with pytest.raises(ProfileError, match="whose MIG is off"):
        profile_facts(doc, "p.yaml")


@pytest.mark.parametrize(
    "text",
    [
        "base: &a {x: 1}\nother: *a\n",  # aliases (and the bombs built of them)
        "version: !!python/object:os.system 'true'\n",
        "version: !custom 1\n",
        "- a list\n",
        "version: [unclosed\n",
        "a:\n" + "  " * 0 + "[" * 5000 + "]" * 5000 + "\n",
    ],
)
def test_hostile_yaml_is_a_profile_error(text: str) -> None:
    pytest.importorskip("yaml")
    with pytest.raises(ProfileError):
        parse_yaml(text, "p.yaml")


_XML_HEAD = '<?xml version="1.0" ?>\n'


@pytest.mark.parametrize(
    "text",
    [
        _XML_HEAD + '<!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>',
        _XML_HEAD + "<!DOCTYPE x [<!ELEMENT x ANY>]><nvidia_smi_log/>",
        _XML_HEAD + '<!DOCTYPE x SYSTEM "file:///etc/passwd" [ ]><nvidia_smi_log/>',
        _XML_HEAD + "<other/>",
        _XML_HEAD + "<nvidia_smi_log><gpu>",
        "not xml at all",
    ],
)
def test_hostile_xml_is_a_profile_error(text: str) -> None:
    with pytest.raises(ProfileError):
        parse_smi_xml(text, "q.xml")


def _smi(gpu: str) -> str:
    return (
        _XML_HEAD + '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
        f"<nvidia_smi_log><driver_version>580.1</driver_version><gpu>{gpu}</gpu></nvidia_smi_log>"
    )


_GOOD_GPU = (
    "<product_name>NVIDIA H100 80GB HBM3</product_name><uuid>GPU-00000001-0000-0000-0000-"
    "000000000001</uuid><pci><pci_bus_id>00000000:53:00.0</pci_bus_id><pci_device_id>233010DE"
    "</pci_device_id><pci_sub_system_id>16C110DE</pci_sub_system_id></pci><fb_memory_usage>"
    "<total>81559 MiB</total><reserved>480 MiB</reserved><used>0 MiB</used><free>81080 MiB"
    "</free></fb_memory_usage><mig_mode><current_mig>{mig}</current_mig></mig_mode>"
)


def test_nvidia_smi_xml_with_its_doctype_is_read() -> None:
    doc = smi_profile(parse_smi_xml(_smi(_GOOD_GPU.format(mig="Disabled")), "q.xml"), "q.xml")
    (gpu,) = profile_facts(doc, "q.xml").gpus
    assert gpu.compute_capability == (9, 0)
    assert gpu.mig is not None
    assert not gpu.mig.current


@pytest.mark.parametrize(
    ("gpu", "field"),
    [
        (_GOOD_GPU.format(mig="Enabled"), "mig_mode"),
        (_GOOD_GPU.format(mig="N/A").replace("81559 MiB", "N/A"), "fb_memory_usage/total"),
        (_GOOD_GPU.format(mig="N/A").replace("H100 80GB HBM3", "Mystery 9000"), "product_name"),
        (_GOOD_GPU.format(mig="N/A").replace("233010DE", "XYZ"), "pci_device_id"),
        (_GOOD_GPU.format(mig="N/A").replace("00000000:53:00.0", "53"), "pci_bus_id"),
        (_GOOD_GPU.format(mig="N/A").replace("<uuid>", "<x>").replace("</uuid>", "</x>"), "uuid"),
    ],
)
def test_malformed_nvidia_smi_xml_is_refused_naming_the_element(gpu: str, field: str) -> None:
    with pytest.raises(ProfileError) as info:
        profile_facts(smi_profile(parse_smi_xml(_smi(gpu), "q.xml"), "q.xml"), "q.xml")
    assert field in info.value.where


def test_only_regular_files_within_the_limit_are_read(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not a regular file"):
        read_document(tmp_path, 1024)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        read_document(fifo, 1024)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(ProfileError, match="over the limit"):
        read_document(big, 1024)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ProfileError, match="UTF-8"):
        read_document(binary, 1024)
    with pytest.raises(ProfileError, match="cannot read"):
        read_document(tmp_path / "missing.yaml", 1024)


def test_a_host_without_nvml_cannot_be_exported() -> None:
    with pytest.raises(ProfileError, match="no NVIDIA driver"):
        export_profile(load_bundle(HOSTS / "cpu-x86_64.tar.gz"))


def test_the_command_line_exports_and_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("yaml")
    profile, out = tmp_path / "h200.yaml", tmp_path / "h200.tar.gz"
    source = HOSTS / "nvidia-h200-x2.tar.gz"
    assert main(["export", str(source), "--out", str(profile)]) == 0
    assert main(["import", str(profile), "--out", str(out), "--source", "a test"]) == 0
    rebuilt = load_bundle(out)
    assert compare_info(load_bundle(source).info, rebuilt.info) == []
    assert rebuilt.contents.startswith("a test\n")
    profile.write_text("version: [\n")
    assert main(["import", str(profile), "--out", str(out)]) == 2
    assert "error: " in capsys.readouterr().err


def test_yaml_out_reads_back_exactly_with_words_and_numbers_yaml_1_1_would_misread() -> None:
    pytest.importorskip("yaml")
    doc = {
        "version": "1.0",
        "keys": {"yes": 1, "No": 2, "on": 3, "null": 4, "$map": 5, "a b": 6, "0": 7, "": 8},
        "values": ["yes", "off", "1e5", "0x10", "", "~", "- x", "a: b", "#c", "\u00e9\n\t"],
        "numbers": [1e-05, 2.5e20, 0.4, -0.0, 2**64 - 1, -(2**63)],
        "empty": {"map": {}, "list": []},
        "nested": [[1, [2]], [{"a": [{}]}]],
    }
    assert parse_yaml(dump_yaml(doc), "round") == doc


def test_a_captured_host_with_a_bad_variable_or_record_list_is_refused() -> None:
    doc = _profile()
    doc["x-accelplat"] = {"host": {"env": {"BAD=NAME": "x"}, "records": []}}
    with pytest.raises(ProfileError) as info:
        profile_facts(doc, "p.yaml")
    assert "x-accelplat.host.env" in info.value.where
    doc["x-accelplat"] = {"host": {"env": {}, "records": "all of them"}}
    with pytest.raises(ProfileError, match=r"x-accelplat\.host\.records"):
        profile_facts(doc, "p.yaml")
    doc["x-accelplat"] = {"host": {"env": {}, "records": [{"channel": "file"}]}}
    with pytest.raises(ProfileError, match=r"x-accelplat\.host"):
        build_bundle(profile_facts(doc, "p.yaml"))


@pytest.mark.parametrize(
    ("call", "value"),
    [
        ("nvmlDeviceGetPciInfo", {"$record": {"type": "nvmlPciInfo_t", "fields": {}}}),
        ("nvmlDeviceGetPciInfo", "00000000:00:06.0"),
        ("nvmlDeviceGetMigMode", [1]),
        ("nvmlDeviceGetCudaComputeCapability", {"$tuple": ["9", 0]}),
        ("nvmlDeviceGetName", None),
    ],
)
def test_a_bundle_with_odd_nvml_answers_is_refused_on_export(
    call: str, value: object, tmp_path: Path
) -> None:
    import tarfile

    from accelplat._replay._bundle import bundle_bytes

    source = HOSTS / "nvidia-h200-x1.tar.gz"
    with tarfile.open(source) as tar:
        member = tar.extractfile("host.json")
        assert member is not None
        host = json.loads(member.read())
    for record in host["records"]:
        if record["channel"] == "nvml" and record["key"][:2] == ["call", call]:
            record["answers"] = [{"v": value}]
    data = bundle_bytes(host, None, "")
    try:
        bundle = parse_bundle(data)
    except ValueError:
        return  # the loader refused it already: fine too
    with pytest.raises(ProfileError):
        export_profile(bundle)
