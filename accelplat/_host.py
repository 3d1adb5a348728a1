"""Shared-memory (``/dev/shm``) budgets on the host.

Engines put inter-process buffers in ``/dev/shm``: vLLM's multiprocess executor its broadcast
queue, its CPU KV offload the whole offloaded cache. Containers start with a small ``/dev/shm``
(Docker's default is 64 MiB) and shared CI workers fill it, so a test asks first: how much is
free (:func:`shm_info`), does my budget fit (:func:`require_shm`), and if not, what is the
largest of my candidate budgets that does (:func:`largest_shm_budget`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from accelplat._types import MIB
from accelplat._validate import byte_int
from accelplat.errors import ConfigurationError, InsufficientSharedMemoryError

DEFAULT_SHM_PATH = "/dev/shm"  # the POSIX shared-memory mount on Linux


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


def _check_path(path: object) -> str:
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise ConfigurationError(f"path must be a str or os.PathLike, got {path!r}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ConfigurationError(f"path must be a non-empty path, got {path!r}")
    if "\0" in text:
        raise ConfigurationError(f"path must not contain a NUL character, got {path!r}")
    return text


def _mib(n: int) -> str:
    if n >= 2**1000:  # beyond a float: whole MiB, exactly
        return str(n // MIB)
    return f"{n / MIB:.0f}" if n >= 10 * MIB else f"{n / MIB:.2f}"


def shm_info(path: str | os.PathLike[str] = DEFAULT_SHM_PATH) -> ShmInfo:
    """Return the size, free and used space of a shared-memory mount.

    Args:
        path: The mount, or any existing path on it; default ``/dev/shm``.

    Returns:
        A :class:`ShmInfo` in bytes.

    Raises:
        ConfigurationError: When ``path`` is not a path, does not exist or cannot be queried
            (the message names ``path``).

    Side effects:
        One ``os.statvfs`` call.
    """
    text = _check_path(path)
    try:
        st = os.statvfs(text)
    except FileNotFoundError:
        raise ConfigurationError(f"path {text!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"path {text!r} cannot be queried: {exc}") from None
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
        path: The mount; default ``/dev/shm``.

    Returns:
        The :class:`ShmInfo` read, when the budget fits.

    Raises:
        InsufficientSharedMemoryError: When it does not fit, worded as vLLM words it:
            ``"Insufficient space in /dev/shm for {name}: X MiB required, Y MiB free. Increase
            /dev/shm (e.g. --shm-size or --ipc=host)."`` The container hint is given for
            ``/dev/shm`` only.
        ConfigurationError: For a bad ``required_bytes``, ``name`` or ``path``.

    Side effects:
        One ``os.statvfs`` call; nothing is allocated.
    """
    required = byte_int(required_bytes, "required_bytes")
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"name must be a non-empty str, got {name!r}")
    info = shm_info(path)
    if info.fits(required):
        return info
    raise shortage_error(info, required, name)


def shortage_error(info: ShmInfo, required_bytes: int, name: str) -> InsufficientSharedMemoryError:
    """Return (not raise) the error :func:`require_shm` raises when ``required_bytes`` do not fit.

    Args:
        info: The mount as read.
        required_bytes: Bytes asked for.
        name: What the buffer is.

    Returns:
        An :class:`InsufficientSharedMemoryError` with vLLM's wording.
    """
    if os.path.normpath(info.path) == DEFAULT_SHM_PATH:
        advice = f"Increase {info.path} (e.g. --shm-size or --ipc=host)."
    else:
        advice = f"Free space on {info.path} or choose a larger mount."
    return InsufficientSharedMemoryError(
        f"Insufficient space in {info.path} for {name}: {_mib(required_bytes)} MiB required, "
        f"{_mib(info.free)} MiB free. {advice}",
        required=required_bytes,
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

    Typical use: a test wants a 4 GiB CPU KV offload region but shared CI workers have
    1.4–2.1 GiB free; ``largest_shm_budget([4 * GIB, 2 * GIB, GIB])`` picks 1 GiB there (and
    2 GiB on a worker with 2.1 GiB free), or ``None`` so the test can skip.

    Args:
        candidates: Budgets in bytes, in any order (each an ``int > 0``; at least one).
        path: The mount; default ``/dev/shm``.
        headroom_bytes: Bytes to leave free besides the budget (``int >= 0``).

    Returns:
        The largest candidate ``c`` with ``c + headroom_bytes <= free``, or ``None`` when none
        fits.

    Raises:
        ConfigurationError: For an empty or bad ``candidates``, a bad ``headroom_bytes`` or
            ``path``; the message names the argument.

    Side effects:
        One ``os.statvfs`` call.
    """
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise ConfigurationError(
            f"candidates must be an iterable of byte counts, got {candidates!r}"
        )
    budgets = [byte_int(c, f"candidates[{i}]", positive=True) for i, c in enumerate(candidates)]
    if not budgets:
        raise ConfigurationError("candidates must name at least one budget, got none")
    headroom = byte_int(headroom_bytes, "headroom_bytes")
    info = shm_info(path)
    fitting = [b for b in budgets if info.fits(b, headroom_bytes=headroom)]
    return max(fitting) if fitting else None
