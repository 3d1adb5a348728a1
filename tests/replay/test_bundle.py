"""The bundle loader treats bundles as untrusted input: every malformed, oversized, escaping or
future bundle is refused with a ``BundleError`` naming what is wrong, never a crash or a hang.
Bundles are built in memory here, byte by byte where the point is a hostile archive."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from accelplat._replay._bundle import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Limits,
    bundle_bytes,
    load_bundle,
    parse_bundle,
)
from accelplat.errors import BundleError, BundleVersionError


def host_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created": "2026-01-01T00:00:00+00:00",
        "accelplat_version": "0.1.0",
        "options": {"processes": True},
        "summary": {"platform": "cpu"},
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
        "records": [
            {
                "channel": "file",
                "key": ["read", "/proc/meminfo"],
                "answers": [{"v": "MemTotal: 1 kB\n"}],
            },
            {
                "channel": "nvml",
                "key": ["call", "nvmlDeviceGetMemoryInfo", [{"$handle": "nvml-0"}], {}],
                "answers": [
                    {
                        "v": {
                            "$record": {
                                "type": "c_nvmlMemory_t",
                                "fields": {"free": 1, "total": 2, "used": 1},
                            }
                        }
                    },
                    {
                        "raise": {
                            "type": "NVMLError_GpuIsLost",
                            "message": "GPU is lost",
                            "value": 15,
                        }
                    },
                ],
            },
        ],
    }
    doc.update(changes)
    return doc


def tar_gz(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def good_bytes(**changes: Any) -> bytes:
    return bundle_bytes(host_doc(**changes), {"schema": 1, "platform": "cpu"}, "contents")


def test_a_well_formed_bundle_loads_with_every_field_decoded() -> None:
    bundle = parse_bundle(good_bytes())
    assert bundle.format_version == FORMAT_VERSION
    assert bundle.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert bundle.info == {"schema": 1, "platform": "cpu"}
    assert bundle.contents == "contents"
    memory, lost = bundle.records[1].answers
    assert (memory.value.free, memory.value.total) == (1, 2)
    assert lost.error == {"type": "NVMLError_GpuIsLost", "message": "GPU is lost", "value": 15}


def test_the_writer_is_reproducible_and_names_no_owner() -> None:
    first, second = good_bytes(), good_bytes()
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first))) as tar:
        for member in tar.getmembers():
            assert (member.uname, member.gname, member.uid, member.gid, member.mtime) == (
                "",
                "",
                0,
                0,
                0,
            )


def test_a_future_format_version_is_refused_with_its_own_type() -> None:
    with pytest.raises(BundleVersionError) as info:
        parse_bundle(good_bytes(format_version=FORMAT_VERSION + 1))
    assert info.value.version == FORMAT_VERSION + 1
    assert "upgrade accelplat" in str(info.value)
    assert isinstance(info.value, BundleError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"format": "something-else"}, "format"),
        ({"format_version": "1"}, "format_version"),
        ({"format_version": True}, "format_version"),
        ({"format_version": 0}, "format_version"),
        ({"options": {"processes": "yes"}}, "options.processes"),
        ({"env": {"BAD NAME": "x"}}, "env.BAD NAME"),
        ({"env": {"CUDA_VISIBLE_DEVICES": 0}}, "env.CUDA_VISIBLE_DEVICES"),
        ({"variables": "CUDA_VISIBLE_DEVICES"}, "variables"),
        ({"variables": ["CUDA_VISIBLE_DEVICES", "A B"]}, "variables"),
        ({"variables": ["X"] * 257}, "variables"),
        ({"records": "none"}, "records"),
        ({"records": [{"channel": "file", "key": ["a"]}]}, "records[0]"),
        (
            {"records": [{"channel": "File!", "key": ["a"], "answers": [{"v": 1}]}]},
            "records[0].channel",
        ),
        ({"records": [{"channel": "file", "key": [], "answers": [{"v": 1}]}]}, "records[0].key"),
        ({"records": [{"channel": "file", "key": [1.5], "answers": [{"v": 1}]}]}, "records[0].key"),
        ({"records": [{"channel": "file", "key": ["a"], "answers": []}]}, "records[0].answers"),
        (
            {"records": [{"channel": "file", "key": ["a"], "answers": [{"x": 1}]}]},
            "records[0].answers[0]",
        ),
        (
            {"records": [{"channel": "file", "key": ["a"], "answers": [{"v": {"$evil": 1}}]}]},
            "records[0].answers[0].v",
        ),
        (
            {"records": [{"channel": "file", "key": ["a"], "answers": [{"v": {"$bytes": "***"}}]}]},
            "records[0].answers[0].v",
        ),
        (
            {
                "records": [
                    {
                        "channel": "nvml",
                        "key": ["a"],
                        "answers": [{"v": {"$record": {"type": "X", "fields": {"__class__": 1}}}}],
                    }
                ]
            },
            "records[0].answers[0].v",
        ),
        (
            {
                "records": [
                    {"channel": "file", "key": ["a"], "answers": [{"raise": {"type": "not an id"}}]}
                ]
            },
            "records[0].answers[0].raise.type",
        ),
        (
            {
                "records": [
                    {
                        "channel": "file",
                        "key": ["a"],
                        "answers": [{"raise": {"type": "OSError", "errno": "2"}}],
                    }
                ]
            },
            "records[0].answers[0].raise.errno",
        ),
        (
            {
                "records": [
                    {"channel": "file", "key": ["a"], "answers": [{"v": 1}]},
                    {"channel": "file", "key": ["a"], "answers": [{"v": 2}]},
                ]
            },
            "records[1].key",
        ),
    ],
)
def test_malformed_fields_are_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(BundleError) as info:
        parse_bundle(good_bytes(**changes))
    assert field in str(info.value)


def test_nesting_beyond_the_limit_is_refused_not_a_recursion_crash() -> None:
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(BundleError, match="deeper"):
        parse_bundle(
            good_bytes(records=[{"channel": "file", "key": ["a"], "answers": [{"v": deep}]}])
        )
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(BundleError, match=r"host\.json"):
        parse_bundle(tar_gz([regular("host.json", text.encode())]))


@pytest.mark.parametrize(
    ("name", "kind", "why"),
    [
        ("../host.json", tarfile.REGTYPE, "unexpected member"),
        ("/etc/host.json", tarfile.REGTYPE, "unexpected member"),
        ("sub/host.json", tarfile.REGTYPE, "unexpected member"),
        ("host.json", tarfile.SYMTYPE, "only regular files"),
        ("host.json", tarfile.LNKTYPE, "only regular files"),
        ("host.json", tarfile.DIRTYPE, "only regular files"),
        ("host.json", tarfile.CHRTYPE, "only regular files"),
        ("host.json", tarfile.FIFOTYPE, "only regular files"),
    ],
)
def test_links_devices_and_paths_in_the_archive_are_refused(
    name: str, kind: bytes, why: str
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = "/etc/passwd"
    with pytest.raises(BundleError, match=why):
        parse_bundle(tar_gz([(info, None)]))


def test_duplicate_members_and_too_many_members_are_refused() -> None:
    host = json.dumps(host_doc()).encode()
    with pytest.raises(BundleError, match="twice"):
        parse_bundle(tar_gz([regular("host.json", host), regular("host.json", host)]))
    two = [regular("host.json", host), regular("info.json", b"{}")]
    with pytest.raises(BundleError, match="more than 1 archive members"):
        parse_bundle(tar_gz(two), limits=Limits(members=1))


def test_a_decompression_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (8 * 1024 * 1024))
    with pytest.raises(BundleError, match="decompresses to more than"):
        parse_bundle(bomb, limits=Limits(uncompressed_bytes=1024 * 1024))


def test_oversized_files_and_members_are_refused(tmp_path: Path) -> None:
    data = good_bytes()
    with pytest.raises(BundleError, match="over the limit"):
        parse_bundle(data, limits=Limits(compressed_bytes=len(data) - 1))
    with pytest.raises(BundleError, match="over the limit"):
        parse_bundle(data, limits=Limits(member_bytes=64))
    path = tmp_path / "big.tar.gz"
    path.write_bytes(data)
    with pytest.raises(BundleError, match="over the limit"):
        load_bundle(path, limits=Limits(compressed_bytes=16))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not gzip at all",
        b"\x1f\x8b\x08\x00garbage",
        gzip.compress(b"not a tar", mtime=0),  # a fixed header: the same test id in every worker
        gzip.compress(b"x" * 1024, mtime=0),
    ],
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(BundleError):
        parse_bundle(data)


def test_truncated_bundles_are_refused() -> None:
    data = good_bytes()
    for cut in (10, len(data) // 2, len(data) - 4):
        with pytest.raises(BundleError):
            parse_bundle(data[:cut])


def test_a_bundle_without_host_json_or_with_bad_json_is_refused() -> None:
    with pytest.raises(BundleError, match=r"no host\.json"):
        parse_bundle(tar_gz([regular("info.json", b"{}")]))
    with pytest.raises(BundleError, match="not valid JSON"):
        parse_bundle(tar_gz([regular("host.json", b"{nope")]))
    with pytest.raises(BundleError, match="JSON object"):
        parse_bundle(tar_gz([regular("host.json", b"[1]")]))
    with pytest.raises(BundleError, match="UTF-8"):
        parse_bundle(tar_gz([regular("host.json", b"\xff\xfe")]))


def test_load_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot open"):
        load_bundle(tmp_path / "missing.tar.gz")
    with pytest.raises(BundleError, match="not a regular file"):
        load_bundle(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BundleError, match="not a regular file"):
        load_bundle(fifo)  # opened non-blocking: no hang waiting for a writer
