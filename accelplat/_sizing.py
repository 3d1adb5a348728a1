"""KV-cache sizing: how many bytes a request needs, and the longest one that fits.

The arithmetic mirrors vLLM's paged KV cache (``docs/sizing.md``): per attention layer a page
holds ``block_size`` tokens of keys and values, and a request needs ``ceil(max_model_len /
block_size)`` pages in every layer. :func:`check_kv_cache_fits` raises the engine's complaint.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelplat import _validate
from accelplat._util import gib_digits
from accelplat.errors import ConfigurationError, KVCacheTooSmallError

_MAX_BITS = 2000  # each count below 2**2000 keeps every figure in a message printable

_DTYPE_BYTES: dict[str, int] = {
    **dict.fromkeys(("float64", "fp64", "f64", "double"), 8),
    **dict.fromkeys(("float32", "fp32", "f32", "float", "int32"), 4),
    **dict.fromkeys(("bfloat16", "bf16", "float16", "fp16", "f16", "half", "int16"), 2),
    **dict.fromkeys(("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "int8", "uint8"), 1),
    **dict.fromkeys(("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"), 1),
}

DTYPE_NAMES = tuple(sorted(_DTYPE_BYTES))  # what ``dtype_bytes`` accepts (any case, torch. prefix)


def dtype_bytes(dtype: str) -> int:
    """Return the bytes per element (1, 2, 4 or 8) of a dtype name.

    Args:
        dtype: As torch, vLLM or shorthand spell it, any case: ``"bf16"``, ``"torch.half"`` …

    Raises:
        ConfigurationError: For ``"auto"`` (pass the model's dtype), a sub-byte or unknown name.
    """
    if not isinstance(dtype, str):
        raise ConfigurationError(f"dtype must be a str such as 'bf16', got {dtype!r:.200}")
    key = dtype.strip().lower().removeprefix("torch.")
    if key in _DTYPE_BYTES:
        return _DTYPE_BYTES[key]
    if key == "auto":
        raise ConfigurationError(
            "dtype 'auto' means the model's own dtype, which accelplat cannot see; "
            "pass it explicitly (e.g. 'bf16')"
        )
    raise ConfigurationError(f"unknown dtype {dtype!r:.200}; accepted: {', '.join(DTYPE_NAMES)}")


@dataclass(frozen=True)
class KVCacheShape:
    """The shape of a paged KV cache, validated on construction.

    Attributes:
        num_layers: Attention layers that keep a KV cache.
        num_kv_heads: Key/value heads per layer (after any tensor-parallel split).
        head_size: Width of a key head (for MLA: the latent width, e.g. 512 + 64).
        dtype_bytes: Bytes per element of the KV cache, or a dtype name (``"bf16"``).
        block_size: Tokens per page (vLLM's ``--block-size``, default 16).
        head_size_v: Width of a value head; ``None``: ``head_size``; ``0`` for MLA.

    Raises:
        ConfigurationError: For a field not an int ``>= 1`` (``head_size_v``: ``>= 0``) below
            ``2**2000``, or an unknown dtype name, naming it.
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int | str
    block_size: int = 16
    head_size_v: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_size", "block_size"):
            _count(getattr(self, name), name, minimum=1)
        if self.head_size_v is not None:
            _count(self.head_size_v, "head_size_v", minimum=0)
        self._element_bytes()

    def _element_bytes(self) -> int:
        if isinstance(self.dtype_bytes, str):
            return dtype_bytes(self.dtype_bytes)
        return _count(self.dtype_bytes, "dtype_bytes", minimum=1)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of one layer: ``num_kv_heads × block_size × (k + v) × dtype_bytes``."""
        v = self.head_size if self.head_size_v is None else self.head_size_v
        return self.num_kv_heads * self.block_size * (self.head_size + v) * self._element_bytes()

    def bytes_for(self, max_model_len: int) -> int:
        """Return ``num_layers × ceil(max_model_len / block_size) × page_bytes``."""
        length = _count(max_model_len, "max_model_len", minimum=1)
        pages = -(-length // self.block_size)  # ceil without floats
        return self.num_layers * pages * self.page_bytes

    def longest_that_fits(self, available_bytes: int) -> int:
        """Return the longest request whose cache fits: whole pages, ``0`` when not even one."""
        available = _count(available_bytes, "available_bytes", minimum=0)
        return (available // (self.num_layers * self.page_bytes)) * self.block_size


def _count(value: object, argument: str, *, minimum: int) -> int:
    number = _validate.integer(value, argument, minimum=minimum)
    if number.bit_length() > _MAX_BITS:
        raise ConfigurationError(
            f"{argument} must be an int below 2**{_MAX_BITS}, got one of {number.bit_length()} bits"
        )
    return number


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
    """Return the KV-cache bytes one request of ``max_model_len`` tokens (prompt and output) needs.

    ``num_layers × ceil(max_model_len / block_size) × page_bytes``; see :class:`KVCacheShape`.

    Raises:
        ConfigurationError: For a bad argument, naming it.
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
    """Return the longest request whose KV cache fits in ``available_bytes`` (an int ``>= 0``).

    ``floor(available_bytes / (num_layers × page_bytes)) × block_size``; ``0``: not one page.

    Raises:
        ConfigurationError: For a bad argument, naming it.
    """
    shape = KVCacheShape(num_layers, num_kv_heads, head_size, dtype_bytes, block_size, head_size_v)
    return shape.longest_that_fits(available_bytes)


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

    ``available_bytes`` is device memory × utilization, less weights, activations and graphs.

    Returns:
        The bytes needed (:func:`kv_cache_bytes`), when they fit.

    Raises:
        KVCacheTooSmallError: An ``InsufficientMemoryError`` worded like the engine's.
        ConfigurationError: For a bad argument, naming it.
    """
    available = _count(available_bytes, "available_bytes", minimum=0)
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
