"""``accelplat capture`` writes a bundle and says what is inside; ``accelplat info --replay`` and
``ACCELPLAT_REPLAY`` answer from it — in another process, with no NVML there at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat._cli import main
from accelplat.replay import load_bundle
from tests.conftest import Install
from tests.fakes.nvml import GIB, FakeNvml, h200


@pytest.fixture
def two_gpus(install: Install, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    monkeypatch.delenv("ACCELPLAT_REPLAY", raising=False)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", "/nonexistent/libze_loader.so.1")
    gpus = [h200(0, used=2 * GIB), h200(1)]
    gpus[0].processes = [(31337, 2 * GIB)]
    return install(FakeNvml(gpus))


def test_capture_writes_a_bundle_and_prints_everything_inside(
    two_gpus: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "host.tar.gz"
    assert main(["capture", "--out", str(out), "--samples", "1", "--interval", "0"]) == 0
    printed = capsys.readouterr().out
    bundle = load_bundle(out)
    assert bundle.summary["platform"] == "cuda"
    assert bundle.contents in printed
    assert "nvmlDeviceGetComputeRunningProcesses" in printed
    assert "Processes: INCLUDED" in printed
    assert f"wrote {out}" in printed
    assert [p.name for p in tmp_path.iterdir()] == ["host.tar.gz"]  # no temporary left behind


def test_no_processes_is_said_and_kept(
    two_gpus: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "host.tar.gz"
    assert main(["capture", "--out", str(out), "--no-processes", "--samples", "0", "-q"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    assert printed.endswith("; its CONTENTS.txt lists everything it holds.\n")
    assert "31337" not in out.read_bytes().decode("latin-1")
    assert printed.startswith("wrote ")
    assert load_bundle(out).options["processes"] is False


@pytest.mark.parametrize(
    "args", [["--samples", "-1"], ["--samples", "x"], ["--interval", "-2"], ["--interval", "11"]]
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["capture", "--out", str(tmp_path / "b.tar.gz"), *args])
    assert info.value.code == 2


def test_an_unwritable_destination_exits_1(
    two_gpus: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing-dir" / "host.tar.gz"
    assert main(["capture", "--out", str(target), "--samples", "0", "--quiet"]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_another_process_replays_the_bundle_through_the_variable_and_the_option(
    two_gpus: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "host.tar.gz"
    assert main(["capture", "--out", str(out), "--samples", "0", "--quiet"]) == 0
    capsys.readouterr()
    recorded = load_bundle(out).info
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    runs = [
        ([sys.executable, "-m", "accelplat", "info", "--json", "--replay", str(out)], env),
        (
            [sys.executable, "-m", "accelplat", "info", "--json"],
            {**env, "ACCELPLAT_REPLAY": str(out)},
        ),
    ]
    for argv, run_env in runs:
        done = subprocess.run(
            argv, env=run_env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        replayed = json.loads(done.stdout)
        assert replayed["platform"] == "cuda"
        assert replayed["devices"] == recorded["devices"]  # type: ignore[index]
        assert replayed["candidates"][0] == recorded["candidates"][0]  # type: ignore[index]


def test_text_output_names_the_bundle(
    two_gpus: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "host.tar.gz"
    assert main(["capture", "--out", str(out), "--samples", "0", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["info", "--replay", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"replaying {out} (captured ")
    assert "NVIDIA H200" in text


def test_a_malformed_bundle_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8bnot really")
    assert main(["info", "--replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: corrupt gzip data" in err or f"{bad}: truncated" in err
