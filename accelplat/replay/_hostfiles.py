"""The host-file seam of a capture or replay: :class:`accelplat._files.HostFiles` over the boundary.

:mod:`accelplat._files` is the one reader of sysfs, procfs and cgroup files; every read, listing,
link resolution and existence check of every backend goes through its current
:class:`~accelplat._files.HostFiles`. :class:`BoundaryFiles` is the one installed while
recording or replaying: it hands each primitive to the interceptor as a ``file`` question
(``["read", path]``, ``["listdir", path]``, ``["realpath", path]``, ``["kind", path]``) with the
real file system as the live answer, and checks what comes back, since a replayed answer is
untrusted: a read must be bytes within the caller's limit, a listing a list of plain names, a
resolved path text, a kind one of ``"file"``, ``"dir"``, ``"other"`` or absent.
"""

from __future__ import annotations

import errno
from typing import Any

from accelplat._boundary import Interceptor
from accelplat._files import HostFiles, Kind
from accelplat.errors import FileTooLargeError

__all__ = ["BoundaryFiles"]

_KINDS = frozenset({"file", "dir", "other"})


def _bad(path: str, what: str) -> OSError:
    return OSError(errno.EIO, f"the capture's answer is not {what}", path)


class BoundaryFiles(HostFiles):
    """Host files answered through an interceptor (a recorder or a replayer).

    Args:
        interceptor: Where each question goes.
    """

    def __init__(self, interceptor: Interceptor) -> None:
        self._interceptor = interceptor
        self._live = HostFiles()

    def read_bytes(self, path: str, limit: int) -> bytes:
        """Return the file's bytes (see :meth:`HostFiles.read_bytes`)."""
        data: Any = self._interceptor.call(
            "file", ("read", path), lambda: self._live.read_bytes(path, limit)
        )
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes):
            raise _bad(path, "file contents")
        if len(data) > limit:
            raise FileTooLargeError(path, limit)
        return data

    def listdir(self, path: str) -> list[str]:
        """Return the directory's names (see :meth:`HostFiles.listdir`)."""
        names: Any = self._interceptor.call(
            "file", ("listdir", path), lambda: self._live.listdir(path)
        )
        if not isinstance(names, list) or not all(
            isinstance(n, str) and n and "/" not in n and "\0" not in n and n not in (".", "..")
            for n in names
        ):
            raise _bad(path, "a list of names")
        return list(names)

    def realpath(self, path: str) -> str:
        """Return the path with links resolved (see :meth:`HostFiles.realpath`)."""
        try:
            resolved: Any = self._interceptor.call(
                "file", ("realpath", path), lambda: self._live.realpath(path)
            )
        except FileNotFoundError:  # a replay that never resolved it: no link there
            return path
        if not isinstance(resolved, str) or "\0" in resolved:
            raise _bad(path, "a path")
        return resolved

    def kind(self, path: str) -> Kind | None:
        """Return what ``path`` is, or ``None`` (see :meth:`HostFiles.kind`)."""
        try:
            found: Any = self._interceptor.call(
                "file", ("kind", path), lambda: self._live.kind(path)
            )
        except OSError:
            return None
        if found is None or found in _KINDS:
            result: Kind | None = found
            return result
        return None
