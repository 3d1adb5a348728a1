"""Numbers a vendor library (or a replay bundle standing in for one) answers as anything.

A replay bundle's records may hold NaN, infinities, text, ``null`` or nested values where NVML or
torch has integers; before, ``int()`` on them escaped as ``ValueError``/``OverflowError`` from
``memory_info`` and ``wait``. Every such answer is now a ``BackendError`` naming the figure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from accelplat._backends._common import never_raises, torch_reading, vendor_cards
from accelplat._backends.cuda import CudaPlatform
from accelplat._types import GIB, ProbeResult
from accelplat._util import clip
from accelplat._vendor import nvml as _nvml
from accelplat._vendor import vendor_int
from accelplat.errors import BackendError, ConfigurationError, ImplausibleReadingError
from tests.conftest import Install
from tests.fakes.nvml import FakeNvml, h200

NOT_INTEGERS: list[Any] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    1.5,
    -0.25,
    "1024",
    "",
    "nan",
    b"1024",
    None,
    True,
    False,
    [1024],
    {"value": 1024},
    (1, 2),
    1 + 2j,
    object(),
    "x" * 100_000,
]
INTEGERS: list[tuple[Any, int]] = [(0, 0), (7, 7), (2**70, 2**70), (-3, -3), (1024.0, 1024)]


@pytest.mark.parametrize("value", NOT_INTEGERS)
def test_vendor_int_refuses_every_non_integer(value: Any) -> None:
    with pytest.raises(BackendError) as err:
        vendor_int("cuda", "GPU 0", "free", value)
    message = str(err.value)
    assert "GPU 0: free is " in message
    assert "not an integer" in message
    assert len(message) < 200  # a 100 KB value is not echoed in full


@pytest.mark.parametrize(("value", "expected"), INTEGERS)
def test_vendor_int_keeps_integers(value: Any, expected: int) -> None:
    result = vendor_int("cuda", "GPU 0", "free", value)
    assert result == expected
    assert type(result) is int


def test_clip() -> None:
    assert clip("abc", 5) == "abc"
    assert clip("abcdefgh", 5) == "abcd…"


# -- NVML memory structures --------------------------------------------------------------------


class _Record:
    """What a replay decodes a recorded structure into: any fields, any values."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _answer(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, name: str, value: Any) -> None:
    good = {"free": 100 * GIB, "total": 141 * GIB, "used": 40 * GIB, "reserved": GIB}
    fields = {k: v for k, v in good.items() if k != name}
    if value is not _MISSING:
        fields[name] = value
    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", lambda h, version=None: _Record(**fields))


_MISSING = object()
FIELDS = ["free", "total", "used", "reserved"]


@pytest.mark.parametrize("value", [*NOT_INTEGERS, _MISSING])
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("struct", ["v2", "v1"])
def test_cuda_memory_refuses_a_malformed_nvml_field(
    install: Install, monkeypatch: pytest.MonkeyPatch, struct: str, field: str, value: Any
) -> None:
    fake = install(FakeNvml([h200(0)]))
    fake.memory_v2 = struct == "v2"
    p = CudaPlatform()
    if struct == "v1":
        p.memory_info(0)  # v2 is refused once; v1 from then on
        if field == "reserved":
            field = "used"  # v1 has no reserved
    _answer(fake, monkeypatch, field, value)
    with pytest.raises(BackendError) as err:
        p.memory_info(0)
    assert not isinstance(err.value, ImplausibleReadingError)
    assert "cuda device 0" in str(err.value)
    assert f"{field} is " in str(err.value)
    assert _nvml._state.active == 0
    monkeypatch.undo()  # the GPU answers again: nothing was remembered from the bad answer


@pytest.mark.parametrize("value", [1024.0, 2**40])
def test_cuda_memory_keeps_integral_figures(
    install: Install, monkeypatch: pytest.MonkeyPatch, value: Any
) -> None:
    fake = install(FakeNvml([h200(0)]))
    monkeypatch.setattr(
        fake,
        "nvmlDeviceGetMemoryInfo",
        lambda h, version=None: _Record(free=value, total=2**41, used=value, reserved=value),
    )
    info = CudaPlatform().memory_info(0)
    assert (info.free, info.total, info.reserved) == (int(value), 2**41 - int(value), int(value))


