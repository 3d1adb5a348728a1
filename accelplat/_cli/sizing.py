"""``accelplat shm`` and ``accelplat kv``: does a shared-memory budget or a KV cache fit?

Exit 0 when it fits (or nothing was asked), 1 when it does not (the reason on stderr), 2 for
bad usage. Sizes carry a unit (``4GiB``, ``512MiB``, ``8GB``, ``100B``; ``parse_size``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from accelplat._cli._args import Size, add_common, command, path, words
from accelplat._cli._errors import dumps
from accelplat._shm import DEFAULT_SHM_PATH, shm_info, shortage_error
from accelplat._sizing import (
    DTYPE_NAMES,
    KVCacheShape,
    check_kv_cache_fits,
    dtype_bytes,
    max_model_len_that_fits,
)
from accelplat._types import GIB
from accelplat._util import gib_digits
from accelplat._validate import parse_size
from accelplat.errors import ConfigurationError, KVCacheTooSmallError

_KV_FLAGS = {
    "num_layers": "--layers",
    "num_kv_heads": "--kv-heads",
    "head_size_v": "--head-size-v",
    "head_size": "--head-size",
    "max_model_len": "--max-model-len",
    "block_size": "--block-size",
    "dtype_bytes": "--dtype",
}
_MAX_KV_INT = 2**63 - 1  # engines hold these in int64; products stay below 4300 digits


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``shm`` and ``kv`` sub-commands to ``sub``."""
    shm = command(
        sub,
        "shm",
        _run_shm,
        help="show /dev/shm space, or check that a budget fits",
        description="Show the size and free space of a shared-memory mount; with --require, "
        "check that a budget fits (exit 1 and a message on stderr when it does not).",
    )
    path(shm.add_argument("--path", default=DEFAULT_SHM_PATH, help="mount to check (/dev/shm)"))
    shm.add_argument("--require", action=Size, help="budget that must fit: 4GiB")
    shm.add_argument(
        "--name", default="shared-memory buffer", help="what the budget is, for the message"
    )
    add_common(shm, json=True)

    kv = command(
        sub,
        "kv",
        _run_kv,
        help="KV-cache bytes for one request of --max-model-len; check it fits",
        description="Print the KV-cache bytes one request of --max-model-len tokens needs "
        "(vLLM's paged layout). With --available, check that it fits and print the longest "
        "length that does (exit 1 when it does not fit).",
    )
    kv.add_argument("--layers", type=int, required=True, help="attention layers with a KV cache")
    kv.add_argument("--kv-heads", type=int, required=True, help="key/value heads per layer")
    kv.add_argument("--head-size", type=int, required=True, help="width of a key head")
    kv.add_argument(
        "--head-size-v",
        type=int,
        default=None,
        help="width of a value head (default: head size; 0 for MLA)",
    )
    dtype = kv.add_argument(
        "--dtype", required=True, help="KV-cache dtype: bf16, fp16, fp32, fp8 … or bytes: 2"
    )
    words(dtype, DTYPE_NAMES)
    kv.add_argument("--max-model-len", type=int, required=True, help="tokens of one request")
    kv.add_argument("--block-size", type=int, default=16, help="tokens per page (16)")
    kv.add_argument("--available", action=Size, help="memory left for the KV cache: 0.64GiB")
    add_common(kv, json=True)


def _gib(n: int) -> str:
    return f"{gib_digits(n)} GiB"


def _gib_number(n: int) -> float | int:
    """``n`` bytes in GiB for JSON: 4 decimals, or whole GiB (exact) beyond a float's range."""
    return round(n / GIB, 4) if n < 2**1000 else n // GIB


def _run_shm(args: argparse.Namespace) -> int:
    required: int | None = args.require
    name = str(args.name).strip()
    if not name:
        raise ConfigurationError(f"--name must be a non-empty text, got {args.name!r}")
    info = shm_info(args.path)
    fits = None if required is None else info.fits(required)
    if args.json:
        doc: dict[str, Any] = {
            "path": info.path,
            "free": info.free,
            "total": info.total,
            "used": info.used,
        }
        doc.update(required=required, name=None if required is None else name, fits=fits)
        print(dumps(doc, indent=2))
    else:
        print(f"{info.path}: {_gib(info.free)} free of {_gib(info.total)} ({_gib(info.used)} used)")
    if required is None:
        return 0
    if not fits:
        print(f"accelplat: {shortage_error(info, required, name)}", file=sys.stderr)
        return 1
    if not args.json:
        print(f"fits: {name} needs {_gib(required)} ({required} bytes)")
    return 0


def _flag_names(exc: ConfigurationError) -> ConfigurationError:
    """Re-word an argument error with the command-line flag instead of the keyword."""
    text = str(exc)
    for keyword, flag in _KV_FLAGS.items():
        if text.startswith(keyword + " "):
            return ConfigurationError(flag + text[len(keyword) :])
    return exc


def _run_kv(args: argparse.Namespace) -> int:
    text = args.dtype.strip()
    # Bytes per element: ASCII digits only (str.isdigit() also admits '²'); else a dtype name.
    numeric = text.isascii() and text.isdigit()
    dtype = parse_size(text, argument="--dtype", bare_bytes=True) if numeric else args.dtype
    dims: dict[str, Any] = {
        "num_layers": args.layers,
        "num_kv_heads": args.kv_heads,
        "head_size": args.head_size,
        "head_size_v": args.head_size_v,
        "block_size": args.block_size,
        "dtype_bytes": dtype if isinstance(dtype, int) else dtype_bytes(dtype),
    }
    for keyword, value in {**dims, "max_model_len": args.max_model_len}.items():
        if value is not None and value > _MAX_KV_INT:
            raise ConfigurationError(
                f"{_KV_FLAGS[keyword]} must be at most {_MAX_KV_INT} (2**63 - 1), "
                f"got a number of {len(str(value))} digits"
            )
    available: int | None = args.available
    try:
        shape = KVCacheShape(**dims)
        needed, page = shape.bytes_for(args.max_model_len), shape.page_bytes
    except ConfigurationError as exc:
        raise _flag_names(exc) from None
    per_token = args.layers * page // args.block_size
    doc: dict[str, Any] = {
        "max_model_len": args.max_model_len,
        "bytes": needed,
        "gib": _gib_number(needed),
        "page_bytes": page,
        "bytes_per_token": per_token,
        "block_size": args.block_size,
        "dtype_bytes": dims["dtype_bytes"],
        "available": available,
        "fits": None,
        "max_model_len_that_fits": None,
    }
    error: KVCacheTooSmallError | None = None
    if available is not None:
        doc["max_model_len_that_fits"] = max_model_len_that_fits(available, **dims)
        try:
            check_kv_cache_fits(available, **dims, max_model_len=args.max_model_len)
        except KVCacheTooSmallError as exc:
            error = exc
        doc["fits"] = error is None
    if args.json:
        print(dumps(doc, indent=2))
    else:
        print(
            f"KV cache for one request of {args.max_model_len} tokens: {needed} bytes "
            f"({_gib(needed)})"
        )
        print(
            f"  {page} bytes per page of {args.block_size} tokens per layer; "
            f"{per_token} bytes per token over {args.layers} layers"
        )
        if available is not None and error is None:
            print(
                f"fits in {_gib(available)} available; longest that fits: "
                f"{doc['max_model_len_that_fits']} tokens"
            )
    if error is not None:
        print(f"accelplat: {error}", file=sys.stderr)
        return 1
    return 0
