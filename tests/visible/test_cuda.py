"""CUDA_VISIBLE_DEVICES parsing and matching, as pure functions (no NVML, no environment)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelplat._visible.cuda import (
    CudaVisibleSpec,
    EntryKind,
    GpuRecord,
    MigRecord,
    VisibleTarget,
    is_pci_bus_order,
    parse_cuda_visible_devices,
    resolve_cuda_visible_devices,
    uuid_digits,
)

U0 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
U1 = "GPU-8932f9aa-1111-2222-3333-444444444444"  # shares "GPU-8932f9" with U0
U2 = "GPU-c0d51234-5555-6666-7777-888888888888"
U3 = "GPU-af7b61d8-9999-aaaa-bbbb-cccccccccccc"
FOUR = [GpuRecord(i, u) for i, u in enumerate([U0, U1, U2, U3])]

M0 = "MIG-d184f67c-c95f-5ef2-a935-195bd0094fbd"
M1 = "MIG-37b51284-1df4-5451-979d-3231ccb0822e"
M2 = "MIG-37b5aaaa-0000-0000-0000-000000000000"  # shares "MIG-37b5" with M1


def nvml(value: str | None, gpus: list[GpuRecord] = FOUR) -> list[int]:
    """Visible devices as NVML indices."""
    return [t.nvml_index for t in resolve_cuda_visible_devices(value, gpus).targets]


def uuids(value: str | None, gpus: list[GpuRecord]) -> list[str]:
    return [t.uuid for t in resolve_cuda_visible_devices(value, gpus).targets]


# -- parsing ---------------------------------------------------------------------------------


def test_unset_is_distinct_from_empty() -> None:
    assert parse_cuda_visible_devices(None).raw is None
    spec = parse_cuda_visible_devices("")
    assert spec.raw == ""
    assert spec.entries == ()
    assert spec.stopped_at == ""


@pytest.mark.parametrize(
    ("text", "ordinals"),
    [
        ("1", [1]),
        ("1,0", [1, 0]),
        ("1abc", [1]),
        ("1gpu2,2ampere", [1, 2]),
        (" 1 , 0 ", [1, 0]),
        ("\t2\n,3", [2, 3]),
        ("+3", [3]),
        ("-0", [0]),
        ("007", [7]),
        ("0,2,-1,1", [0, 2]),
        ("0,,1", [0]),
        ("4,3,two,one", [4, 3]),
        ("one,two,3,4", []),
        ("0,GPU-8932f937", [0]),
        # strtoul's unsigned arithmetic, then the low 32 bits as an int (driver 580).
        ("4294967297", [1]),
        ("4294967296,4294967299", [0, 3]),
        ("-4294967295", [1]),
        ("-18446744073709551615", [1]),
        ("2147483648", []),
        ("-2147483648", []),
        ("18446744073709551616", []),
        ("NoDevFiles", []),
        ("0,NoDevFiles,1", [0]),
        ("-", []),
        ("+", []),
        ("١", []),  # a non-ASCII digit is not a digit to strtoul
    ],
)
def test_ordinal_lists_read_leading_digits_and_stop_at_the_first_invalid(
    text: str, ordinals: list[int]
) -> None:
    spec = parse_cuda_visible_devices(text)
    assert [e.ordinal for e in spec.entries] == ordinals
    assert all(e.kind is EntryKind.ORDINAL for e in spec.entries)


def test_parse_records_where_the_list_stopped() -> None:
    spec = parse_cuda_visible_devices("0, 2 ,-1,1")
    assert spec.stopped_at == "-1"
    assert [e.text for e in spec.entries] == ["0", " 2 "]
    assert parse_cuda_visible_devices("0,1").stopped_at is None


def test_uuid_lists_keep_the_text_and_stop_at_an_ordinal() -> None:
    spec = parse_cuda_visible_devices(f"{U0},GPU-c0d5,{M0},3,{U3}")
    assert [(e.kind, e.uuid_prefix) for e in spec.entries] == [
        (EntryKind.GPU_UUID, uuid_digits(U0)),
        (EntryKind.GPU_UUID, "GPU-c0d5"),
        (EntryKind.MIG_UUID, uuid_digits(M0)),
    ]
    assert uuid_digits(U0) == "GPU-8932f937d72c4106c12f20bd9faed9f6"
    assert spec.stopped_at == "3"


def test_uuid_entries_must_start_with_the_exact_prefix() -> None:
    # CUDA (driver 580) rejects white space before a UUID, an empty UUID and a lower-case prefix
    assert parse_cuda_visible_devices(f" {U0}").entries == ()
    assert parse_cuda_visible_devices(f"{U0}, {U2}").stopped_at == f" {U2}"
    assert parse_cuda_visible_devices("GPU-").entries == ()
    assert parse_cuda_visible_devices("MIG-").entries == ()
    assert parse_cuda_visible_devices("gpu-8932f937").entries == ()
    assert parse_cuda_visible_devices(f"{U0},gpu-c0d5").stopped_at == "gpu-c0d5"


@pytest.mark.parametrize(
    ("text", "prefix", "gi", "ci"),
    [
        ("MIG-GPU-8932f937/13/0", "GPU-8932f937", 13, 0),
        (f"MIG-{U2}/1/2", uuid_digits(U2), 1, 2),
    ],
)
def test_legacy_mig_form(text: str, prefix: str, gi: int, ci: int) -> None:
    (entry,) = parse_cuda_visible_devices(text).entries
    assert entry.kind is EntryKind.MIG_LEGACY
    assert (entry.uuid_prefix, entry.gpu_instance_id, entry.compute_instance_id) == (prefix, gi, ci)


@pytest.mark.parametrize(
    "text", ["MIG-GPU-8932f937/x/0", "MIG-GPU-8932f937/1", "MIG-GPU-89/1/2/3", "MIG-GPU-/1/2"]
)
def test_malformed_legacy_mig_is_invalid(text: str) -> None:
    spec = parse_cuda_visible_devices(text)
    assert spec.entries == ()
    assert spec.stopped_at == text


def test_pci_bus_order_is_exact() -> None:
    assert is_pci_bus_order("PCI_BUS_ID")
    for value in (None, "", "FASTEST_FIRST", "pci_bus_id", " PCI_BUS_ID"):
        assert not is_pci_bus_order(value)


# -- resolving ordinals ----------------------------------------------------------------------


def test_unset_shows_every_gpu_in_the_given_order() -> None:
    assert nvml(None) == [0, 1, 2, 3]
    reordered = [FOUR[2], FOUR[0], FOUR[3], FOUR[1]]
    assert nvml(None, reordered) == [2, 0, 3, 1]


@pytest.mark.parametrize("text", ["", "NoDevFiles", "abc", "-1", ",0"])
def test_no_device_visible(text: str) -> None:
    res = resolve_cuda_visible_devices(text, FOUR)
    assert res.targets == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", [1]),
        ("1,0", [1, 0]),
        ("3,1", [3, 1]),
        ("2abc,0x", [2, 0]),
        ("0,2,-1,1", [0, 2]),
        ("0,5,1", [0]),  # out of range ends the list
        ("0,1,2,3,4", [0, 1, 2, 3]),
        ("0,1,abc,0", [0, 1]),  # a duplicate after the end of the list does not count
    ],
)
def test_ordinals(text: str, expected: list[int]) -> None:
    assert nvml(text) == expected


@pytest.mark.parametrize("text", ["0,0", "1,0,1", "0,00", "2,+2", "-0,0", "3,1x,1"])
def test_a_duplicate_hides_every_device(text: str) -> None:
    res = resolve_cuda_visible_devices(text, FOUR)
    assert res.targets == ()
    assert any("twice" in n for n in res.notes)


def test_ordinals_count_in_the_tables_order() -> None:
    # The table is CUDA's order (fastest first here): ordinal 0 is NVML index 2.
    cuda_order = [FOUR[2], FOUR[0], FOUR[1], FOUR[3]]
    assert nvml("0", cuda_order) == [2]
    assert nvml("1,0", cuda_order) == [0, 2]


def test_notes_say_why_the_list_ended() -> None:
    res = resolve_cuda_visible_devices("0,7,1", FOUR)
    assert [t.nvml_index for t in res.targets] == [0]
    assert any("'7'" in n and "4 GPU" in n for n in res.notes)
    res = resolve_cuda_visible_devices("0,x", FOUR)
    assert any("'x'" in n for n in res.notes)
    assert resolve_cuda_visible_devices("1,0", FOUR).notes == ()


# -- resolving UUIDs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (U2, [2]),
        (f"{U3},{U0}", [3, 0]),
        ("GPU-c0d5", [2]),
        ("GPU-c", [2]),
        ("GPU-8932f937", [0]),  # long enough to tell U0 from U1
        ("GPU-8932f9a", [1]),
        (f"GPU-af7b,{U2},GPU-8932f937", [3, 2, 0]),
        ("GPU-8932f9", []),  # ambiguous: U0 and U1
        ("GPU-", []),  # empty: invalid
        ("GPU-C0D5", [2]),  # hexadecimal digits match in any case
        ("GPU-" + U3[4:].upper(), [3]),
        (f"GPU-c0d5,gpu-{U0[4:12]}", [2]),  # the prefix itself must be "GPU-"
        (f"GPU-c0d5,GPU-{U0[4:].upper()}", [2, 0]),
        ("GPU-c0d5,GPU-8932,GPU-af7b", [2]),  # an ambiguous entry ends the list
        ("GPU-c0d5,GPU-ffff,GPU-af7b", [2]),  # an unknown UUID ends the list
        (f"{U2},1", [2]),  # mixed forms: the ordinal ends a UUID list
        (f"1,{U2}", [1]),  # and a UUID ends an ordinal list
        (f"{U2} , {U0}", [2]),  # after a whole UUID the rest is ignored; a leading space is not
        (f"{U2},{U0} ", [2, 0]),
        (f" {U2}", []),
        ("GPU-c0d5 ,GPU-af7b", []),  # a space inside an abbreviation is invalid
        ("GPU-c0-d5-12,GPU-af7b61d89999", [2, 3]),  # dashes anywhere, or none
    ],
)
def test_gpu_uuids(text: str, expected: list[int]) -> None:
    assert nvml(text) == expected


def test_empty_gpu_uuid_is_invalid_even_with_one_gpu() -> None:
    assert nvml("GPU-", FOUR[:1]) == []
    assert nvml("GPU-8", FOUR[:1]) == [0]


@pytest.mark.parametrize(
    "text",
    [f"{U2},GPU-c0d5", f"GPU-c0,{U2}", f"{U0},GPU-af,GPU-8932f937", f"{U2},{U2.upper()}"],
)
def test_same_gpu_by_two_spellings_hides_every_device(text: str) -> None:
    assert nvml(text) == []


# What the CUDA driver (580.159.04, one H200) made visible for each form, observed with cuInit in a
# fresh process; "#0" is the GPU, [] none. The same table is checked live by tests/gpu.
H = "GPU-57f5931a-0687-ab6b-6935-7e04a4887e22"
DRIVER_OBSERVED: list[tuple[str | None, list[int]]] = [
    (None, [0]),
    ("", []),
    ("NoDevFiles", []),
    ("0", [0]),
    ("0,0", []),
    ("0,1", [0]),
    ("0,1,0", [0]),
    ("0abc", [0]),
    ("+0", [0]),
    ("-0", [0]),
    (" 0 ", [0]),
    ("0,-1", [0]),
    ("0 1", [0]),
    ("\t0", [0]),
    ("0,\t0", []),
    ("00", [0]),
    ("0x1", [0]),
    (H, [0]),
    ("GPU-57f5931a", [0]),
    ("GPU-", []),
    ("MIG-", []),
    (f"{H},0", [0]),
    (f"0,{H}", [0]),
    (f"{H},GPU-57f5931a", []),
    (f" {H}", []),
    ("GPU-" + H[4:].upper(), [0]),
    ("gpu-" + H[4:], []),
    (f"{H},GPU-ffffffff", [0]),
    ("GPU-57F5931A", [0]),
    (f"{H},GPU-{H[4:].upper()}", []),
    (H + " ", [0]),
    ("GPU-5", [0]),
    ("GPU-57f5931a-", [0]),
    ("GPU-57f5931ax", []),
    ("GPU-57f5931a0687ab6b69357e04a4887e22", [0]),
    ("GPU-57f5931a0687", [0]),
    ("GPU-57f-5931a", [0]),
    ("GPU-57f5931a ", []),
    ("GPU-57f5931a\t", []),
    (H + "x", [0]),
    (H + "0", [0]),
    (H + "-", [0]),
    ("GPU-57f5931a-x", []),
]


@pytest.mark.parametrize(("text", "expected"), DRIVER_OBSERVED)
def test_what_the_cuda_driver_did(text: str | None, expected: list[int]) -> None:
    assert nvml(text, [GpuRecord(0, H)]) == expected


# -- MIG -------------------------------------------------------------------------------------

MIG_GPU = GpuRecord(
    1,
    U1,
    mig_enabled=True,
    mig_devices=(MigRecord(M0, 13, 0), MigRecord(M1, 5, 0), MigRecord(M2, 5, 1)),
)
EMPTY_MIG_GPU = GpuRecord(2, U2, mig_enabled=True)
MIXED = [FOUR[0], MIG_GPU, EMPTY_MIG_GPU, FOUR[3]]


def test_mig_uuid_names_one_mig_device() -> None:
    (target,) = resolve_cuda_visible_devices(M1, MIXED).targets
    assert target == VisibleTarget(1, M1, mig=True)


def test_abbreviated_mig_uuid_must_be_unique() -> None:
    assert uuids("MIG-d184", MIXED) == [M0]
    assert uuids("MIG-37b5", MIXED) == []  # M1 and M2
    assert uuids("MIG-37b51", MIXED) == [M1]


def test_a_mig_prefix_also_names_a_gpu_by_its_uuid_digits() -> None:
    # The driver matched "MIG-<digits of a GPU UUID>" to that GPU (driver 580, MIG off).
    assert uuids("MIG-" + U3[4:], MIXED) == [U3]
    assert uuids("MIG-af7b", MIXED) == [U3]
    assert uuids(f"{U3},MIG-af7b", MIXED) == []  # the same GPU twice
    assert uuids("MIG-8932f9", MIXED) == []  # prefix of two GPUs


def test_legacy_mig_form_by_instance_ids() -> None:
    assert uuids("MIG-GPU-8932f9aa/5/1", MIXED) == [M2]
    assert uuids(f"MIG-{U1}/13/0", MIXED) == [M0]
    assert uuids("MIG-GPU-8932f9aa/6/0", MIXED) == []  # no such instance
    assert uuids("MIG-GPU-8932f9/5/1", MIXED) == []  # parent prefix ambiguous (U0, U1)


def test_at_most_one_mig_device_is_visible() -> None:
    res = resolve_cuda_visible_devices(f"{M1},{M0}", MIXED)
    assert [t.uuid for t in res.targets] == [M1]
    assert any("at most one MIG device" in n for n in res.notes)


def test_mig_device_wins_over_whole_gpus_named_with_it() -> None:
    assert uuids(f"{U0},{M0}", MIXED) == [M0]


def test_a_mig_enabled_gpu_shows_its_first_mig_device_only() -> None:
    assert uuids("1", MIXED) == [M0]
    assert uuids("0,1,3", MIXED) == [M0]
    assert uuids(None, MIXED) == [M0]
    assert uuids(U1, MIXED) == [M0]


def test_a_mig_enabled_gpu_without_mig_devices_is_invisible() -> None:
    res = resolve_cuda_visible_devices("0,2,3", MIXED)
    assert [t.uuid for t in res.targets] == [U0, U3]
    assert any("no MIG device" in n for n in res.notes)


def test_mig_duplicate_hides_everything() -> None:
    assert uuids(f"{M0},MIG-d18", MIXED) == []


# -- properties ------------------------------------------------------------------------------

_ORDINAL_RE = re.compile(r"[+-]?([0-9]+)")


def _reference_ordinals(text: str, count: int) -> list[int]:
    """An independent model of CUDA's rules for ordinal lists over a plain (non-MIG) machine."""
    out: list[int] = []
    for raw in text.split(","):
        piece = raw.lstrip(" \t\n\r\v\f")
        m = _ORDINAL_RE.match(piece)
        if m is None or (piece.startswith("-") and int(m.group(1)) != 0):
            break
        value = int(m.group(1))
        if value >= count:
            break
        if value in out:
            return []
        out.append(value)
    return out


