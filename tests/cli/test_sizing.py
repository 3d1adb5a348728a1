"""``accelplat shm`` and ``accelplat kv`` through the real entry point."""

from __future__ import annotations

import json

import pytest

from accelplat import GIB, MIB
from accelplat._cli import main
from accelplat._describe import SCHEMA_VERSION
from tests.fakes.hostfs import fake_statvfs

KV = ["kv", "--layers", "42", "--kv-heads", "8", "--head-size", "256", "--dtype", "bf16"]
PER_TOKEN = 42 * 8 * (256 + 256) * 2  # bytes per token of the seed-case shape


# -- shm ---------------------------------------------------------------------------------------


def test_shm_shows_space(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_statvfs(monkeypatch, total=16 * GIB, free=int(1.5 * GIB))
    assert main(["shm", "--path", "/fake/shm"]) == 0
    out, err = capsys.readouterr()
    assert out == "/fake/shm: 1.50 GiB free of 16.00 GiB (14.50 GiB used)\n"
    assert err == ""


def test_shm_require_fits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_statvfs(monkeypatch, total=16 * GIB, free=int(1.4 * GIB))
    assert main(["shm", "--path", "/fake/shm", "--require", "1GiB", "--name", "KV offload"]) == 0
    out, err = capsys.readouterr()
    assert "fits: KV offload needs 1.00 GiB (1073741824 bytes)" in out
    assert err == ""


def test_shm_require_does_not_fit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the seed case: 4 GiB asked, 1.4 GiB free on a shared CI worker
    fake_statvfs(monkeypatch, total=16 * GIB, free=int(1.4 * GIB))
    argv = ["shm", "--path", "/fake/shm", "--require", "4GiB", "--name", "CPU KV offload"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out.startswith("/fake/shm: 1.40 GiB free")
    assert err == (
        "accelplat shm: CPU KV offload does not fit: needs 4.00 GiB, /fake/shm has 1.40 GiB "
        "free of 16.00 GiB; free space there or choose a larger mount\n"
    )


def test_shm_on_dev_shm_says_how_to_grow_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_statvfs(monkeypatch, total=64 * GIB, free=12 * GIB, prefix="/dev/shm")
    assert main(["shm", "--require", "400GiB"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "accelplat shm: shared-memory buffer does not fit: needs 400.00 GiB, /dev/shm has "
        "12.00 GiB free of 64.00 GiB; make it larger (docker: --shm-size or --ipc=host)\n"
    )
    assert "MiB" not in err


def test_shm_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_statvfs(monkeypatch, total=64 * MIB, free=64 * MIB)
    assert main(["shm", "--path", "/fake/shm", "--json", "--require", "160MiB"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc == {
        "schema": SCHEMA_VERSION,
        "path": "/fake/shm",
        "free": 64 * MIB,
        "total": 64 * MIB,
        "used": 0,
        "required": 160 * MIB,
        "name": "shared-memory buffer",
        "fits": False,
    }
    assert "needs 160.00 MiB, /fake/shm has 64.00 MiB free" in err

    assert main(["shm", "--path", "/fake/shm", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["required"], doc["fits"], doc["name"]) == (None, None, None)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["shm", "--path", "/fake/missing"], "path '/fake/missing' does not exist"),
        (["shm", "--path", "/fake/shm", "--require", "lots"], "--require must be a non-negative"),
        (["shm", "--path", "/fake/shm", "--require", "1GiB", "--name", " "], "--name must be"),
    ],
)
def test_shm_bad_usage_exits_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    fragment: str,
) -> None:
    fake_statvfs(monkeypatch, total=GIB, free=GIB)
    try:
        code = main(argv)
    except SystemExit as exc:  # a size is refused by the parser
        code = int(exc.code or 0)
    assert code == 2
    assert fragment in capsys.readouterr().err


def test_shm_real_default_mount(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this system")
    assert main(["shm", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == "/dev/shm"
    assert 0 <= doc["free"] <= doc["total"]


# -- kv ----------------------------------------------------------------------------------------


def test_kv_prints_bytes_and_gib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*KV, "--max-model-len", "2048"]) == 0
    out, err = capsys.readouterr()
    need = 2048 * PER_TOKEN
    assert f"KV cache for one request of 2048 tokens: {need} bytes (0.66 GiB)" in out
    assert f"{8 * 16 * 512 * 2} bytes per page (16 tokens, 1 layer)" in out
    assert f"{PER_TOKEN} bytes per token (42 layers)" in out
    assert err == ""


def test_kv_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*KV, "--max-model-len", "512", "--available", "0.64GiB"]) == 0
    out, _ = capsys.readouterr()
    assert "fits in 0.64 GiB available; longest that fits: 1984 tokens" in out


def test_kv_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*KV, "--max-model-len", "2048", "--available", "0.64GiB"]) == 1
    out, err = capsys.readouterr()
    assert "0.66 GiB KV cache is needed" in err
    assert "available KV cache memory (0.64 GiB)" in err
    assert "estimated maximum model length is 1984" in err
    assert "fits in" not in out


def test_kv_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*KV, "--max-model-len", "2048", "--available", "687194767B", "--json"]
    assert main(argv) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "schema": SCHEMA_VERSION,
        "max_model_len": 2048,
        "bytes": 2048 * PER_TOKEN,
        "gib": round(2048 * PER_TOKEN / GIB, 4),
        "page_bytes": 8 * 16 * 512 * 2,
        "bytes_per_token": PER_TOKEN,
        "block_size": 16,
        "dtype_bytes": 2,
        "available": 687194767,
        "fits": False,
        "max_model_len_that_fits": 1984,
    }


def test_kv_mla_and_block_size_and_numeric_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kv", "--layers", "27", "--kv-heads", "1", "--head-size", "576"]
    argv += ["--head-size-v", "0", "--dtype", "2", "--max-model-len", "100"]
    argv += ["--block-size", "64", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["page_bytes"] == 1 * 64 * 576 * 2
    assert doc["bytes"] == 27 * 2 * doc["page_bytes"]  # 100 tokens need 2 pages of 64
    assert (doc["available"], doc["fits"], doc["max_model_len_that_fits"]) == (None, None, None)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--max-model-len", "0"], "--max-model-len must be an int >= 1, got 0"),
        (["--max-model-len", "16", "--block-size", "0"], "--block-size must be an int >= 1"),
        (["--max-model-len", "16", "--head-size-v", "-1"], "--head-size-v must be an int >= 0"),
        (["--max-model-len", "16", "--available=-1GiB"], "--available must be a non-negative"),
    ],
)
def test_kv_bad_values_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    try:
        code = main([*KV, *extra])
    except SystemExit as exc:  # a size is refused by the parser
        code = int(exc.code or 0)
    assert code == 2
    assert fragment in capsys.readouterr().err


def test_kv_bad_dtype_and_layers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kv", "--layers", "-3", "--kv-heads", "8", "--head-size", "256", "--dtype", "bf16",
            "--max-model-len", "16"]  # fmt: skip
    assert main(argv) == 2
    assert "--layers must be an int >= 1, got -3" in capsys.readouterr().err
    argv = [*KV[:-1], "auto", "--max-model-len", "16"]
    assert main(argv) == 2
    assert "'auto' means the model's own dtype" in capsys.readouterr().err


def test_kv_missing_required_flag_is_argparse_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["kv", "--layers", "2"])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err