# -- counts NVML answers -----------------------------------------------------------------------

BAD_COUNTS: list[Any] = [*NOT_INTEGERS[:12], -1, 2**63, 10**18]


@pytest.mark.parametrize("count", BAD_COUNTS)
def test_a_malformed_gpu_count_is_an_error_not_a_crash_or_a_long_loop(
    install: Install, monkeypatch: pytest.MonkeyPatch, count: Any
) -> None:
    fake = install(FakeNvml([h200(0)]))
    monkeypatch.setattr(fake, "nvmlDeviceGetCount", lambda: count)
    with pytest.raises(BackendError, match="GPU count"):
        CudaPlatform().devices()
    result = CudaPlatform.probe()
    assert not result.available
    assert "GPU count" in result.reason


@pytest.mark.parametrize("slots", BAD_COUNTS)
def test_a_malformed_mig_slot_count_is_an_error(
    install: Install, monkeypatch: pytest.MonkeyPatch, slots: Any
) -> None:
    fake = install(FakeNvml([h200(0)]))
    monkeypatch.setattr(fake, "nvmlDeviceGetMigMode", lambda h: [1, 1])
    monkeypatch.setattr(fake, "nvmlDeviceGetMaxMigDeviceCount", lambda h: slots)
    with pytest.raises(BackendError, match="MIG device count"):
        CudaPlatform().devices()


@pytest.mark.parametrize("mode", NOT_INTEGERS[:12])
def test_a_malformed_mig_mode_is_an_error(
    install: Install, monkeypatch: pytest.MonkeyPatch, mode: Any
) -> None:
    fake = install(FakeNvml([h200(0)]))
    monkeypatch.setattr(fake, "nvmlDeviceGetMigMode", lambda h: [mode, mode])
    with pytest.raises(BackendError, match="MIG of GPU 0: the mode"):
        CudaPlatform().devices()


def test_a_long_visible_devices_value_is_clipped_in_the_probe_reason(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(FakeNvml([h200(0)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "9" * 100_000)
    result = CudaPlatform.probe()
    assert not result.available
    assert len(result.reason) < 1000


# -- torch's mem_get_info ----------------------------------------------------------------------


@pytest.mark.parametrize("value", NOT_INTEGERS)
@pytest.mark.parametrize("position", [0, 1])
def test_torch_reading_refuses_a_malformed_figure(value: Any, position: int) -> None:
    pair = [GIB, 2 * GIB]
    pair[position] = value
    with pytest.raises(BackendError) as err:
        torch_reading("xpu", lambda d: tuple(pair), 0, "torch.xpu (ctx)", "xpu device 0")
    assert not isinstance(err.value, ImplausibleReadingError)
    assert ("free" if position == 0 else "total") in str(err.value)


@pytest.mark.parametrize(
    "answer",
    [None, 5, "ab", (1,), (1, 2, 3), iter(()), {"free": 1}],
    ids=["none", "int", "text", "one", "three", "empty", "dict"],
)
def test_torch_reading_refuses_an_answer_that_is_not_a_pair(answer: Any) -> None:
    with pytest.raises(BackendError, match=r"memory query for device 3 failed|not an integer"):
        torch_reading("rocm", lambda d: answer, 3, "torch.cuda (ctx)", "GPU 3")


@pytest.mark.parametrize(
    "error", [RuntimeError("x" * 100_000), ValueError(), MemoryError(), KeyError(3)]
)
def test_torch_reading_turns_a_failing_call_into_a_backend_error(error: Exception) -> None:
    def fn(device: int) -> Any:
        raise error

    with pytest.raises(BackendError) as err:
        torch_reading("xpu", fn, 0, "torch.xpu (ctx)", "xpu device 0")
    assert "torch.xpu memory query for device 0 failed" in str(err.value)
    assert len(str(err.value)) < 1000


def test_torch_reading_judges_the_figures() -> None:
    info = torch_reading("xpu", lambda d: (GIB, 4 * GIB), 0, "torch.xpu (ctx)", "xpu device 0")
    assert (info.free, info.total, info.used, info.source) == (
        GIB,
        4 * GIB,
        3 * GIB,
        "torch.xpu (ctx)",
    )
    with pytest.raises(ImplausibleReadingError):
        torch_reading("xpu", lambda d: (4 * GIB, GIB), 0, "torch.xpu (ctx)", "xpu device 0")


# -- the probe wrapper -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (BackendError("rocm", "sysfs is gone"), "rocm: sysfs is gone"),
        (ConfigurationError("bad variable"), "bad variable"),
        (RuntimeError("driver exploded"), "probe failed: RuntimeError: driver exploded"),
        (KeyError("card0"), "probe failed: KeyError: 'card0'"),
        (RecursionError(), "probe failed: RecursionError: "),
        (MemoryError(), "probe failed: MemoryError: "),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "probe failed: UnicodeDecodeError"),
        (RuntimeError("y" * 100_000), "probe failed: RuntimeError: yyy"),
    ],
)
def test_never_raises_turns_every_error_into_an_unavailable_result(
    error: Exception, reason: str
) -> None:
    class Backend:
        @classmethod
        @never_raises
        def probe(cls) -> ProbeResult:
            raise error

    result = Backend.probe()
    assert not result.available
    assert result.reason.startswith(reason)
    assert len(result.reason) <= 2000


