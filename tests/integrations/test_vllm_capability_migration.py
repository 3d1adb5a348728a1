"""The vLLM migration tool (tools/vllm_capabilities): the translator, the rewrite, the proof."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from accelplat import _translate as translate

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "vllm_capabilities"


@pytest.fixture(scope="module")
def migrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_capabilities_migrate", TOOLS / "migrate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SOURCE = """\"\"\"A vLLM-style test file.\"\"\"

from __future__ import annotations

import pytest
import torch
from vllm.platforms import current_platform

if not (current_platform.is_cuda() or current_platform.is_xpu()):
    pytest.skip("CUDA or XPU only", allow_module_level=True)

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda_alike(),
    reason="needs a CUDA/ROCm device",
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="requires CUDA")  # keep this comment
@pytest.mark.parametrize("n", [1, 2])
def test_a(n, dtype):
    if current_platform.is_rocm() and dtype == "fp8":
        pytest.skip("runtime skips keep their other parts")


@pytest.mark.skipif(
    not (current_platform.is_rocm() and current_platform.supports_fp8()),
    reason="only test for rocm fp8",
)
@pytest.mark.skipif(current_platform.is_cpu(), reason="CPU only")
@pytest.mark.skipif(current_platform.get_device_capability() < (9, 0), reason="unguarded")
def test_b():
    atol = 1e-2 if current_platform.is_rocm() else 1e-3
"""

EXPECTED = """\"\"\"A vLLM-style test file.\"\"\"

from __future__ import annotations

import accelplat.testing  # migrated to accelplat requirements
import pytest
import torch
from vllm.platforms import current_platform

accelplat.testing.skip_module_unless("cuda or xpu", reason='CUDA or XPU only')

pytestmark = accelplat.testing.requires("cuda or rocm", reason='needs a CUDA/ROCm device')


@accelplat.testing.requires("cuda-api", reason='requires CUDA')  # keep this comment
@pytest.mark.parametrize("n", [1, 2])
def test_a(n, dtype):
    if accelplat.has("rocm") and dtype == "fp8":
        pytest.skip("runtime skips keep their other parts")


@accelplat.testing.requires("rocm and fp8", reason='only test for rocm fp8')
@accelplat.testing.requires("not cpu", reason='CPU only')
@pytest.mark.skipif(current_platform.get_device_capability() < (9, 0), reason="unguarded")
def test_b():
    atol = 1e-2 if current_platform.is_rocm() else 1e-3
"""


def test_skip_conditions_become_requirements_and_nothing_else_changes(
    migrate: ModuleType,
) -> None:
    new, count = migrate.rewrite(SOURCE)
    assert new == EXPECTED
    assert count == 6
    assert migrate.rewrite(new) == (new, 0)  # idempotent: nothing platform-shaped is left


def test_no_capability_table_is_needed() -> None:
    assert not (TOOLS / "capabilities.toml").exists()


@pytest.mark.parametrize(
    ("condition", "run_if"),
    [
        ("not current_platform.is_cuda()", "cuda"),
        ("current_platform.is_rocm()", "not rocm"),
        ("not current_platform.is_cuda_alike()", "cuda or rocm"),  # vLLM's platform
        ("not torch.cuda.is_available()", "cuda-api"),  # torch's: the GPU, whatever vLLM picks
        ("not (current_platform.is_cuda() or current_platform.is_xpu())", "cuda or xpu"),
        ("current_platform.is_cpu()", "not cpu"),
        ("not current_platform.has_device_capability(90)", "capability>=90"),
        ("not current_platform.has_device_capability((8, 9))", "capability>=89"),
        ("not current_platform.is_device_capability(100)", "capability==100"),
        ("not current_platform.is_device_capability_family(100)", "capability==10x"),
        ("not current_platform.supports_fp8()", "fp8"),  # vLLM's fp8, emulated included
        ("not current_platform.is_fp8_fnuz()", "fp8-fnuz"),
        ("not on_gfx9()", "gfx90a or gfx942 or gfx950"),
        ("not on_gfx1x()", "(gfx11* or gfx12*) and not gfx1250"),
        ("not current_platform.supports_mx()", "rocm and (gfx95* or gfx1250)"),
        ("not current_platform.support_static_graph_mode()", "cuda or rocm or xpu"),
        (
            "not (current_platform.is_xpu() or (current_platform.is_cuda() "
            "and current_platform.has_device_capability(90)))",
            "xpu or (cuda and capability>=90)",
        ),
        # a capability compared only where the platform guarantees one
        (
            "not current_platform.is_cuda() or torch.cuda.get_device_capability() < (8, 9)",
            "cuda and not capability<89",
        ),
        (
            "current_platform.is_cuda() and torch.cuda.get_device_capability()[0] != 9",
            "not cuda or capability==9x",
        ),
        # a comparison is never flipped: not capability>=90 holds on a CPU, capability<90 not
        ("current_platform.has_device_capability(90)", "not capability>=90"),
    ],
)
def test_translation_is_exact(condition: str, run_if: str) -> None:
    assert translate.translate(ast.parse(f"not ({condition})", mode="eval").body) == run_if


@pytest.mark.parametrize(
    ("condition", "kind"),
    [
        ("current_platform.get_device_capability() < (9, 0)", translate.CAPABILITY_VALUE),
        ("current_platform.has_device_capability(cap)", translate.CAPABILITY_VALUE),
        # torch's number, not vLLM's platform's: none there under VLLM_TARGET_DEVICE=cpu
        (
            "not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9)",
            translate.CAPABILITY_VALUE,
        ),
        ("current_platform.fp8_dtype() == torch.float8_e4m3fnuz", translate.FP8_DTYPE_VALUE),
        ("torch.version.hip is not None", translate.TORCH_BUILD),
        ('hasattr(torch, "xpu")', translate.TORCH_BUILD),  # true in every torch since 2.4
        ("not has_flashinfer()", translate.LIBRARY_PROBE),
        ("HAS_TRITON", translate.LIBRARY_PROBE),
        ("NvmlCudaPlatform.is_cuda()", translate.NOT_A_PLATFORM),
        ("dtype == torch.float8_e4m3fn", translate.NOT_A_PLATFORM),
    ],
)
def test_no_guess_where_the_meaning_differs(condition: str, kind: str) -> None:
    with pytest.raises(translate.UnexpressibleError) as caught:
        translate.translate(ast.parse(condition, mode="eval").body)
    assert caught.value.kind == kind


@pytest.fixture(scope="module")
def prove() -> ModuleType:
    sys.path.insert(0, str(TOOLS))
    try:
        return _load("vllm_capabilities_prove", "prove.py")
    finally:
        sys.path.remove(str(TOOLS))


def _load(name: str, file: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TOOLS / file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TREE = {
    "kernels/test_fp8.py": SOURCE,
    "kernels/test_rocm.py": """
