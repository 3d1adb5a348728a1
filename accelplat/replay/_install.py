"""Installing a recorder or a replayer at every seam: the vendor boundary and the host files.

While one is installed, :class:`BoundaryFiles` hands each host-file primitive to it as a
``file`` question (``["read", path]``, ``["listdir", path]``, ``["realpath", path]``,
``["kind", path]``) with the real file system as the live answer, and checks what comes back:
a replayed answer is untrusted.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from typing_extensions import override

from accelplat import _boundary, _files
from accelplat.errors import FileTooLargeError
from accelplat.replay._bundle import Bundle, load_bundle
from accelplat.replay._record import Recorder
from accelplat.replay._replay import Replayer

ENV_REPLAY = "ACCELPLAT_REPLAY"
_PLUGINS = "ACCELPLAT_PLUGINS"  # plugins are not part of a host: off unless captured otherwise
_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ONEAPI_DEVICE_SELECTOR",
    }
)
_KINDS = ("file", "dir", "other")


def _bad(path: str, what: str) -> OSError:
    return OSError(errno.EIO, f"the capture's answer is not {what}", path)


class BoundaryFiles(_files.HostFiles):
    """Host files answered through an interceptor (a recorder or a replayer)."""

    def __init__(self, interceptor: _boundary.Interceptor) -> None:
        self._interceptor = interceptor
        self._live = _files.HostFiles()

    @override
    def read_bytes(self, path: str, limit: int) -> bytes:
        ask = self._interceptor.call
        data: Any = ask("file", ("read", path), lambda: self._live.read_bytes(path, limit))
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes):
            raise _bad(path, "file contents")
        if len(data) > limit:
            raise FileTooLargeError(path, limit)
        return data

    @override
    def listdir(self, path: str) -> list[str]:
        names: Any = self._interceptor.call(
            "file", ("listdir", path), lambda: self._live.listdir(path)
        )
        plain = isinstance(names, list) and all(isinstance(n, str) for n in names)
        if not plain or any(not n or "/" in n or "\0" in n or n in (".", "..") for n in names):
            raise _bad(path, "a list of names")
        return list(names)

    @override
    def realpath(self, path: str) -> str:
        try:
            resolved: Any = self._interceptor.call(
                "file", ("realpath", path), lambda: self._live.realpath(path)
            )
        except FileNotFoundError:  # a replay that never resolved it: no link there
            return path
        if not isinstance(resolved, str) or "\0" in resolved:
            raise _bad(path, "a path")
        return resolved

    @override
    def kind(self, path: str) -> _files.Kind | None:
        try:
            found: Any = self._interceptor.call(
                "file", ("kind", path), lambda: self._live.kind(path)
            )
        except OSError:
            return None
        return found if found in _KINDS else None  # a tuple: unhashable answers are no kind


def relevant(name: str) -> bool:
    """Whether the variable ``name`` changes what accelplat answers (and a capture keeps it).

    These are the visible-devices variables of every vendor, Level Zero's ``ZE_*`` and
    accelplat's own ``ACCELPLAT_*``, except ``ACCELPLAT_REPLAY``.
    """
    if name == ENV_REPLAY:
        return False
    return name in _ENV_NAMES or name.startswith(("ACCELPLAT_", "ZE_"))


def _set_env(env: Mapping[str, str]) -> dict[str, str]:
    """Make the relevant variables exactly ``env``; return the ones to put back."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if relevant(k)}
    os.environ.update({_PLUGINS: "", **{k: v for k, v in env.items() if relevant(k)}})
    return saved


def _restore_env(saved: Mapping[str, str]) -> None:
    for name in [k for k in os.environ if relevant(k)]:
        del os.environ[name]
    os.environ.update(saved)


def _install(interceptor: _boundary.Interceptor) -> Callable[[], None]:
    """Route every seam through ``interceptor``; return the function that puts them back."""
    previous_files = _files.set_host_files(BoundaryFiles(interceptor))
    previous = _boundary.install(interceptor)  # caches registered with on_reset are dropped

    def undo() -> None:
        _files.set_host_files(previous_files)
        _boundary.install(previous)

    return undo


@contextmanager
def replaying(bundle: Bundle | str | os.PathLike[str]) -> Iterator[Replayer]:
    """Make this process answer from ``bundle`` for the duration of the block.

    Args:
        bundle: A loaded bundle or a path to one.

    Yields:
        The replayer (its ``bundle`` is the loaded :class:`Bundle`).

    Raises:
        BundleError: When a path names a bundle that cannot be loaded.

    Side effects:
        Sets the relevant environment variables to the captured ones (``ACCELPLAT_PLUGINS``
        empty unless captured otherwise), forgets the detected platform and the vendor
        sessions, and undoes all of it on exit.
    """
    loaded = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    replayer = Replayer(loaded)
    saved = _set_env(loaded.env)
    undo = _install(replayer)
    try:
        yield replayer
    finally:
        _restore_env(saved)
        undo()


def activate(path: str | os.PathLike[str]) -> Replayer:
    """Make the whole process answer from the bundle at ``path``, as ``ACCELPLAT_REPLAY`` does.

    Unlike :func:`replaying`, the process's own variables win: a captured variable is set only
    where the process has none (``ACCELPLAT_PLUGINS`` defaults to empty), so a process started
    by a replay, or a test that sets ``CUDA_VISIBLE_DEVICES`` over a replayed host, sees the
    variables it was given.

    Args:
        path: The bundle.

    Returns:
        The installed replayer.

    Raises:
        BundleError: When the bundle cannot be loaded.
    """
    replayer = Replayer(load_bundle(path))
    for name, value in replayer.bundle.env.items():
        if relevant(name):
            os.environ.setdefault(name, value)
    os.environ.setdefault(_PLUGINS, "")
    _install(replayer)
    return replayer


def activate_from_environment() -> Replayer | None:
    """Apply ``ACCELPLAT_REPLAY`` when it names a bundle (``import accelplat`` calls this).

    Returns:
        The installed replayer, or ``None`` when the variable is unset or empty.

    Raises:
        BundleError: When the bundle cannot be loaded.
    """
    path = os.environ.get(ENV_REPLAY, "").strip()
    return activate(path) if path else None


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Record every answer given at the vendor boundary for the duration of the block.

    Args:
        recorder: Collects the answers.

    Yields:
        ``recorder``.

    Side effects:
        Sets ``ACCELPLAT_PLUGINS`` empty (a capture describes the host, not its plugins),
        forgets the detected platform and the vendor sessions, and undoes both on exit.
    """
    saved = os.environ.get(_PLUGINS)
    os.environ[_PLUGINS] = ""
    undo = _install(recorder)
    try:
        yield recorder
    finally:
        if saved is None:
            os.environ.pop(_PLUGINS, None)
        else:
            os.environ[_PLUGINS] = saved
        undo()
