"""``CUDA_VISIBLE_DEVICES`` against a reference model of CUDA's rules, written from the rules
alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelplat._visible.cuda import (
    GpuRecord,
    MigRecord,
    parse_cuda_visible_devices,
    resolve_cuda_visible_devices,
)
from tests._hostile import LONG_DIGITS

# =============================================================================================
# CUDA_VISIBLE_DEVICES against a reference model
# =============================================================================================


@dataclass(frozen=True)
class ModelGpu:
    """A GPU as the reference model sees it: UUID, MIG mode, MIG devices (uuid, gi, ci)."""

    uuid: str
    mig_enabled: bool = False
    migs: tuple[tuple[str, int, int], ...] = ()


_C_SPACE = " \t\n\r\v\f"  # what C's isspace() accepts in the "C" locale
_STRTOUL = re.compile(r"[ \t\n\r\v\f]*([+-]?)([0-9]+)")
_HEX = "0123456789abcdefABCDEF"


def _hex_digits(text: str) -> str | None:
    """The UUID digits CUDA reads from ``text``: hex in either case, dashes skipped, 32 at most."""
    digits = ""
    for char in text:
        if len(digits) == 32:
            return digits
        if char == "-":
            continue
        if char not in _HEX:
            return None
        digits += char.lower()
    return digits or None


def _uuid_key(uuid: str) -> str:
    """``GPU-89ab-CD…`` → ``89abcd…``: a table UUID's digits, for prefix matching."""
    return uuid[4:].replace("-", "").lower()


def _unique(digits: str, uuids: list[str]) -> str | None:
    hits = [u for u in uuids if _uuid_key(u).startswith(digits)]
    return hits[0] if len(hits) == 1 else None


def _model_lookup(entry: str, uuid_list: bool, gpus: list[ModelGpu]) -> str | None:
    """The device one entry names, or ``None`` when the entry is invalid."""
    if not uuid_list:
        m = _STRTOUL.match(entry)  # strtoul: white space, a sign, digits; the rest is ignored
        if m is None:
            return None
        value = min(int(m.group(2)), 2**64 - 1)  # an overflow is ULONG_MAX
        if m.group(1) == "-":
            value = -value % 2**64  # unsigned negation
        value &= 2**32 - 1  # the driver keeps the low 32 bits, as an int
        return gpus[value].uuid if value < min(len(gpus), 2**31) else None
    gpu_uuids = [g.uuid for g in gpus]
    if entry.startswith("GPU-"):
        digits = _hex_digits(entry[4:])
        return None if digits is None else _unique(digits, gpu_uuids)
    if not entry.startswith("MIG-"):
        return None
    rest = entry[4:]
    if rest.startswith("GPU-") and "/" in rest:  # MIG-GPU-<uuid>/<gi>/<ci>
        parts = rest.split("/")
        if len(parts) != 3 or not all(p and p.isascii() and p.isdigit() for p in parts[1:]):
            return None
        digits = _hex_digits(parts[0][4:])
        parent = None if digits is None else _unique(digits, gpu_uuids)
        if parent is None:
            return None
        wanted = (int(parts[1]), int(parts[2]))
        gpu = next(g for g in gpus if g.uuid == parent)
        return next((u for u, gi, ci in gpu.migs if (gi, ci) == wanted), None)
    digits = _hex_digits(rest)  # MIG- digits name a MIG device or a GPU (driver 580)
    named = [u for g in gpus for u, _, _ in g.migs] + gpu_uuids
    return None if digits is None else _unique(digits, named)


