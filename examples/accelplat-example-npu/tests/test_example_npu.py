"""The example plugin's own tests: unit tests plus accelplat's conformance kit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from accelplat_example_npu import ExampleNpuPlatform

import accelplat
import accelplat.errors
from accelplat.testing import make_conformance_test

GIB = 1024**3


@pytest.fixture(autouse=True, scope="module")
def _devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("npu") / "npu.json"
    path.write_text(
        json.dumps(
            {
                "devices": [
                    {
                        "name": "Example NPU 16G",
                        "total": 16 * GIB,
                        "used": GIB,
                        "reserved": GIB // 4,
                    },
                    {"name": "Example NPU 16G", "total": 16 * GIB, "used": 0},
                    {"name": "Example NPU 32G", "total": 32 * GIB, "used": 2 * GIB},
                ]
            }
        )
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("EXAMPLE_NPU_CONFIG", str(path))
    mp.delenv("EXAMPLE_NPU_VISIBLE_DEVICES", raising=False)
    yield path
    mp.undo()


def test_visible_devices_select_and_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_NPU_VISIBLE_DEVICES", "2,0")
    p = ExampleNpuPlatform()
    assert [d.physical_index for d in p.devices()] == [2, 0]
    assert p.memory_info(0).total == 32 * GIB


def test_bad_visible_value_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_NPU_VISIBLE_DEVICES", "0,0")
    with pytest.raises(accelplat.errors.ConfigurationError, match="twice"):
        ExampleNpuPlatform().device_count()
    assert not ExampleNpuPlatform.probe().available


# Every conformance check becomes one test of this module. The tests run after the autouse
# fixture above has described the devices; the three devices let the kit check that hiding
# devices with EXAMPLE_NPU_VISIBLE_DEVICES works (and, as the class declares
# visible_devices_empty_hides_all, that an empty value hides all of them).
test_conformance = make_conformance_test(ExampleNpuPlatform)