import pytest
from vllm.platforms import current_platform
from vllm.platforms.rocm import on_gfx9, on_mi3xx

@pytest.mark.skipif(not current_platform.supports_fp8(), reason="fp8")
@pytest.mark.skipif(not (current_platform.is_rocm() and on_mi3xx()), reason="MI300")
@pytest.mark.skipif(not current_platform.is_fp8_fnuz(), reason="fnuz")
@pytest.mark.skipif(current_platform.is_device_capability_family(100), reason="not sm_10x")
def test_x():
    if on_gfx9() or current_platform.is_xpu():
        pytest.skip("not here")
""",
    "test_cpu.py": """
import pytest
from vllm.platforms import current_platform

if not current_platform.is_cpu():
    pytest.skip("CPU only", allow_module_level=True)
""",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name, text in TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_proof_finds_no_change_on_any_modelled_host(prove: ModuleType, tree: Path) -> None:
    figures = prove.prove(tree)
    assert len(figures["hosts"]) >= 10
    assert figures["decision_changes"] == 0, figures["examples"]
    assert figures["unmodelled"] == []
    assert figures["migration_mismatched_files"] == []
    assert figures["scan_precision_pct"] == 100.0
    assert figures["conditions_checked"] == 12
    assert 0 < figures["platform_replaceable_builtin"] < figures["platform_predicates"]


def test_the_proof_catches_a_wrong_meaning(
    prove: ModuleType, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the old migration's mistake: vLLM's supports_fp8() read as native fp8 hardware
    monkeypatch.setitem(translate._PLATFORM_METHODS, "supports_fp8", "fp8-native")
    figures = prove.prove(tree)
    changed = figures["decision_changes_by_host"]
    assert set(changed) == {"amd-gfx90a", "amd-gfx1100", "intel-max", "intel-bmg"}
    assert figures["scan_precision_pct"] < 100


def test_the_host_model_agrees_with_the_recorded_h200(prove: ModuleType) -> None:
    facts = json.loads((TOOLS / "h200-facts.json").read_text())
    host = next(h for h in prove.modelled.HOSTS if h.name == "nvidia-sm90")
    assert tuple(facts["torch"]["devices"][0]["capability"]) == host.nvml_capability
    assert facts["accelplat"]["devices"][0]["arch"] == host.arch


@pytest.mark.parametrize(
    ("gcn_arch", "number"),
    [
        ("gfx90a:sramecc+:xnack-", (9, 0)),
        ("gfx942:sramecc+:xnack-", (9, 4)),
        ("gfx950", (9, 5)),
        ("gfx1100", (11, 0)),
        ("gfx1151", (11, 5)),
        ("gfx1201", (12, 0)),
        ("sm_90", None),  # not a gfx string: vLLM falls back to torch
    ],
)
def test_the_vllm_model_derives_rocm_numbers_as_vllm_does(
    prove: ModuleType, gcn_arch: str, number: tuple[int, int] | None
) -> None:
    assert prove.gcn_capability(gcn_arch) == number


@pytest.mark.parametrize("gcn_arch", ["gfx8", "gfx803", "gfx13000", "gfx1300"])
def test_the_vllm_model_raises_where_vllm_does(prove: ModuleType, gcn_arch: str) -> None:
    with pytest.raises(ValueError, match=gcn_arch):
        prove.gcn_capability(gcn_arch)
