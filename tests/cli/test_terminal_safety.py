"""What reaches a terminal or a JSON reader is what we meant to write.

Three classes: text from devices, drivers and other processes is shown with its control
characters escaped (device names, holder names, error messages, in every text output); a vendor
module that prints while it is imported cannot reach standard output (every vendor import goes
through one shield); a malformed process entry from a driver is a typed error.
"""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelplat import _registry as registry
from accelplat._backends.cuda import CudaPlatform
from accelplat._cli import main
from accelplat._types import GIB
from accelplat._util import printable
from accelplat._vendor import nvml as _nvml
from accelplat.errors import BackendError
from tests.conftest import Install
from tests.fakes.nvml import FakeGpu, FakeNvml, h200, nvmlFriendlyObject

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = [
    "\x1b]0;owned\x07",  # retitle the terminal
    "\x1b[2J\x1b[H",  # clear the screen
    "\x9b31m",  # C1 CSI
    "abc\u202edcba",  # right-to-left override
    "line\nfake: line",  # a forged extra line
    "bell\x07\x08\x7f",
    "\u2028sep",
]


@given(st.text())
def test_printable_output_is_always_printable(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    if text.isprintable():
        assert shown == text
    multi = printable(text, keep_newlines=True)
    assert all(line.isprintable() for line in multi.split("\n"))
    assert multi.count("\n") == text.count("\n")


@pytest.mark.parametrize("evil", HOSTILE)
def test_printable_escapes_like_repr(evil: str) -> None:
    shown = printable(evil)
    assert "\x1b" not in shown
    assert "\n" not in shown
    for char in evil:
        if not char.isprintable():
            code = ord(char)
            assert (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}") in shown


def _no_raw_controls(text: str) -> None:
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)


@pytest.fixture
def hostile_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spec = {
        "clock": "virtual",
        "devices": [
            {
                "name": "".join(HOSTILE),
                "total": "8GiB",
                "used": "2GiB",
                "holders": [{"used": "4GiB", "pid": 4242, "name": "evil\x1b[2Jname"}],
            }
        ],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    for name in [n for n in list(__import__("os").environ) if n.startswith("ACCELPLAT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(path))
    monkeypatch.setenv("COLUMNS", "200")  # the plain table fits the width: the name stays whole
    registry.set_current_platform(None)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["info"], id="info"),
        pytest.param(["stats"], id="stats"),
        pytest.param(["stats", "--holders"], id="stats-holders"),
        pytest.param(["wait", "--threshold-ratio", "0.1", "--timeout", "1"], id="wait-timeout"),
        pytest.param(["wait", "--threshold-ratio", "0.1", "--devices", "3"], id="error-message"),
    ],
)
def test_text_output_escapes_what_devices_and_processes_say(
    hostile_spec: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    main(argv)
    out, err = capsys.readouterr()
    _no_raw_controls(out)
    _no_raw_controls(err)
    if argv[0] in ("info", "stats"):
        assert "\\x1b]0;owned\\x07" in out  # shown, escaped
        assert "\\u202e" in out


def test_json_output_keeps_the_raw_name(
    hostile_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["stats", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"][0]["name"] == "".join(HOSTILE)  # JSON escapes it itself


# -- every vendor import goes through the shield -------------------------------------------------

VENDOR_MODULES = {"pynvml", "amdsmi", "torch", "intel_extension_for_pytorch"}


def test_no_vendor_module_is_imported_outside_the_shield() -> None:
    offenders = []
    for path in sorted((ROOT / "accelplat").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names = [str(node.args[0].value).split(".")[0]]
            if VENDOR_MODULES & set(names) and not _type_checking_only(tree, node):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def _type_checking_only(tree: ast.AST, target: ast.AST) -> bool:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
        ) and any(child is target for child in ast.walk(node)):
            return True
    return False


@pytest.fixture
def printing_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(name: str, body: str = "") -> None:
        (tmp_path / f"{name}.py").write_text(
            f"print('{name} says hello on import')\nimport sys\nsys.stdout.write('more\\n')\n"
            + body
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, name, raising=False)

    return make


def test_a_pynvml_that_prints_on_import_is_silenced(
    printing_module: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    printing_module("pynvml", "def nvmlInit():\n    pass\n")
    module = _nvml._import_live()
    assert module.__name__ == "pynvml"
    assert capsys.readouterr().out == ""


def test_an_amdsmi_that_prints_and_fails_is_silenced_and_quoted(
    printing_module: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelplat._backends.rocm import _sources as rocm

    printing_module("amdsmi", "raise KeyError('libamd_smi.so')\n")
    module, why = rocm._import_amdsmi_live()
    assert module is None
    assert "amdsmi says hello" in why
    assert capsys.readouterr().out == ""


def test_a_plugin_that_prints_on_import_is_silenced(
    printing_module: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    printing_module("loud_plugin", "class Platform:\n    pass\n")
    entry = registry._Entry("loud", "test", registry.Builtin("loud", "loud_plugin:Platform"))
    assert registry._load(entry).__name__ == "Platform"
    assert capsys.readouterr().out == ""


# -- a malformed process entry from a driver ----------------------------------------------------

MALFORMED = [
    pytest.param({"pid": None, "usedGpuMemory": GIB}, "pid", id="pid-none"),
    pytest.param({"pid": -3, "usedGpuMemory": GIB}, "pid", id="pid-negative"),
    pytest.param({"pid": "1234", "usedGpuMemory": GIB}, "pid", id="pid-text"),
    pytest.param({"pid": 2**40, "usedGpuMemory": GIB}, "pid", id="pid-huge"),
    pytest.param({"usedGpuMemory": GIB}, "pid", id="pid-missing"),
    pytest.param({"pid": 77, "usedGpuMemory": -5}, "used memory", id="used-negative"),
    pytest.param({"pid": 77, "usedGpuMemory": 2**64 - 4096}, "used memory", id="used-wrapped"),
    pytest.param({"pid": 77, "usedGpuMemory": 1.5}, "used memory", id="used-float"),
]


@pytest.mark.parametrize(("fields", "what"), MALFORMED)
def test_a_malformed_process_entry_is_a_typed_error(
    install: Install,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any],
    what: str,
) -> None:
    fake = install(FakeNvml([h200(0, used=GIB)]))
    entry = nvmlFriendlyObject(fields)
    monkeypatch.setattr(fake, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [entry])
    with pytest.raises(BackendError) as err:
        CudaPlatform().memory_holders(0)
    assert err.value.vendor_error == "malformed process entry"
    assert what in str(err.value)
    for name in [n for n in list(__import__("os").environ) if n.startswith("ACCELPLAT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cuda")
    registry.set_current_platform(None)
    # Holders are a diagnosis: a table still shows, saying they are unknown.
    assert main(["stats", "--holders"]) == 0
    out, err = capsys.readouterr()
    assert "holders unknown" in out
    assert "Traceback" not in err


def test_nvml_value_not_available_means_unknown_usage(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(FakeNvml([FakeGpu("NVIDIA H200", "GPU-1", "00000000:18:00.0")]))
    entry = nvmlFriendlyObject({"pid": 77, "usedGpuMemory": 2**64 - 1})
    monkeypatch.setattr(fake, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [entry])
    (holder,) = CudaPlatform().memory_holders(0) or ()
    assert (holder.pid, holder.used_bytes) == (77, None)


def test_module_object_is_not_a_list(install: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(FakeNvml([h200(0)]))
    monkeypatch.setattr(fake, "nvmlDeviceGetComputeRunningProcesses", lambda h: types)
    with pytest.raises(BackendError, match="malformed process"):
        CudaPlatform().memory_holders(0)