def test_never_raises_passes_a_result_through() -> None:
    class Backend:
        @classmethod
        @never_raises
        def probe(cls) -> ProbeResult:
            return ProbeResult(True, f"{cls.__name__} works")

    assert Backend.probe() == ProbeResult(True, "Backend works")


# -- the sysfs card scan -----------------------------------------------------------------------


def _card(drm: Path, name: str, vendor: str | None, *, slot: str | None = None) -> Path:
    device = drm / name / "device"
    device.mkdir(parents=True)
    if vendor is not None:
        (device / "vendor").write_text(vendor)
    if slot is not None:
        (device / "uevent").write_text(f"DRIVER=amdgpu\nPCI_SLOT_NAME={slot}\n")
    return device


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(4096)


def test_vendor_cards_keeps_only_the_vendors_cards_and_survives_odd_entries(tmp_path: Path) -> None:
    drm = tmp_path / "class" / "drm"
    _card(drm, "card0", "0x1002\n", slot="0000:03:00.0")
    _card(drm, "card1", "0x8086\n")
    _card(drm, "card2", "not hex")
    _card(drm, "card3", None)  # no vendor file
    _card(drm, "card4", "")
    _card(drm, "card5", "0x" + "f" * 4000)  # a huge number, not this vendor
    (_card(drm, "card6", None) / "vendor").mkdir()  # a directory where the file should be
    _card(drm, "card7", "0x1002", slot="garbage")  # no usable PCI address
    _card(drm, "card0-DP-1", "0x1002")  # a connector, not a card
    _card(drm, "renderD128", "0x1002")
    (drm / "card8").mkdir()  # no device directory at all
    os.mkfifo(drm / "card8" / "fifo")
    cards, note = vendor_cards(drm, 0x1002, _read)
    assert note == ""
    assert [(entry, pci) for entry, _, pci in cards] == [("card0", "0000:03:00.0"), ("card7", None)]
    assert cards[0][1] == drm / "card0" / "device"


def test_vendor_cards_reads_the_address_from_the_device_link(tmp_path: Path) -> None:
    drm = tmp_path / "drm"
    drm.mkdir()
    target = tmp_path / "devices" / "0000:3b:00.0"
    target.mkdir(parents=True)
    (target / "vendor").write_text("0x8086\n")
    (drm / "card0").mkdir()
    (drm / "card0" / "device").symlink_to(target)
    cards, _ = vendor_cards(drm, 0x8086, _read)
    assert [pci for _, _, pci in cards] == ["0000:3b:00.0"]


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_vendor_cards_says_why_a_drm_directory_cannot_be_listed(tmp_path: Path, kind: str) -> None:
    drm = tmp_path / "drm"
    if kind == "file":
        drm.write_text("")
    cards, note = vendor_cards(drm, 0x1002, _read)
    assert cards == []
    assert str(drm) in note
