"""What a built-in backend declares, checked against what it uses.

A backend is its module and one row of ``accelplat._registry.BUILTINS``. The row names the
variables that shape what it finds (a capture records them, a replay applies them); its
``FEATURES`` rules answer the built-in capabilities. A name the rest of the package does not
know would be ignored silently, so these tests compare the two.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from accelplat._capabilities import _FEATURE_NAMES
from accelplat._platform import optional
from accelplat._registry import BUILTINS, Builtin, host_variables

PACKAGE = Path(__file__).resolve().parents[2] / "accelplat"

NOT_HOST_FACTS = frozenset({"ACCELPLAT_LEVEL_ZERO_LIB", "ACCELPLAT_SIMULATED_SPEC"})
"""Variables backends read that name a library or a user's file: no row declares them, so a
capture leaves them out and a replay never chooses them."""


def _class(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("row", BUILTINS, ids=lambda r: r.name)
def test_every_features_key_is_a_known_feature_name(row: Builtin) -> None:
    features = optional(_class(row.target), "FEATURES")
    assert set(features) <= set(_FEATURE_NAMES), "not a built-in feature name"


@pytest.mark.parametrize("row", BUILTINS, ids=lambda r: r.name)
def test_a_backends_visible_devices_variables_are_in_its_row(row: Builtin) -> None:
    cls = _class(row.target)
    used = {cls.visible_devices_env, *optional(cls, "visible_devices_shadowed_by")} - {None}
    assert used <= set(row.variables.split())


def _environment_names() -> set[str]:
    """Every ``ENV_* = "NAME"`` defined under ``_backends/`` and ``_visible/``."""
    found = set()
    for folder in ("_backends", "_visible"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Assign)
                    and any(getattr(t, "id", "").startswith("ENV_") for t in node.targets)
                    and isinstance(node.value, ast.Constant)
                ):
                    found.add(str(node.value.value))
    return found


def test_every_variable_a_backend_reads_is_declared_by_a_row_or_names_a_file() -> None:
    names = _environment_names()
    assert names, "the scan found no variable"
    assert names - set(host_variables()) == NOT_HOST_FACTS
