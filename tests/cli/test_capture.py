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


def _cgroup_tree(root: Path, self_cgroup: str, rules: str | None) -> None:
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text(self_cgroup)
    job = root / "cgroup" / "devices" / "slurm" / "uid_1000" / "job_42" / "step_0"
    job.mkdir(parents=True)
    if rules is not None:
        (job / "devices.list").write_text(rules)


# A Slurm step given GPUs 1 and 3 of four (cgroup v1 device rules, as Slurm's task/cgroup writes
# them: the NVIDIA GPUs are char 195:N, nvidiactl 195:255).
_SLURM_RULES = "c 195:1 rwm\nc 195:3 rwm\nc 195:255 rwm\nc 1:3 rwm\n"
_SLURM_CGROUP = "12:devices:/slurm/uid_1000/job_42/step_0\n0::/slurm/uid_1000/job_42/step_0\n"


def test_capture_records_the_scheduler_grant_and_replay_restores_it(
    two_gpus: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat._capture import scheduler_grant
    from accelplat.replay import replaying

    _cgroup_tree(tmp_path, _SLURM_CGROUP, _SLURM_RULES)
    monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(tmp_path / "proc"))
    monkeypatch.setenv("ACCELPLAT_CGROUP_ROOT", str(tmp_path / "cgroup"))
    grant = {
        "SLURM_JOB_GPUS": "1,3",
        "SLURM_STEP_GPUS": "1,3",
        "GPU_DEVICE_ORDINAL": "0,1",
        "NVIDIA_VISIBLE_DEVICES": "GPU-00000001-1111-2222-3333-444444444444",
    }
    for name, value in grant.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "host.tar.gz"
    assert main(["capture", "--out", str(out), "--samples", "0", "--quiet"]) == 0
    bundle = load_bundle(out)
    recorded = bundle.summary["scheduler"]
    assert recorded["variables"] == grant
    assert recorded["cgroup"] == {
        "version": "cgroup-v1",
        "path": "/slurm/uid_1000/job_42/step_0",
        "allowed": ["c 195:1 rwm", "c 195:3 rwm", "c 195:255 rwm", "c 1:3 rwm"],
        "gpus": [1, 3],
    }
    assert "Scheduler grant: SLURM_JOB_GPUS=1,3" in bundle.contents
    assert {k: bundle.env[k] for k in grant} == grant

    # Elsewhere: no grant, no cgroup tree; the replay answers with the captured ones.
    for name in grant:
        monkeypatch.delenv(name)
    (tmp_path / "proc" / "self" / "cgroup").unlink()
    with replaying(bundle):
        assert {k: os.environ.get(k) for k in grant} == grant
        assert scheduler_grant() == recorded
    assert all(name not in os.environ for name in grant)


@pytest.mark.parametrize(
    ("self_cgroup", "rules", "expected"),
    [
        ("0::/user.slice/session-1.scope\n", None, ("cgroup-v2", None, None)),
        ("4:devices:/docker/abc\n", None, ("cgroup-v1", None, None)),  # no devices.list
        ("4:devices:/\n", "a *:* rwm\n", ("cgroup-v1", ["a *:* rwm"], "all")),
        ("4:devices:/\n", "c 195:* rw\n", ("cgroup-v1", ["c 195:* rw"], "all")),
        (
            "4:devices:/\n",
            "c 195:255 rw\nb 8:0 r\n",
            ("cgroup-v1", ["c 195:255 rw", "b 8:0 r"], []),
        ),
        ("4:devices:/../../etc\n", None, None),  # a path that climbs out is not followed
        ("garbage\n", None, None),
    ],
)
def test_the_device_cgroup_forms(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    self_cgroup: str,
    rules: str | None,
    expected: tuple[str, list[str] | None, object] | None,
) -> None:
    from accelplat._capture import scheduler_grant

    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text(self_cgroup)
    if rules is not None:
        (tmp_path / "cgroup" / "devices").mkdir(parents=True)
        (tmp_path / "cgroup" / "devices" / "devices.list").write_text(rules)
    monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(tmp_path / "proc"))
    monkeypatch.setenv("ACCELPLAT_CGROUP_ROOT", str(tmp_path / "cgroup"))
    for name in (
        "SLURM_JOB_GPUS",
        "SLURM_STEP_GPUS",
        "GPU_DEVICE_ORDINAL",
        "NVIDIA_VISIBLE_DEVICES",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")
    grant = scheduler_grant()
    assert grant["variables"] == {"NVIDIA_VISIBLE_DEVICES": "void"}
    cgroup = grant["cgroup"]
    if expected is None:
        assert cgroup is None
        return
    version, allowed, gpus = expected
    assert (cgroup["version"], cgroup["allowed"], cgroup.get("gpus")) == (version, allowed, gpus)
    if allowed is None:
        assert cgroup["note"]


@pytest.mark.parametrize(
    "value",
    ["all", "none", "void", "0,1", "GPU-00000001-1111-2222-3333-444444444444", ""],
)
def test_each_device_plugin_form_of_nvidia_visible_devices_replays_as_captured(
    two_gpus: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from accelplat._capture import scheduler_grant
    from accelplat.replay import replaying

    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", value)
    out = tmp_path / "host.tar.gz"
    assert main(["capture", "--out", str(out), "--samples", "0", "--quiet"]) == 0
    bundle = load_bundle(out)
    assert bundle.summary["scheduler"]["variables"]["NVIDIA_VISIBLE_DEVICES"] == value
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "something else")
    with replaying(bundle):
        assert os.environ["NVIDIA_VISIBLE_DEVICES"] == value
        assert scheduler_grant()["variables"]["NVIDIA_VISIBLE_DEVICES"] == value
    assert os.environ["NVIDIA_VISIBLE_DEVICES"] == "something else"