def cuda_reference(text: str | None, gpus: list[ModelGpu]) -> list[str]:
    """UUIDs CUDA makes visible, in order, from the documented (and recorded) rules alone.

    Unset: every GPU. Otherwise the text is split at commas; the first entry decides whether
    the list holds ordinals (read as ``strtoul`` reads them, then cut to a 32-bit int) or UUIDs
    (``GPU-``/``MIG-`` then hex digits of any case, dashes skipped, an unambiguous abbreviation
    allowed); the first invalid entry ends the list; naming one device twice hides everything.
    A process sees at most one MIG device: the first one named, else the first MIG device of
    the first named GPU in MIG mode; a GPU in MIG mode without MIG devices shows nothing.
    """
    if text is None:
        named = [g.uuid for g in gpus]
    else:
        entries = text.split(",")
        uuid_list = entries[0].startswith(("GPU-", "MIG-"))
        named = []
        for entry in entries:
            device = _model_lookup(entry, uuid_list, gpus)
            if device is None:
                break
            if device in named:
                return []
            named.append(device)
    mig_uuids = {u for g in gpus for u, _, _ in g.migs}
    named_migs = [d for d in named if d in mig_uuids]
    if named_migs:
        return named_migs[:1]
    by_uuid = {g.uuid: g for g in gpus}
    for uuid in named:
        gpu = by_uuid[uuid]
        if gpu.mig_enabled and gpu.migs:
            return [gpu.migs[0][0]]
    return [u for u in named if not by_uuid[u].mig_enabled]


def _records(gpus: list[ModelGpu]) -> list[GpuRecord]:
    return [
        GpuRecord(i, g.uuid, g.mig_enabled, tuple(MigRecord(u, gi, ci) for u, gi, ci in g.migs))
        for i, g in enumerate(gpus)
    ]


@st.composite
def _uuid(draw: st.DrawFn, head: str) -> str:
    """A UUID as NVML prints it; short ones over two letters, so prefixes are often ambiguous."""
    if draw(st.integers(0, 3)) == 0:
        d = draw(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32))
        return f"{head}{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}"
    body = draw(st.text(alphabet="ab", min_size=1, max_size=4))
    return f"{head}{body[:2]}-{body[2:]}" if len(body) > 2 else head + body


@st.composite
def machines(draw: st.DrawFn) -> list[ModelGpu]:
    gpu_uuids = draw(st.lists(_uuid("GPU-"), max_size=4, unique_by=_uuid_key))
    mig_uuids = iter(draw(st.lists(_uuid("MIG-"), min_size=8, max_size=8, unique_by=_uuid_key)))
    gpus = []
    for uuid in gpu_uuids:
        mig_enabled = draw(st.booleans())
        migs: list[tuple[str, int, int]] = []
        if mig_enabled:
            for gi in range(draw(st.integers(0, 2))):
                migs.append((next(mig_uuids), gi + 1, draw(st.integers(0, 1))))
        gpus.append(ModelGpu(uuid, mig_enabled, tuple(migs)))
    return gpus


@st.composite
def _spelling(draw: st.DrawFn, uuid: str) -> str:
    """``uuid`` as a user might write it: cut short, upper-cased, dashes moved, junk after."""
    head, body = uuid[:4], uuid[4:]
    cut = body[: draw(st.integers(0, len(body)))]
    if draw(st.booleans()):
        cut = cut.upper()
    if draw(st.booleans()):
        cut = cut.replace("-", "")
        if cut and draw(st.booleans()):
            cut = f"-{cut[:1]}-{cut[1:]}"
    tail = draw(st.sampled_from(["", "", "", "x", "-zz", " ", "/1"]))
    return head + cut + tail


@st.composite
def cuda_entries(draw: st.DrawFn, gpus: list[ModelGpu]) -> str:
    """One entry: an ordinal, a (prefix of a) GPU or MIG UUID, a legacy MIG name, or junk."""
    kind = draw(st.sampled_from(["ordinal", "gpu", "mig", "legacy", "junk"]))
    migs = [u for g in gpus for u, _, _ in g.migs]
    if kind == "ordinal":
        pad = draw(st.sampled_from(["", "", " ", "\t", "\n "]))
        sign = draw(st.sampled_from(["", "", "+", "-"]))
        tail = draw(st.sampled_from(["", "", "abc", ".5", "x1", " 1", "0", " "]))
        return f"{pad}{sign}{draw(st.integers(0, 5))}{tail}"
    if kind == "gpu" and gpus:
        return draw(_spelling(draw(st.sampled_from(gpus)).uuid))
    if kind == "mig" and migs:
        return draw(_spelling(draw(st.sampled_from(migs))))
    if kind == "legacy" and gpus:
        gpu = draw(_spelling(draw(st.sampled_from(gpus)).uuid))
        gi, ci = draw(st.integers(0, 3)), draw(st.integers(0, 1))
        return draw(st.sampled_from([f"MIG-{gpu}/{gi}/{ci}", f"MIG-{gpu}/{gi}", f"MIG-{gpu}"]))
    return draw(
        st.sampled_from(
            ["", " ", "NoDevFiles", "GPU-", "MIG-", " GPU-a", "gpu-a", "-1", "+", "0x1", "\u0661"]
        )
    )


