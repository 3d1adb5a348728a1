"""Shared-memory (``/dev/shm``) budgets on the host.

Engines put inter-process buffers there (vLLM's broadcast queue, its CPU KV offload), while
containers start with a small one (Docker: 64 MiB) and CI workers fill it: :func:`shm_info`,
:func:`require_shm` and :func:`largest_shm_budget` ask first.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass

from accelplat._types import MIB
from accelplat._util import printable
from accelplat._validate import integer
from accelplat.errors import ConfigurationError, InsufficientSharedMemoryError

DEFAULT_SHM_PATH = "/dev/shm"  # the POSIX shared-memory mount on Linux
MAX_CANDIDATES = 10_000  # largest_shm_budget reads no more: an endless iterable must not hang


@dataclass(frozen=True)
class ShmInfo:
    """Space on a shared-memory mount, in bytes.

    Attributes:
        path: The mount (or any path on it) that was asked about.
        total: Size of the file system (``f_blocks × f_frsize``).
        free: Bytes an unprivileged process can still write (``f_bavail × f_frsize``).
        used: Bytes in use (``(f_blocks − f_bfree) × f_frsize``).
    """

    path: str
    total: int
    free: int
    used: int

    def fits(self, required_bytes: int, *, headroom_bytes: int = 0) -> bool:
        """Return whether ``required_bytes`` plus ``headroom_bytes`` fit in :attr:`free`."""
        return required_bytes + headroom_bytes <= self.free


def _mib(n: int) -> str:
    if n >= 2**1000:  # beyond a float: whole MiB, exactly, while str() can write them
        whole = n // MIB
        return str(whole) if whole.bit_length() < 14_000 else f"more than 2**{14_000 - 1}"
    return f"{n / MIB:.0f}" if n >= 10 * MIB else f"{n / MIB:.2f}"


def shm_info(path: str | os.PathLike[str] = DEFAULT_SHM_PATH) -> ShmInfo:
    """Return the size, free and used space of a shared-memory mount (one ``os.statvfs``).

    Args:
        path: The mount, or any existing path on it.

    Raises:
        ConfigurationError: When ``path`` is not a path, does not exist or cannot be queried.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise ConfigurationError(f"path must be a str or os.PathLike, got {path!r:.200}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ConfigurationError(f"path must be a non-empty path, got {path!r:.200}")
    try:
        st = os.statvfs(text)
    except FileNotFoundError:
        raise ConfigurationError(f"path {text!r:.200} does not exist") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigurationError(f"path {text!r:.200} cannot be queried: {exc}"[:400]) from None
    return ShmInfo(
        path=text,
        total=st.f_blocks * st.f_frsize,
        free=st.f_bavail * st.f_frsize,
        used=max(0, st.f_blocks - st.f_bfree) * st.f_frsize,
    )


def require_shm(
    required_bytes: int,
    name: str = "shared-memory buffer",
    *,
    path: str | os.PathLike[str] = DEFAULT_SHM_PATH,
) -> ShmInfo:
    """Check that ``required_bytes`` fit in the free space of a shared-memory mount.

    Args:
        required_bytes: Bytes the buffer needs (``int``, ``>= 0``).
        name: What the buffer is, for the message (e.g. ``"CPU KV offload shared region"``).
        path: The mount.

    Returns:
        The :class:`ShmInfo` read (one ``os.statvfs``; nothing is allocated).

    Raises:
        InsufficientSharedMemoryError: When it does not fit, worded as vLLM's message.
        ConfigurationError: For a bad ``required_bytes``, ``name`` or ``path``.
    """
    required = integer(required_bytes, "required_bytes", minimum=0)
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"name must be a non-empty str, got {name!r:.200}")
    info = shm_info(path)
    if info.fits(required):
        return info
    shown = printable(info.path)[:200]  # path and name escaped, 200 characters
    advice = f"Free space on {shown} or choose a larger mount."
    if os.path.normpath(info.path) == DEFAULT_SHM_PATH:
        advice = f"Increase {shown} (e.g. --shm-size or --ipc=host)."
    raise InsufficientSharedMemoryError(
        f"Insufficient space in {shown} for {printable(name)[:200]}: "
        f"{_mib(required)} MiB required, {_mib(info.free)} MiB free. {advice}",
        required=required,
        free=info.free,
        path=info.path,
    )


def largest_shm_budget(
    candidates: Iterable[int],
    *,
    path: str | os.PathLike[str] = DEFAULT_SHM_PATH,
    headroom_bytes: int = 0,
) -> int | None:
    """Return the largest candidate budget that fits on a shared-memory mount now.

    Args:
        candidates: Budgets in bytes, any order (each an ``int > 0``; 1 to :data:`MAX_CANDIDATES`).
        path: The mount.
        headroom_bytes: Bytes to leave free besides the budget (``int >= 0``).

    Returns:
        The largest ``c`` with ``c + headroom_bytes <= free`` (one ``os.statvfs``), or ``None``.

    Raises:
        ConfigurationError: For empty or bad ``candidates``, a bad ``headroom_bytes`` or ``path``.
    """
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise ConfigurationError(
            f"candidates must be an iterable of byte counts, got {candidates!r:.200}"
        )
    read = itertools.islice(candidates, MAX_CANDIDATES + 1)
    budgets = [integer(c, f"candidates[{i}]", minimum=1) for i, c in enumerate(read)]
    if not budgets:
        raise ConfigurationError("candidates must name at least one budget, got none")
    if len(budgets) > MAX_CANDIDATES:
        raise ConfigurationError(f"candidates must name at most {MAX_CANDIDATES} budgets")
    headroom = integer(headroom_bytes, "headroom_bytes", minimum=0)
    info = shm_info(path)
    return max((b for b in budgets if info.fits(b, headroom_bytes=headroom)), default=None)
