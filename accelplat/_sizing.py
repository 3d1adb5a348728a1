"""KV-cache sizing: how many bytes a request needs, and the longest one that fits.

The arithmetic mirrors vLLM's paged KV cache. Per attention layer, one *page* (block) holds
``block_size`` tokens of keys and values::

    page_bytes = num_kv_heads × block_size × (head_size + head_size_v) × dtype_bytes

``head_size_v`` defaults to ``head_size`` (keys and values of the same width); multi-head latent
attention (MLA) stores one latent vector per token, which is ``head_size_v = 0`` with
``head_size`` set to the latent width (e.g. 512 + 64). A request of ``max_model_len`` tokens
needs ``ceil(max_model_len / block_size)`` pages in every layer, so::

    kv_cache_bytes = num_layers × ceil(max_model_len / block_size) × page_bytes

The engine refuses to start when the memory left for the KV cache cannot hold one request of
``max_model_len``; :func:`check_kv_cache_fits` raises the same complaint before an expensive
start-up, and :func:`max_model_len_that_fits` gives the largest length that would fit.

Sizes on the command line and in configuration go through :func:`parse_size`; dtype names
through :func:`dtype_bytes`. Nothing here imports a framework or touches a device.
"""

from __future__ import annotations

import re

from accelplat import _validate
from accelplat._util import gib_digits
from accelplat.errors import ConfigurationError, KVCacheTooSmallError

__all__ = [
    "KVCacheTooSmallError",
    "check_kv_cache_fits",
    "dtype_bytes",
    "kv_cache_bytes",
    "kv_cache_page_bytes",
    "max_model_len_that_fits",
    "parse_size",
]

_DTYPE_BYTES: dict[str, int] = {
    **dict.fromkeys(("float64", "fp64", "f64", "double"), 8),
    **dict.fromkeys(("float32", "fp32", "f32", "float", "int32"), 4),
    **dict.fromkeys(("bfloat16", "bf16", "float16", "fp16", "f16", "half", "int16"), 2),
    **dict.fromkeys(
        (
            "fp8",
            "fp8_e4m3",
            "fp8_e5m2",
            "fp8_inc",
            "float8_e4m3fn",
            "float8_e4m3fnuz",
            "float8_e5m2",
            "float8_e5m2fnuz",
            "int8",
            "uint8",
        ),
        1,
    ),
}

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    **{u: 1024**i for i, p in enumerate("kmgtp", 1) for u in (p, p + "i", p + "ib")},
    **{p + "b": 1000**i for i, p in enumerate("kmgtp", 1)},
}

_SIZE_RE = re.compile(r"^[ \t]*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*([A-Za-z]*)[ \t]*$", re.ASCII)
"""The one size grammar: ASCII digits, an optional fraction, an optional unit; no exponent."""

_MAX_SIZE_DIGITS = 1000
"""Most digits :func:`parse_size` reads (far beyond any real size; bounds the work it does)."""


# -- validation ------------------------------------------------------------------------------


def _int_arg(value: object, argument: str, *, minimum: int) -> int:
    return _validate.integer(value, argument, minimum=minimum, show_type=True)


def _dtype_arg(value: object) -> int:
    if isinstance(value, str):
        return dtype_bytes(value)
    return _int_arg(value, "dtype_bytes", minimum=1)


# -- public helpers --------------------------------------------------------------------------


def dtype_bytes(dtype: str) -> int:
    """Return the bytes per element of a dtype name.

    Args:
        dtype: A name as torch, vLLM's ``--dtype`` / ``--kv-cache-dtype`` or common shorthand
            spell it, case-insensitive, with or without ``torch.``: ``"bf16"``, ``"bfloat16"``,
            ``"fp16"``, ``"float16"``, ``"half"``, ``"fp32"``, ``"float32"``, ``"float"``,
            ``"fp8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``, ``"float8_e4m3fn"``, ``"int8"``,
            ``"fp64"`` …

    Returns:
        1, 2, 4 or 8.

    Raises:
        ConfigurationError: For ``"auto"`` (the model's dtype: pass it explicitly), a sub-byte
            type, or an unknown name; the message lists the accepted names.
    """
    if not isinstance(dtype, str):
        raise ConfigurationError(f"dtype must be a str such as 'bf16', got {dtype!r}")
    key = dtype.strip().lower().removeprefix("torch.")
    if key in _DTYPE_BYTES:
        return _DTYPE_BYTES[key]
    if key == "auto":
        raise ConfigurationError(
            "dtype 'auto' means the model's own dtype, which accelplat cannot see; "
            "pass it explicitly (e.g. 'bf16')"
        )
    raise ConfigurationError(
        f"unknown dtype {dtype!r}; accepted: {', '.join(sorted(_DTYPE_BYTES))}"
    )


