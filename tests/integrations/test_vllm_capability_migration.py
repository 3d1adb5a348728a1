"""The vLLM test migration tool (tools/vllm_capabilities): rewrite rules and their data."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from accelplat import _capabilities as caps

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


@pytest.fixture
def table() -> Iterator[dict[str, caps.ProjectCapability]]:
    caps.clear_project_capabilities()
    caps.load_pyproject(TOOLS / "capabilities.toml")
    yield caps.project_capabilities()
    caps.clear_project_capabilities()


SOURCE = """import pytest
import torch
from vllm.platforms import current_platform

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda_alike(),
    reason="needs a CUDA/ROCm device",
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="requires CUDA")  # keep this comment
@pytest.mark.parametrize("n", [1, 2])
def test_a(n):
    if current_platform.is_rocm():
        pytest.skip("runtime skips stay")


@pytest.mark.skipif(
    not (current_platform.is_rocm() and current_platform.supports_fp8()),
    reason="only test for rocm fp8",
)
@pytest.mark.skipif(current_platform.is_rocm(), reason="Xformers backend is not supported on ROCm.")
@pytest.mark.skipif(current_platform.is_rocm(), reason="some other reason")
def test_b():
    pass
"""

EXPECTED = """import pytest
import torch
from vllm.platforms import current_platform

pytestmark = pytest.mark.accelplat_requires("cuda-api")


@pytest.mark.accelplat_requires("cuda-api")  # keep this comment
@pytest.mark.parametrize("n", [1, 2])
def test_a(n):
    if current_platform.is_rocm():
        pytest.skip("runtime skips stay")


@pytest.mark.accelplat_requires("rocm-kernels", "fp8")
@pytest.mark.accelplat_requires("xformers")
@pytest.mark.skipif(current_platform.is_rocm(), reason="some other reason")
def test_b():
    pass
"""


def test_only_recognised_skip_conditions_change(migrate: ModuleType) -> None:
    new, count = migrate.rewrite(SOURCE)
    assert count == 4
    assert new == EXPECTED
    assert migrate.rewrite(new) == (new, 0)  # idempotent


def test_every_requirement_the_rules_name_is_defined(
    migrate: ModuleType, table: dict[str, caps.ProjectCapability]
) -> None:
    named = {n for needs in migrate.RULES.values() for n in needs}
    named |= set(migrate.SKIP_ON_ROCM.values())
    assert named <= set(caps.known_names())
    assert not set(table) - named, "a table entry no rule uses"


def test_recorded_h200_run_agrees_rule_by_rule(migrate: ModuleType) -> None:
    facts = json.loads((TOOLS / "h200-facts.json").read_text())
    assert facts["torch"]["devices"][0]["capability"] == [9, 0]
    assert facts["accelplat"]["devices"][0]["arch"] == "sm_90"
    rows = facts["rules"]
    assert len(rows) == len(migrate.RULES) + len(migrate.SKIP_ON_ROCM)
    assert all(r["skip_before"] == r["skip_after"] for r in rows)
    assert facts["rules_equal"] is True
