"""KV-cache sizing: how many bytes a request needs, and the longest one that fits.

The arithmetic mirrors vLLM's paged KV cache (see ``docs/sizing.md``): per attention layer one
page holds ``block_size`` tokens of keys and values, and a request of ``max_model_len`` tokens
needs ``ceil(max_model_len / block_size)`` pages in every layer. :func:`check_kv_cache_fits`
raises the engine's start-up complaint before an expensive start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelplat import _validate
from accelplat._util import gib_digits
from accelplat.errors import ConfigurationError, KVCacheTooSmallError

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


@dataclass(frozen=True)
class KVCacheShape:
    """The shape of a paged KV cache, validated on construction.

    Attributes:
        num_layers: Attention layers that keep a KV cache.
        num_kv_heads: Key/value heads per layer (after any tensor-parallel split).
        head_size: Width of a key head (for MLA: the latent width, e.g. 512 + 64).
        dtype_bytes: Bytes per element of the KV cache, or a dtype name (``"bf16"``).
        block_size: Tokens per page (vLLM's ``--block-size``, default 16).
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA (one
            latent vector per token).

    Raises:
        ConfigurationError: For a field that is not an int ``>= 1`` (``head_size_v >= 0``;
            ``bool`` rejected) or an unknown dtype name, naming it.
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int | str
    block_size: int = 16
    head_size_v: int | None = None

    def __post_init__(self) -> None:
        _int_arg(self.num_layers, "num_layers", minimum=1)
        _int_arg(self.num_kv_heads, "num_kv_heads", minimum=1)
        _int_arg(self.head_size, "head_size", minimum=1)
        if self.head_size_v is not None:
            _int_arg(self.head_size_v, "head_size_v", minimum=0)
        _int_arg(self.block_size, "block_size", minimum=1)
        self._element_bytes()

    def _element_bytes(self) -> int:
        if isinstance(self.dtype_bytes, str):
            return dtype_bytes(self.dtype_bytes)
        return _int_arg(self.dtype_bytes, "dtype_bytes", minimum=1)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of one layer: ``num_kv_heads × block_size × (k + v) × dtype_bytes``."""
        v = self.head_size if self.head_size_v is None else self.head_size_v
        return self.num_kv_heads * self.block_size * (self.head_size + v) * self._element_bytes()

    def bytes_for(self, max_model_len: int) -> int:
        """Return ``num_layers × ceil(max_model_len / block_size) × page_bytes``."""
        length = _int_arg(max_model_len, "max_model_len", minimum=1)
        pages = -(-length // self.block_size)  # ceil without floats
        return self.num_layers * pages * self.page_bytes

    def longest_that_fits(self, available_bytes: int) -> int:
        """Return the longest request length whose cache fits (a multiple of ``block_size``).

        Every length in ``((p − 1) × block_size, p × block_size]`` needs ``p`` pages per layer,
        so the longest is ``p × block_size`` for the largest ``p`` whose pages fit; ``0`` when
        not even one page per layer does.
        """
        available = _int_arg(available_bytes, "available_bytes", minimum=0)
        return (available // (self.num_layers * self.page_bytes)) * self.block_size


def _int_arg(value: object, argument: str, *, minimum: int) -> int:
    return _validate.integer(value, argument, minimum=minimum)


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
        num_kv_heads: Key/value heads per layer (see :class:`KVCacheShape`).
        head_size: Width of a key head.
        dtype_bytes: Bytes per element, or a dtype name for :func:`dtype_bytes`.
        block_size: Tokens per page.
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA.

    Returns:
        ``num_kv_heads × block_size × (head_size + head_size_v) × dtype_bytes``.

    Raises:
        ConfigurationError: For an argument that is not an int ``>= 1`` (``head_size_v >= 0``).
    """
    return KVCacheShape(1, num_kv_heads, head_size, dtype_bytes, block_size, head_size_v).page_bytes


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
        num_layers: Attention layers that keep a KV cache (see :class:`KVCacheShape`).
        num_kv_heads: Key/value heads per layer.
        head_size: Width of a key head.
        max_model_len: Tokens of the request (prompt and output).
        dtype_bytes: Bytes per element of the KV cache, or a dtype name (``"bf16"``).
        block_size: Tokens per page.
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
    shape = KVCacheShape(num_layers, num_kv_heads, head_size, dtype_bytes, block_size, head_size_v)
    return shape.bytes_for(max_model_len)


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

    Args:
        available_bytes: Bytes available for the KV cache (int ``>= 0``).
        num_layers: Attention layers that keep a KV cache (see :class:`KVCacheShape`).
        num_kv_heads: Key/value heads per layer.
        head_size: Width of a key head.
        dtype_bytes: Bytes per element, or a dtype name.
        block_size: Tokens per page.
        head_size_v: Width of a value head; ``None`` means ``head_size``, ``0`` for MLA.

    Returns:
        ``floor(available_bytes / (num_layers × page_bytes)) × block_size`` (a length needs whole
        pages); ``0`` when not even one page per layer fits.

    Raises:
        ConfigurationError: For a bad argument, naming it.
    """
    available = _int_arg(available_bytes, "available_bytes", minimum=0)
    shape = KVCacheShape(num_layers, num_kv_heads, head_size, dtype_bytes, block_size, head_size_v)
    return shape.longest_that_fits(available)


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
        num_layers: Attention layers that keep a KV cache (see :class:`KVCacheShape`).
        num_kv_heads: Key/value heads per layer.
        head_size: Width of a key head.
        max_model_len: Tokens of the request.
        dtype_bytes: Bytes per element, or a dtype name.
        block_size: Tokens per page.
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
    shape = KVCacheShape(num_layers, num_kv_heads, head_size, dtype_bytes, block_size, head_size_v)
    needed = shape.bytes_for(max_model_len)
    if needed <= available:
        return needed
    estimate = shape.longest_that_fits(available)
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