_pieces = st.one_of(
    st.integers(min_value=0, max_value=6).map(str),
    st.sampled_from(["-0", "+1", "-1", "", "x", " 2 ", "3abc", "GPU-c0d5", "NoDevFiles", "01"]),
)
_texts = st.lists(_pieces, max_size=7).map(",".join)


@settings(max_examples=300, deadline=None)
@given(_texts, st.integers(min_value=0, max_value=5))
def test_ordinal_lists_match_an_independent_model(text: str, count: int) -> None:
    gpus = [GpuRecord(i, f"GPU-{i:08x}") for i in range(count)]
    if text.startswith(("GPU-", "MIG-")):
        return
    assert nvml(text, gpus) == _reference_ordinals(text, count)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=20))
def test_anything_after_an_invalid_entry_is_ignored(head: str, tail: str) -> None:
    gpus = [FOUR[0], MIG_GPU, FOUR[2]]
    assert resolve_cuda_visible_devices(f"{head},zz,{tail}", gpus).targets == (
        resolve_cuda_visible_devices(f"{head},zz", gpus).targets
    )


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_resolves_without_error_to_distinct_known_devices(text: str) -> None:
    res = resolve_cuda_visible_devices(text, MIXED)
    known = {g.uuid for g in MIXED} | {m.uuid for g in MIXED for m in g.mig_devices}
    assert len({t.uuid for t in res.targets}) == len(res.targets)
    assert all(t.uuid in known for t in res.targets)
    assert isinstance(parse_cuda_visible_devices(text), CudaVisibleSpec)


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(4)), st.integers(min_value=0, max_value=4), st.booleans())
def test_distinct_valid_entries_are_kept_in_order(
    perm: list[int], size: int, by_uuid: bool
) -> None:
    chosen = perm[:size]
    gpus = FOUR
    text = ",".join(gpus[i].uuid if by_uuid else str(i) for i in chosen)
    if size == 0:
        assert nvml(text) == []
    else:
        assert nvml(text) == chosen