@st.composite
def machine_and_text(draw: st.DrawFn) -> tuple[list[ModelGpu], str | None]:
    gpus = draw(machines())
    if draw(st.integers(0, 9)) == 0:
        return gpus, None
    entries = draw(st.lists(cuda_entries(gpus), min_size=1, max_size=5))
    return gpus, ",".join(entries)


@settings(max_examples=400, deadline=None)
@given(machine_and_text())
def test_cuda_visible_devices_matches_the_reference_model(
    case: tuple[list[ModelGpu], str | None],
) -> None:
    gpus, text = case
    got = [t.uuid for t in resolve_cuda_visible_devices(text, _records(gpus)).targets]
    assert got == cuda_reference(text, gpus)


def test_the_reference_model_itself_on_the_documented_examples() -> None:
    plain = [ModelGpu("GPU-aa11"), ModelGpu("GPU-aa22"), ModelGpu("GPU-bb33")]
    assert cuda_reference(None, plain) == ["GPU-aa11", "GPU-aa22", "GPU-bb33"]
    assert cuda_reference("", plain) == []
    assert cuda_reference("NoDevFiles", plain) == []
    assert cuda_reference("2,0", plain) == ["GPU-bb33", "GPU-aa11"]
    assert cuda_reference("1abc, 0", plain) == ["GPU-aa22", "GPU-aa11"]
    assert cuda_reference("0,7,1", plain) == ["GPU-aa11"]  # 7 ends the list
    assert cuda_reference("0,1,0", plain) == []  # a duplicate hides everything
    assert cuda_reference("0,x,0", plain) == ["GPU-aa11"]  # ... unless the list ended first
    assert cuda_reference("GPU-aa", plain) == []  # ambiguous abbreviation
    assert cuda_reference("GPU-", plain) == []  # no digit at all
    assert cuda_reference(" GPU-bb", plain) == []  # white space makes it an ordinal list
    assert cuda_reference("GPU-B,GPU-a-a1", plain) == ["GPU-bb33", "GPU-aa11"]
    assert cuda_reference("GPU-aa1,1", plain) == ["GPU-aa11"]  # an ordinal in a UUID list
    assert cuda_reference("GPU-aa11,GPU-aa1", plain) == []  # one GPU, two spellings
    full = [ModelGpu("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6")]
    assert cuda_reference("GPU-8932F937D72C4106C12F20BD9FAED9F6 trailing", full) == [full[0].uuid]
    assert cuda_reference("GPU-8932f937 trailing", full) == []
    mig = [ModelGpu("GPU-cc", True, (("MIG-d1", 1, 0), ("MIG-d2", 2, 0))), *plain]
    assert cuda_reference(None, mig) == ["MIG-d1"]
    assert cuda_reference("1,0", mig) == ["MIG-d1"]
    assert cuda_reference("MIG-GPU-cc/2/0", mig) == ["MIG-d2"]
    assert cuda_reference("GPU-bb,MIG-d2,MIG-d1", mig) == ["MIG-d2"]
    assert cuda_reference("MIG-d2,MIG-GPU-cc/2/0", mig) == []


@pytest.mark.parametrize("text", [LONG_DIGITS, f"0,{LONG_DIGITS}", f"MIG-GPU-aa/{LONG_DIGITS}/0"])
def test_cuda_visible_devices_with_a_very_long_number(text: str) -> None:
    gpus = [ModelGpu("GPU-aa11"), ModelGpu("GPU-aa22")]
    parse_cuda_visible_devices(text)
    got = [t.uuid for t in resolve_cuda_visible_devices(text, _records(gpus)).targets]
    assert got == (["GPU-aa11"] if text.startswith("0,") else [])