def parse_size(value: str | int, *, argument: str = "size", maximum: int | None = None) -> int:
    """Parse a byte size such as ``"4GiB"``, ``"512MiB"``, ``"1.5G"`` or ``"1024"``.

    This is accelplat's one size grammar: every CLI option, pytest option, ini option, marker
    argument, simulated spec and trace reads sizes through it. Numbers are ASCII digits with an
    optional fraction (``"1.5G"``, ``".5G"``); no sign, no exponent (``"1e9"``), no non-ASCII
    digits (``"４GiB"``). Units, case-insensitive, with or without a space (or tab):

    * binary — ``K``/``Ki``/``KiB`` (2**10), ``M``/``Mi``/``MiB``, ``G``/``Gi``/``GiB``,
      ``T``/``Ti``/``TiB``, ``P``/``Pi``/``PiB``. A bare letter is binary, as in
      ``docker run --shm-size 2g``;
    * decimal — ``KB`` (10**3), ``MB``, ``GB``, ``TB``, ``PB``, as SI defines them and as vLLM's
      ``large_gpu_mark(min_gb)`` counts (``min_gb × 10**9``). ``"24GB"`` is therefore
      24,000,000,000 bytes, about 22.35 GiB;
    * none or ``B`` — bytes.

    Fractions are allowed and rounded down to whole bytes (``"1.5G"`` is 1,610,612,736).

    Args:
        value: The text, or a non-negative ``int`` taken as bytes.
        argument: The name used in error messages (e.g. ``"--available"``).
        maximum: The largest size accepted, for consumers with a bound; ``None``: no bound
            (the result is exact, however long).

    Returns:
        Bytes, ``>= 0``.

    Raises:
        ConfigurationError: For a negative, non-finite, malformed or unit-less-but-odd value,
            a number of more than 1000 digits, or a size above ``maximum``, naming ``argument``.
    """
    size = _parse_size(value, argument)
    if maximum is not None and size > maximum:
        raise ConfigurationError(f"{argument} must be at most {maximum} bytes, got {value!r}")
    return size


def _parse_size(value: str | int, argument: str) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"{argument} must be a size such as '4GiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigurationError(f"{argument} must be >= 0 bytes, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{argument} must be a size such as '4GiB' or an int of bytes, "
            f"got {type(value).__name__} {value!r}"
        )
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ConfigurationError(
            f"{argument} must be a non-negative size: a byte count ('1024') or a number with a "
            f"unit ('4GiB', '512MiB', '1.5G', '8GB'); got {value!r}"
        )
    whole, _, fraction = str(m.group(1)).partition(".")
    whole = whole.lstrip("0")
    if len(whole) + len(fraction) > _MAX_SIZE_DIGITS:
        raise ConfigurationError(
            f"{argument} has more than {_MAX_SIZE_DIGITS} digits; got {value[:40]!r}…"
        )
    # Exact integer arithmetic: no rounding of long numbers, no overflow, floor of fractions.
    scale: int = 10 ** len(fraction)
    factor = _UNITS[unit]
    return (int(whole or "0") * scale + int(fraction or "0")) * factor // scale


def kv_cache_page_bytes(
    *,
    num_kv_heads: int,
    head_size: int,
    dtype_bytes: int | str,
    block_size: int = 16,
    head_size_v: int | None = None,
) -> int:
    """Return the bytes of one KV-cache page (``block_size`` tokens) of one layer.

    Args:
        num_kv_heads: Key/value heads per layer (after any tensor-parallel split).
        head_size: Width of a key head (for MLA: the latent width, e.g. 512 + 64).
        dtype_bytes: Bytes per element, or a dtype name for :func:`dtype_bytes`.
        block_size: Tokens per page (vLLM's ``--block-size``, default 16).
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA.

    Returns:
        ``num_kv_heads × block_size × (head_size + head_size_v) × dtype_bytes``.

    Raises:
        ConfigurationError: For an argument that is not an int ``>= 1`` (``head_size_v >= 0``).
    """
    heads = _int_arg(num_kv_heads, "num_kv_heads", minimum=1)
    k = _int_arg(head_size, "head_size", minimum=1)
    v = k if head_size_v is None else _int_arg(head_size_v, "head_size_v", minimum=0)
    block = _int_arg(block_size, "block_size", minimum=1)
    return heads * block * (k + v) * _dtype_arg(dtype_bytes)


