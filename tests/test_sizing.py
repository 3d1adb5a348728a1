"""KV-cache arithmetic, the engine-worded check, the seed figures, sizes and dtypes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelplat
from accelplat import GIB, MIB
from accelplat._sizing import (
    KVCacheShape,
    KVCacheTooSmallError,
    check_kv_cache_fits,
    dtype_bytes,
    kv_cache_bytes,
    max_model_len_that_fits,
)
from accelplat._validate import parse_size
from accelplat.errors import ConfigurationError, InsufficientMemoryError

# The seed case: an embedding test at max_model_len=2048 needed 0.66 GiB of KV cache and had
# 0.64 GiB; 512 needed about 0.17 GiB. A Gemma-2-9B-shaped model reproduces these figures:
# 42 layers, 8 KV heads, head size 256, 16-bit KV cache.
SEED = {"num_layers": 42, "num_kv_heads": 8, "head_size": 256, "dtype_bytes": 2}
# bytes per token: 42 layers × 8 heads × (256 keys + 256 values) × 2 bytes
SEED_PER_TOKEN = 42 * 8 * (256 + 256) * 2  # 344,064 B
SEED_PER_BLOCK = SEED_PER_TOKEN * 16  # 5,505,024 B for 16 tokens in every layer


def test_public_names_are_exported() -> None:
    assert accelplat.kv_cache_bytes is kv_cache_bytes
    assert accelplat.max_model_len_that_fits is max_model_len_that_fits
    assert accelplat.check_kv_cache_fits is check_kv_cache_fits
    assert issubclass(KVCacheTooSmallError, InsufficientMemoryError)


# -- the formula -------------------------------------------------------------------------------


def test_the_shape_holds_the_arithmetic_the_functions_use() -> None:
    shape = KVCacheShape(**SEED)
    assert shape.page_bytes == 8 * 16 * (256 + 256) * 2
    assert shape.bytes_for(2048) == kv_cache_bytes(**SEED, max_model_len=2048)
    assert shape.longest_that_fits(GIB) == max_model_len_that_fits(GIB, **SEED)
    assert KVCacheShape(**{**SEED, "dtype_bytes": "bf16"}).page_bytes == shape.page_bytes
    with pytest.raises(ConfigurationError, match="head_size_v"):
        KVCacheShape(**SEED, head_size_v=-1)
    with pytest.raises(ConfigurationError, match="unknown dtype"):
        KVCacheShape(**{**SEED, "dtype_bytes": "nf4"})


def test_page_size_formula() -> None:
    # num_kv_heads × block_size × (head_size + head_size_v) × dtype_bytes
    def page(**dims: Any) -> int:
        return KVCacheShape(num_layers=1, **dims).page_bytes

    assert page(num_kv_heads=8, head_size=128, dtype_bytes=2) == 8 * 16 * 256 * 2
    assert page(num_kv_heads=8, head_size=128, dtype_bytes=2, head_size_v=64) == (
        8 * 16 * (128 + 64) * 2
    )
    assert page(num_kv_heads=2, head_size=64, dtype_bytes=4, block_size=32) == 2 * 32 * 128 * 4


def test_llama3_8b_shape_at_8k_is_one_gib() -> None:
    # 32 layers × 8 KV heads × 128 × 2 (K and V) × 2 bytes = 128 KiB per token; × 8192 tokens
    args: dict[str, Any] = {"num_layers": 32, "num_kv_heads": 8, "head_size": 128}
    assert kv_cache_bytes(**args, max_model_len=8192, dtype_bytes=2) == GIB
    assert kv_cache_bytes(**args, max_model_len=8192, dtype_bytes="bf16") == GIB
    assert kv_cache_bytes(**args, max_model_len=8192, dtype_bytes="fp8") == GIB // 2


def test_mla_stores_one_latent_per_token() -> None:
    # DeepSeek-V2-Lite shape: 27 layers, one latent "head" of 512 + 64, no separate values.
    need = kv_cache_bytes(
        num_layers=27,
        num_kv_heads=1,
        head_size=512 + 64,
        head_size_v=0,
        max_model_len=4096,
        dtype_bytes=2,
    )
    assert need == 27 * (4096 // 16) * (1 * 16 * 576 * 2)


def test_partial_blocks_round_up() -> None:
    one_block = kv_cache_bytes(num_layers=1, num_kv_heads=1, head_size=1, max_model_len=1,
                               dtype_bytes=1)  # fmt: skip
    assert one_block == 16 * 2
    for length, pages in [(16, 1), (17, 2), (32, 2), (33, 3)]:
        assert kv_cache_bytes(num_layers=3, num_kv_heads=1, head_size=1, max_model_len=length,
                              dtype_bytes=1) == 3 * pages * one_block  # fmt: skip


# -- the seed figures ---------------------------------------------------------------------------


def test_seed_case_2048_needs_066_gib_and_512_about_017() -> None:
    need_2048 = kv_cache_bytes(**SEED, max_model_len=2048)
    need_512 = kv_cache_bytes(**SEED, max_model_len=512)
    assert need_2048 == 2048 * SEED_PER_TOKEN == 704_643_072
    assert f"{need_2048 / GIB:.2f}" == "0.66"
    assert need_512 == need_2048 // 4
    assert abs(need_512 / GIB - 0.17) < 0.01  # 0.164 GiB


def test_seed_case_check_fails_at_2048_with_engine_wording() -> None:
    available = int(0.64 * GIB)
    with pytest.raises(InsufficientMemoryError) as err:
        check_kv_cache_fits(available, **SEED, max_model_len=2048)
    expected_max = (available // SEED_PER_BLOCK) * 16  # 124 whole blocks of 16 tokens
    assert expected_max == 1984
    text = str(err.value)
    assert "max seq len (2048)" in text
    assert "0.66 GiB KV cache is needed" in text
    assert "available KV cache memory (0.64 GiB)" in text
    assert f"estimated maximum model length is {expected_max}." in text
    assert "`gpu_memory_utilization`" in text
    assert "`max_model_len`" in text
    e = err.value
    assert isinstance(e, KVCacheTooSmallError)
    assert (e.needed, e.available, e.max_model_len, e.estimated_max_model_len) == (
        2048 * SEED_PER_TOKEN,
        available,
        2048,
        1984,
    )
    assert isinstance(e, ValueError)  # as the engine raises ValueError


def test_seed_case_512_fits_and_returns_bytes() -> None:
    assert check_kv_cache_fits(int(0.64 * GIB), **SEED, max_model_len=512) == 512 * SEED_PER_TOKEN
    assert max_model_len_that_fits(int(0.64 * GIB), **SEED) == 1984


def test_exact_fit_and_nothing_fits() -> None:
    need = kv_cache_bytes(**SEED, max_model_len=2048)
    assert check_kv_cache_fits(need, **SEED, max_model_len=2048) == need
    with pytest.raises(KVCacheTooSmallError) as err:
        check_kv_cache_fits(need - 1, **SEED, max_model_len=2048)
    assert err.value.estimated_max_model_len == 2048 - 16
    assert max_model_len_that_fits(SEED_PER_BLOCK - 1, **SEED) == 0
    assert max_model_len_that_fits(0, **SEED) == 0
    with pytest.raises(KVCacheTooSmallError, match="estimated maximum model length is 0"):
        check_kv_cache_fits(0, **SEED, max_model_len=1)


@given(
    available=st.integers(min_value=0, max_value=1 << 40),
    layers=st.integers(min_value=1, max_value=128),
    heads=st.integers(min_value=1, max_value=64),
    head=st.sampled_from([64, 80, 96, 128, 256, 576]),
    head_v=st.sampled_from([None, 0, 128]),
    block=st.sampled_from([1, 8, 16, 32, 64]),
    dtype=st.sampled_from([1, 2, 4]),
)
def test_max_model_len_is_the_largest_that_fits(
    *,
    available: int,
    layers: int,
    heads: int,
    head: int,
    head_v: int | None,
    block: int,
    dtype: int,
) -> None:
    dims: dict[str, Any] = {
        "num_layers": layers,
        "num_kv_heads": heads,
        "head_size": head,
        "head_size_v": head_v,
        "block_size": block,
        "dtype_bytes": dtype,
    }
    m = max_model_len_that_fits(available, **dims)
    assert m % block == 0
    if m > 0:
        assert kv_cache_bytes(**dims, max_model_len=m) <= available
        assert check_kv_cache_fits(available, **dims, max_model_len=m) > 0
    assert kv_cache_bytes(**dims, max_model_len=m + 1) > available


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"num_layers": 0}, r"num_layers must be an int >= 1, got 0"),
        ({"num_kv_heads": -2}, r"num_kv_heads must be an int >= 1, got -2"),
        ({"head_size": 128.0}, r"head_size must be an int >= 1, got float 128.0"),
        ({"max_model_len": True}, r"max_model_len must be an int >= 1, got bool True"),
        ({"block_size": 0}, r"block_size must be an int >= 1"),
        ({"head_size_v": -1}, r"head_size_v must be an int >= 0"),
        ({"dtype_bytes": 0}, r"dtype_bytes must be an int >= 1"),
        ({"dtype_bytes": False}, r"dtype_bytes must be an int >= 1, got bool"),
        ({"dtype_bytes": "int4"}, r"unknown dtype 'int4'"),
        ({"max_model_len": float("nan")}, r"max_model_len must be an int >= 1, got float nan"),
    ],
)
def test_bad_arguments_are_named(override: dict[str, Any], fragment: str) -> None:
    args: dict[str, Any] = {**SEED, "max_model_len": 2048, **override}
    with pytest.raises(ConfigurationError, match=fragment):
        kv_cache_bytes(**args)


@pytest.mark.parametrize("bad", [-1, 1.5, float("inf"), "1GiB", None, True])
def test_bad_available_bytes(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="available_bytes must be an int >= 0"):
        max_model_len_that_fits(bad, **SEED)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="available_bytes must be an int >= 0"):
        check_kv_cache_fits(bad, **SEED, max_model_len=16)  # type: ignore[arg-type]


# -- parse_size and dtype_bytes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * GIB),
        ("512MiB", 512 * MIB),
        ("1.5G", 3 * GIB // 2),
        ("1024B", 1024),
        ("4 GiB", 4 * GIB),
        ("4gib", 4 * GIB),
        ("2g", 2 * GIB),  # bare letters are binary, as docker --shm-size reads them
        ("64Mi", 64 * MIB),
        ("1T", 1024 * GIB),
        ("10KiB", 10240),
        ("1k", 1024),
        ("24GB", 24 * 10**9),  # decimal, as SI and vLLM's large_gpu_mark count
        ("1.5 MB", 1_500_000),
        ("1kB", 1000),
        ("0", 0),
        ("7B", 7),
        (" .5K ", 512),
        ("0.3G", int(0.3 * 2**30)),  # fractions round down: 322122547.2 -> 322122547
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "GiB", "-1GiB", "4 GiBs", "4XB", "1e9", "nan", "inf", "4GiB4", "1,5G"]
)
def test_parse_size_rejects_malformed_text(bad: str) -> None:
    with pytest.raises(ConfigurationError, match=r"--available must be a non-negative size"):
        parse_size(bad, argument="--available")


@pytest.mark.parametrize("bad", [-1, True, 1.5, None, b"4GiB"])
def test_parse_size_rejects_other_types(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^size "):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("bf16", 2),
        ("bfloat16", 2),
        ("fp16", 2),
        ("float16", 2),
        ("half", 2),
        ("torch.bfloat16", 2),
        ("BF16", 2),
        ("fp32", 4),
        ("float32", 4),
        ("float", 4),
        ("fp8", 1),
        ("fp8_e4m3", 1),
        ("fp8_e5m2", 1),
        ("float8_e4m3fn", 1),
        ("int8", 1),
        ("fp64", 8),
    ],
)
def test_dtype_bytes(name: str, size: int) -> None:
    assert dtype_bytes(name) == size


def test_dtype_bytes_rejects_auto_and_unknown() -> None:
    with pytest.raises(ConfigurationError, match="'auto' means the model's own dtype"):
        dtype_bytes("auto")
    with pytest.raises(ConfigurationError, match=r"unknown dtype 'nf4'; accepted: .*bf16"):
        dtype_bytes("nf4")
    with pytest.raises(ConfigurationError, match="dtype must be a str"):
        dtype_bytes(2)  # type: ignore[arg-type]


# -- one grammar for every consumer ---------------------------------------------------------------


def _size_consumers() -> dict[str, Any]:
    import argparse

    from accelplat._backends.simulated import spec_from_mapping
    from accelplat._cli._args import Size
    from accelplat._leaks import parse_leak_tolerance

    def cli(text: str) -> int:
        parser = argparse.ArgumentParser()
        parser.add_argument("--x", action=Size)
        try:
            return int(parser.parse_args([f"--x={text}"]).x)
        except SystemExit:  # parser.error: the refusal, exit status 2
            raise ConfigurationError(text) from None

    def spec(text: str) -> int:
        return spec_from_mapping({"devices": [{"total": "1PiB", "used": text}]}).devices[0].used

    return {
        "parse_size": parse_size,
        "cli option": cli,
        "leak tolerance": lambda text: parse_leak_tolerance(text, argument="tol"),
        "simulated spec": spec,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64Mi", 64 * MIB),
        ("64MiB", 64 * MIB),
        ("64 mib", 64 * MIB),
        ("1Ki", 1024),
        ("2P", 2 * 1024**5),
        ("2PB", 2 * 10**15),
        (".5G", GIB // 2),
        ("1.5GiB", 3 * GIB // 2),
        ("500MB", 500_000_000),
        ("3kB", 3000),
        ("1048576B", MIB),
        ("1048576", None),  # text without a unit is refused (docs/concepts.md, "Sizes")
        ("1e9", None),
        ("1.5e9", None),
        ("\uff14GiB", None),  # fullwidth digit four
        ("\u0664GiB", None),  # Arabic-Indic digit four
        ("4\u00a0GiB", None),  # no-break space
        ("-1G", None),
        ("+1G", None),
        ("4XB", None),
    ],
)
def test_every_consumer_reads_sizes_with_the_one_grammar(text: str, expected: int | None) -> None:
    for name, consumer in _size_consumers().items():
        if name == "simulated spec" and expected is not None and expected > 1024**5:
            with pytest.raises(ConfigurationError, match="at most 1 PiB"):  # a range, not grammar
                consumer(text)
        elif expected is None:
            with pytest.raises(ConfigurationError):
                consumer(text)
        else:
            assert consumer(text) == expected, name


def test_parse_size_maximum_names_the_argument() -> None:
    assert parse_size("1KiB", argument="--x", maximum=1024) == 1024
    with pytest.raises(ConfigurationError, match=r"--x must be at most 1023 bytes"):
        parse_size("1KiB", argument="--x", maximum=1023)
