"""The command line answers bad values with exit status 2 and a message, never a traceback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelplat import _registry as registry
from accelplat._cli import main
from tests._hostile import FAST, REPO

CLI_SPEC = {
    "clock": "virtual",
    "release": {"lazy": True, "stable_duration_s": 0.5, "settle_timeout_s": 3.0},
    "devices": [
        {"total": "80GiB", "used": "30GiB", "timeline": [{"at": 1.0, "used": "1GiB"}]},
        {"total": "80GiB", "used": "2GiB"},
    ],
}


@pytest.fixture(scope="module")
def cli_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "spec.json"
    path.write_text(json.dumps(CLI_SPEC))
    return path


def run_cli(spec: Path, argv: list[str]) -> tuple[int, str, str]:
    """Run ``accelplat ARGV`` in this process on the simulated platform; return code and output."""
    out, err = io.StringIO(), io.StringIO()
    env = {"ACCELPLAT_PLATFORM": "simulated", "ACCELPLAT_SIMULATED_SPEC": str(spec)}
    with mock.patch.dict(os.environ, env), redirect_stdout(out), redirect_stderr(err):
        registry.reset()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            registry.reset()
    return code, out.getvalue(), err.getvalue()


_arg = st.text(max_size=25) | st.sampled_from(
    ["nan", "inf", "-inf", "-1", "0", "1e400", "4GiB", "0x10", "1,1", "-0", "", " ", "\u00b2"]
)
_ascii_arg = st.text(alphabet=[chr(c) for c in range(32, 127)], max_size=25) | st.sampled_from(
    ["nan", "inf", "-1", "0", "99999999999999999999", "4GiB", "1.5", ""]
)

CLI_FLAGS = [
    ["wait", "--threshold-bytes"],
    ["wait", "--threshold-ratio"],
    ["wait", "--threshold-ratio", "0.5", "--timeout"],
    ["wait", "--threshold-ratio", "0.5", "--devices"],
    ["wait", "--threshold-bytes", "1GiB", "--stable"],
    ["wait", "--threshold-bytes", "1GiB", "--tolerance"],
    ["wait", "--settle", "--threshold-ratio"],
    ["stats", "--devices"],
    ["stats", "--json", "--devices"],
    ["shm", "--require"],
    ["shm", "--path"],
    ["shm", "--require", "1", "--name"],
]


def _check_cli_outcome(code: int, out: str, err: str) -> None:
    # The header, not the word: Hypothesis also tries the test's own string constants as values,
    # and a refused value is quoted back ("got 'Traceback'").
    assert "Traceback (most recent call last)" not in err
    assert code in (0, 1, 2)
    if code == 2:
        assert "error" in err


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.sampled_from(CLI_FLAGS), value=_arg)
def test_cli_values_never_raise_a_traceback(cli_spec: Path, flags: list[str], value: str) -> None:
    code, out, err = run_cli(cli_spec, [*flags, value])
    _check_cli_outcome(code, out, err)


KV = [
    "kv",
    "--layers",
    "32",
    "--kv-heads",
    "8",
    "--head-size",
    "128",
    "--dtype",
    "bf16",
    "--max-model-len",
    "8192",
]


@FAST
@given(
    flag=st.sampled_from(
        [
            "--layers",
            "--kv-heads",
            "--head-size",
            "--dtype",
            "--max-model-len",
            "--block-size",
            "--available",
            "--head-size-v",
        ]
    ),
    value=_ascii_arg,
)
def test_kv_values_never_raise_a_traceback(cli_spec: Path, flag: str, value: str) -> None:
    code, out, err = run_cli(cli_spec, [*KV, flag, value])
    _check_cli_outcome(code, out, err)


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "--threshold-bytes", "9" * 1_000_001],
        ["wait", "--threshold-bytes", "1.5.5GiB"],
        ["wait", "--threshold-ratio", "nan"],
        ["wait", "--timeout", "-1", "--threshold-ratio", "0.1"],
        ["wait", "--devices", "0,0", "--threshold-ratio", "0.1"],
        ["wait", "--devices", "7", "--threshold-ratio", "0.1"],
        ["stats", "--devices", "\u00b2"],
        ["shm", "--require", "-4GiB"],
        ["shm", "--path", "a\x00b"],
        ["kv", *KV[1:], "--available", "9" * 2000],
    ],
    ids=lambda argv: " ".join(argv)[:40],
)
def test_bad_cli_values_exit_2_with_a_message(cli_spec: Path, argv: list[str]) -> None:
    code, _, err = run_cli(cli_spec, argv)
    assert "Traceback" not in err
    assert code == 2, err
    assert "error" in err


@pytest.mark.parametrize(
    "argv",
    [
        [*KV[:-4], "--dtype", "\u00b2", "--max-model-len", "8192"],
        [*KV[:-4], "--dtype", "9" * 5000, "--max-model-len", "8192"],
        ["kv", "--layers", "9" * 400, *KV[3:]],
        [*KV, "--available", "1GiB", "--layers", "9" * 400],
    ],
    ids=["dtype-superscript", "dtype-long", "layers-huge", "layers-huge-available"],
)
def test_kv_hostile_values_exit_cleanly(cli_spec: Path, argv: list[str]) -> None:
    code, _, _ = run_cli(cli_spec, argv)
    assert code in (1, 2)


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "--threshold-bytes", "9" * 400],
        ["wait", "--threshold-bytes", "1GiB", "--tolerance", "9" * 400],
    ],
    ids=["threshold-bytes", "tolerance"],
)
def test_wait_with_sizes_beyond_a_float_exits_cleanly(cli_spec: Path, argv: list[str]) -> None:
    code, _, _ = run_cli(cli_spec, argv)
    assert code in (0, 1, 2)


def test_the_real_command_answers_a_bad_value_without_a_traceback(cli_spec: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env.update(
        ACCELPLAT_PLATFORM="simulated",
        ACCELPLAT_SIMULATED_SPEC=str(cli_spec),
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run(
        [sys.executable, "-m", "accelplat", "wait", "--threshold-bytes", "$(reboot)"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "'$(reboot)'" in done.stderr  # the value is quoted back, never run
    assert "Traceback" not in done.stderr