def kv_cache_bytes(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_size: int,
    max_model_len: int,
    dtype_bytes: int | str,
    block_size: int = 16,
    head_size_v: int | None = None,
) -> int:
    """Return the KV-cache bytes one request of ``max_model_len`` tokens needs.

    Args:
        num_layers: Attention layers that keep a KV cache.
        num_kv_heads: Key/value heads per layer.
        head_size: Width of a key head.
        max_model_len: Tokens of the request (prompt and output).
        dtype_bytes: Bytes per element of the KV cache, or a dtype name (``"bf16"``).
        block_size: Tokens per page (default 16).
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA.

    Returns:
        ``num_layers × ceil(max_model_len / block_size) × page_bytes``.

    Raises:
        ConfigurationError: For an argument that is not a positive int (``bool`` rejected),
            naming it.

    Example:
        >>> kv_cache_bytes(num_layers=32, num_kv_heads=8, head_size=128,
        ...                max_model_len=8192, dtype_bytes=2) == 1024**3
        True
    """
    layers = _int_arg(num_layers, "num_layers", minimum=1)
    length = _int_arg(max_model_len, "max_model_len", minimum=1)
    block = _int_arg(block_size, "block_size", minimum=1)
    pages = -(-length // block)  # ceil without floats
    page = kv_cache_page_bytes(
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        dtype_bytes=dtype_bytes,
        block_size=block_size,
        head_size_v=head_size_v,
    )
    return layers * pages * page


def max_model_len_that_fits(
    available_bytes: int,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_size: int,
    dtype_bytes: int | str,
    block_size: int = 16,
    head_size_v: int | None = None,
) -> int:
    """Return the longest request whose KV cache fits in ``available_bytes``.

    A length needs whole pages, so the answer is a multiple of ``block_size``: every length
    in ``((p − 1) × block_size, p × block_size]`` needs ``p`` pages per layer, and the longest
    is ``p × block_size`` for the largest ``p`` whose pages fit.

    Args:
        available_bytes: Bytes available for the KV cache (int ``>= 0``).
        num_layers: Attention layers that keep a KV cache.
        num_kv_heads: Key/value heads per layer.
        head_size: Width of a key head.
        dtype_bytes: Bytes per element, or a dtype name.
        block_size: Tokens per page (default 16).
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA.

    Returns:
        ``floor(available_bytes / (num_layers × page_bytes)) × block_size``; ``0`` when not
        even one page per layer fits.

    Raises:
        ConfigurationError: For a bad argument, naming it.
    """
    available = _int_arg(available_bytes, "available_bytes", minimum=0)
    layers = _int_arg(num_layers, "num_layers", minimum=1)
    page = kv_cache_page_bytes(
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        dtype_bytes=dtype_bytes,
        block_size=block_size,
        head_size_v=head_size_v,
    )
    return (available // (layers * page)) * block_size


def check_kv_cache_fits(
    available_bytes: int,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_size: int,
    max_model_len: int,
    dtype_bytes: int | str,
    block_size: int = 16,
    head_size_v: int | None = None,
) -> int:
    """Check that one request of ``max_model_len`` tokens fits, as the engine checks at start.

    Args:
        available_bytes: Bytes available for the KV cache (int ``>= 0``): device memory ×
            utilization, less weights, activations and graph reservations.
        num_layers: Attention layers that keep a KV cache.
        num_kv_heads: Key/value heads per layer.
        head_size: Width of a key head.
        max_model_len: Tokens of the request.
        dtype_bytes: Bytes per element, or a dtype name.
        block_size: Tokens per page (default 16).
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA.

    Returns:
        The bytes needed (:func:`kv_cache_bytes`), when they fit.

    Raises:
        KVCacheTooSmallError: An :class:`~accelplat.errors.InsufficientMemoryError` worded like
            the engine's: ``"… (X GiB KV cache is needed, which is larger than the available
            KV cache memory (Y GiB). Based on the available memory, the estimated maximum model
            length is M. …"``
        ConfigurationError: For a bad argument, naming it.
    """
    available = _int_arg(available_bytes, "available_bytes", minimum=0)
    needed = kv_cache_bytes(
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        max_model_len=max_model_len,
        dtype_bytes=dtype_bytes,
        block_size=block_size,
        head_size_v=head_size_v,
    )
    if needed <= available:
        return needed
    estimate = max_model_len_that_fits(
        available,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        dtype_bytes=dtype_bytes,
        block_size=block_size,
        head_size_v=head_size_v,
    )
    raise KVCacheTooSmallError(
        f"To serve one request at the model's max seq len ({max_model_len}), "
        f"{gib_digits(needed)} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({gib_digits(available)} GiB). Based on the available memory, the "
        f"estimated maximum model length is {estimate}. Try increasing "
        f"`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        needed=needed,
        available=available,
        max_model_len=max_model_len,
        estimated_max_model_len=estimate,
    )
