"""Installing a recorder or a replayer at every seam: the vendor boundary and the host files.

:class:`BoundaryFiles` asks each host-file primitive as a ``file`` question (``["read", path]``,
``["listdir", path]``, ``["realpath", path]``, ``["kind", path]``) and checks what comes back.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from accelplat import _boundary, _files
from accelplat._platform import override
from accelplat._registry import host_variables
from accelplat._replay._bundle import TABLES, Bundle, load_bundle
from accelplat._replay._record import Recorder
from accelplat._replay._replay import Replayer
from accelplat._util import set_environ
from accelplat.errors import BundleError, FileTooLargeError

ENV_REPLAY = "ACCELPLAT_REPLAY"
_PLUGINS = "ACCELPLAT_PLUGINS"  # plugins are not part of a host: a replay loads none
GRANT_VARIABLES: tuple[str, ...] = tuple(TABLES["grant_variables"])
"""What an outer scheduler sets for a job's GPUs (the device plugin's ``NVIDIA_VISIBLE_DEVICES``:
``all``, ``none``, ``void``, indices or UUIDs)."""


def _bad(path: str, what: str) -> OSError:
    return OSError(errno.EIO, f"the capture's answer is not {what}", path)


class BoundaryFiles(_files.HostFiles):
    """Host files answered through an interceptor; a replayed answer is untrusted."""

    def __init__(self, interceptor: _boundary.Interceptor) -> None:
        self._interceptor = interceptor
        self._live = _files.HostFiles()

    def _ask(self, question: str, path: str, live: Callable[[], Any]) -> Any:
        return self._interceptor.call("file", (question, path), live)

    @override
    def read_bytes(self, path: str, limit: int) -> bytes:
        data = self._ask("read", path, lambda: self._live.read_bytes(path, limit))
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes):
            raise _bad(path, "file contents")
        if len(data) > limit:
            raise FileTooLargeError(path, limit)
        return data

    @override
    def listdir(self, path: str) -> list[str]:
        names = self._ask("listdir", path, lambda: self._live.listdir(path))
        plain = isinstance(names, list) and all(isinstance(n, str) for n in names)
        if not plain or any(not n or "/" in n or "\0" in n or n in (".", "..") for n in names):
            raise _bad(path, "a list of names")
        return list(names)

    @override
    def realpath(self, path: str) -> str:
        try:
            resolved = self._ask("realpath", path, lambda: self._live.realpath(path))
        except FileNotFoundError:  # a replay that never resolved it: no link there
            return path
        if not isinstance(resolved, str) or "\0" in resolved:
            raise _bad(path, "a path")
        return resolved

    @override
    def kind(self, path: str) -> _files.Kind | None:
        try:
            found = self._ask("kind", path, lambda: self._live.kind(path))
        except OSError:
            return None
        return found if found in ("file", "dir", "other") else None  # a tuple: no hashing


def considered() -> tuple[str, ...]:
    """The variables a capture records and a replay may apply.

    Those the backends declare (visible devices, their order, the roots of the host's files;
    see :data:`accelplat._registry.BUILTINS`), ``ACCELPLAT_PLATFORM`` and a scheduler's grant.
    """
    return tuple(dict.fromkeys((*host_variables(), *GRANT_VARIABLES)))


def applied(bundle: Bundle) -> dict[str, str | None]:
    """Return the variables a replay of ``bundle`` sets (``None``: unsets), by name.

    Exactly those the capture considered (a bundle that does not say: all of
    :func:`considered`), less any not in :func:`considered`: a bundle chooses devices, their
    order and the roots of the host's files (read from the bundle alone), never a path where
    accelplat writes, reads a user's file or loads a library (``ACCELPLAT_LEASE_DIR``,
    ``ACCELPLAT_SIMULATED_SPEC``, ``ACCELPLAT_LEVEL_ZERO_LIB`` …). Plugins are off.
    """
    known = considered()
    names = [n for n in (bundle.variables or known) if n in known]
    return {**{n: bundle.env.get(n) for n in names}, _PLUGINS: ""}


def _install(interceptor: _boundary.Interceptor) -> Callable[[], None]:
    previous_files = _files.set_host_files(BoundaryFiles(interceptor))
    previous = _boundary.install(interceptor)  # caches registered with on_reset are dropped

    def undo() -> None:
        _files.set_host_files(previous_files)
        _boundary.install(previous)

    return undo


@contextmanager
def _installed(interceptor: _boundary.Interceptor, env: dict[str, str | None]) -> Iterator[None]:
    """Set the variables ``env`` (``None``: unset) and install ``interceptor`` within the block."""
    restore, undo = set_environ(env), _install(interceptor)
    try:
        yield
    finally:
        restore()
        undo()


@contextmanager
def replaying(bundle: Bundle | str | os.PathLike[str]) -> Iterator[Replayer]:
    """Make this process answer from ``bundle`` (loaded, or a path) within the block.

    Yields:
        The replayer (its ``bundle`` is the loaded :class:`Bundle`).

    Raises:
        BundleError: When a path names a bundle that cannot be loaded.

    Side effects:
        Sets the variables of :func:`applied` as captured, forgets the detected platform and
        vendor sessions; all undone on exit.
    """
    replayer = Replayer(bundle if isinstance(bundle, Bundle) else load_bundle(bundle))
    with _installed(replayer, applied(replayer.bundle)):
        yield replayer


def activate(path: str | os.PathLike[str]) -> Replayer:
    """Make the whole process answer from the bundle at ``path``, as ``ACCELPLAT_REPLAY`` does.

    Unlike :func:`replaying`, the process's own variables win: a captured one (of
    :func:`applied`) is set only where the process has none.

    Raises:
        BundleError: When the bundle cannot be loaded.
    """
    replayer = Replayer(load_bundle(path))
    for name, value in applied(replayer.bundle).items():
        if value is not None:
            os.environ.setdefault(name, value)
    _install(replayer)
    return replayer


class _Unloadable:
    """Stands in for a replay whose bundle cannot be loaded: every question raises its error."""

    def __init__(self, error: BundleError) -> None:
        self.failure = error  # _boundary.check() raises it too

    def call(self, *_: Any) -> Any:
        raise self.failure.with_traceback(None)

    vendor = call


def activate_from_environment() -> Replayer | None:
    """Apply ``ACCELPLAT_REPLAY`` (``import accelplat`` calls this); ``None`` when it is unset.

    Never raises: a bundle that cannot be loaded installs, in place of the host, an interceptor
    that raises its :class:`~accelplat.errors.BundleError` at the first question, so a CLI
    command reports it as a configuration error.
    """
    path = os.environ.get(ENV_REPLAY, "").strip()
    if not path:
        return None
    try:
        return activate(path)
    except BundleError as exc:
        _install(_Unloadable(exc))
        return None


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Record every answer given at the vendor boundary into ``recorder`` within the block.

    Side effects:
        Sets ``ACCELPLAT_PLUGINS`` empty (a capture describes the host, not its plugins) and
        forgets the detected platform and vendor sessions; both undone on exit.
    """
    with _installed(recorder, {_PLUGINS: ""}):
        yield recorder
