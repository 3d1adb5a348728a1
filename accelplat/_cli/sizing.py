"""``accelplat shm`` and ``accelplat kv``: does a shared-memory budget or a KV cache fit?

Exit 0 when it fits (or nothing was asked), 1 when it does not (the reason on stderr), 2 for
bad usage. Sizes carry a unit (``4GiB``, ``512MiB``, ``8GB``, ``100B``; ``parse_size``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from accelplat import _sizing
from accelplat._cli._args import Size, add_common, path, words
from accelplat._cli._errors import dumps, say, shown
from accelplat._shm import DEFAULT_SHM_PATH, shm_info
from accelplat._types import GIB
from accelplat._util import format_bytes, gib_digits
from accelplat._validate import parse_size
from accelplat.errors import ConfigurationError, KVCacheTooSmallError

# The KV dimensions: the option, the sizing functions' keyword, its value's name and help.
_KV = (
    ("--layers", "num_layers", "N", "attention layers with a KV cache"),
    ("--kv-heads", "num_kv_heads", "N", "key/value heads per layer"),
    ("--head-size", "head_size", "N", "width of a key head"),
    ("--head-size-v", "head_size_v", "N", "width of a value head (default: head size; 0: MLA)"),
    ("--max-model-len", "max_model_len", "TOKENS", "tokens of one request"),
    ("--block-size", "block_size", "TOKENS", "tokens per page (16)"),
)
_FLAGS = {keyword: flag for flag, keyword, _, _ in _KV} | {"dtype_bytes": "--dtype"}
_MAX_KV_INT = 2**63 - 1  # engines hold these in int64; products stay below 4300 digits


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``shm`` and ``kv`` sub-commands to ``sub``."""
    shm = sub.add_parser(
        "shm",
        help="show /dev/shm space, or check that a budget fits",
        description="Show the size and free space of a shared-memory mount; with --require, "
        "check that a budget fits (exit 1 and a message on stderr when it does not).",
    )
    shm.set_defaults(func=_run_shm)
    mount = shm.add_argument("--path", default=DEFAULT_SHM_PATH, metavar="MOUNT", help="/dev/shm")
    path(mount, directory=True)
    shm.add_argument("--require", action=Size, help="budget that must fit: 4GiB")
    what = "what the budget is, for the message"
    shm.add_argument("--name", default="shared-memory buffer", metavar="TEXT", help=what)
    add_common(shm, json=True)

    kv = sub.add_parser(
        "kv",
        help="KV-cache bytes for one request of --max-model-len; check it fits",
        description="Print the KV-cache bytes one request of --max-model-len tokens needs "
        "(vLLM's paged layout). With --available, check that it fits and print the longest "
        "length that does (exit 1 when it does not fit).",
    )
    kv.set_defaults(func=_run_kv)
    for flag, keyword, metavar, text in _KV:
        required = keyword not in ("head_size_v", "block_size")
        kv.add_argument(flag, dest=keyword, type=int, metavar=metavar, required=required, help=text)
    kv.set_defaults(block_size=16)
    dtype_help = "KV-cache dtype: bf16, fp16, fp32, fp8 … or bytes: 2"
    dtype = kv.add_argument("--dtype", required=True, metavar="TYPE", help=dtype_help)
    words(dtype, _sizing.DTYPE_NAMES)
    kv.add_argument("--available", action=Size, help="memory left for the KV cache: 0.64GiB")
    add_common(kv, json=True)


def _gib(n: int) -> str:
    return f"{gib_digits(n)} GiB"


def _run_shm(args: argparse.Namespace) -> int:
    required: int | None = args.require
    name = args.name.strip()
    if not name:
        raise ConfigurationError(f"--name must be a non-empty text, got {args.name!r}")
    info = shm_info(args.path)
    fits = None if required is None else info.fits(required)
    if args.json:
        doc = {"path": info.path, "free": info.free, "total": info.total, "used": info.used}
        doc |= {"required": required, "name": None if required is None else name, "fits": fits}
        print(dumps(doc, indent=2))
    else:
        print(f"{info.path}: {_gib(info.free)} free of {_gib(info.total)} ({_gib(info.used)} used)")
    if required is not None and not fits:
        # not require_shm's error: vLLM's words in MiB, which the library keeps for vLLM's tests
        remedy = "free space there or choose a larger mount"
        if os.path.normpath(info.path) == DEFAULT_SHM_PATH:
            remedy = "make it larger (docker: --shm-size or --ipc=host)"
        sizes = f"{format_bytes(info.free)} free of {format_bytes(info.total)}"
        need = f"needs {format_bytes(required)}, {info.path} has {sizes}"
        say(shown(f"accelplat shm: {name} does not fit: {need}; {remedy}"))
        return 1
    if required is not None and not args.json:
        print(f"fits: {name} needs {_gib(required)} ({required} bytes)")
    return 0


def _run_kv(args: argparse.Namespace) -> int:
    text = args.dtype.strip()
    # Bytes per element: ASCII digits only (str.isdigit() also admits '²'); else a dtype name.
    if text.isascii() and text.isdigit():
        size = parse_size(text, argument="--dtype", bare_bytes=True)
    else:
        size = _sizing.dtype_bytes(args.dtype)
    dims: dict[str, Any] = {key: getattr(args, key) for _, key, _, _ in _KV} | {"dtype_bytes": size}
    for keyword, value in dims.items():
        if value is not None and value > _MAX_KV_INT:
            raise ConfigurationError(
                f"{_FLAGS[keyword]} must be at most {_MAX_KV_INT} (2**63 - 1), "
                f"got a number of {len(str(value))} digits"
            )
    tokens, available = dims.pop("max_model_len"), args.available
    try:
        shape = _sizing.KVCacheShape(**dims)
        needed, page = shape.bytes_for(tokens), shape.page_bytes
    except ConfigurationError as exc:  # named by keyword: say the option instead
        keyword = str(exc).split(" ", 1)[0]
        raise ConfigurationError(_FLAGS.get(keyword, keyword) + str(exc)[len(keyword) :]) from None
    per_token = args.num_layers * page // args.block_size
    gib = round(needed / GIB, 4) if needed < 2**1000 else needed // GIB  # exact past a float
    longest = None if available is None else shape.longest_that_fits(available)
    error: KVCacheTooSmallError | None = None
    if available is not None:
        try:
            _sizing.check_kv_cache_fits(available, **dims, max_model_len=tokens)
        except KVCacheTooSmallError as exc:
            error = exc
    doc: dict[str, Any] = {
        "max_model_len": tokens,
        "bytes": needed,
        "gib": gib,
        "page_bytes": page,
        "bytes_per_token": per_token,
        "block_size": args.block_size,
        "dtype_bytes": size,
        "available": available,
        "fits": None if available is None else error is None,
        "max_model_len_that_fits": longest,
    }
    if args.json:
        print(dumps(doc, indent=2))
    else:
        print(f"KV cache for one request of {tokens} tokens: {needed} bytes ({_gib(needed)})")
        print(  # fits 80 columns for a 7B model's figures
            f"  {page} bytes per page ({args.block_size} tokens, 1 layer); "
            f"{per_token} bytes per token ({args.num_layers} layers)"
        )
        if available is not None and error is None:
            print(f"fits in {_gib(available)} available; longest that fits: {longest} tokens")
    if error is not None:
        say(shown(f"accelplat kv: {error}"))
        return 1
    return 0
