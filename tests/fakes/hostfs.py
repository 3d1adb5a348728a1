"""A fake host file system: ``/proc``, ``/sys`` NUMA nodes and cgroup v1/v2 trees under a tmp dir.

Files are written in the kernel's own formats (``/proc/meminfo`` and node ``meminfo`` in kB,
``/proc/self/cgroup`` as ``hierarchy:controllers:path``, cgroup files as bare integers or
``max``, ``memory.stat`` as ``key value`` lines), so the code under test parses what a real
machine shows. Sizes passed in are bytes and must be multiples of 1 KiB where the kernel
writes kB.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from accelplat import _files
from accelplat._backends.cpu import CpuPlatform

KIB = 1024
FRSIZE = 4096

V1_UNLIMITED = 0x7FFFFFFFFFFFF000
"""What cgroup v1 shows in ``memory.limit_in_bytes`` for "no limit" (4 KiB pages)."""


@contextmanager
def host_files(files: _files.HostFiles) -> Iterator[_files.HostFiles]:
    """Install ``files`` as the reader of every host file for the block."""
    previous = _files.set_host_files(files)
    try:
        yield files
    finally:
        _files.set_host_files(previous)


def _kb(value: int) -> int:
    assert value % KIB == 0, f"{value} is not a whole number of KiB"
    return value // KIB


class HostFS:
    """Build a fake host tree under ``root``.

    Attributes:
        proc: The fake ``/proc``.
        sysfs: The fake ``/sys``.
        cgroup: The fake ``/sys/fs/cgroup``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        self.sysfs = root / "sys"
        self.cgroup = self.sysfs / "fs" / "cgroup"
        (self.proc / "self").mkdir(parents=True, exist_ok=True)
        self.cgroup.mkdir(parents=True, exist_ok=True)

    # -- /proc -------------------------------------------------------------------------------

    def meminfo(
        self,
        *,
        total: int,
        available: int | None,
        free: int | None = None,
        buffers: int = 0,
        cached: int = 0,
    ) -> None:
        """Write ``/proc/meminfo``; ``available=None`` leaves out MemAvailable (old kernels)."""
        free = available if free is None and available is not None else (free or 0)
        lines = [f"MemTotal:       {_kb(total):>10} kB", f"MemFree:        {_kb(free):>10} kB"]
        if available is not None:
            lines.append(f"MemAvailable:   {_kb(available):>10} kB")
        lines += [
            f"Buffers:        {_kb(buffers):>10} kB",
            f"Cached:         {_kb(cached):>10} kB",
            "SwapCached:              0 kB",
            "HugePages_Total:       0",
            "Hugepagesize:       2048 kB",
        ]
        self.write(self.proc / "meminfo", "\n".join(lines) + "\n")

    def cpuinfo(
        self, model: str, *, key: str = "model name", cpus: int = 2, flags: str = "fpu sse"
    ) -> None:
        """Write ``/proc/cpuinfo`` with ``cpus`` processor blocks naming ``model`` and ``flags``."""
        blocks = [
            f"processor\t: {i}\nvendor_id\t: Fake\n{key}\t: {model}\nflags\t\t: {flags}\n"
            for i in range(cpus)
        ]
        self.write(self.proc / "cpuinfo", "\n".join(blocks))

    def mems_allowed(self, nodes: str) -> None:
        """Write ``/proc/self/status`` with ``Mems_allowed_list: nodes``."""
        self.write(
            self.proc / "self" / "status",
            f"Name:\tpython\nState:\tR (running)\nMems_allowed:\t00000003\n"
            f"Mems_allowed_list:\t{nodes}\n",
        )

    def proc_self_cgroup(self, text: str) -> None:
        """Write ``/proc/self/cgroup`` verbatim."""
        self.write(self.proc / "self" / "cgroup", text)

    # -- cgroup v2 ---------------------------------------------------------------------------

    def cgroup_v2(self, path: str, *, mount: str = "") -> Path:
        """Make a cgroup v2 hierarchy and put this process at ``path``.

        Args:
            path: The process's cgroup as ``/proc/self/cgroup`` shows it (``0::path``).
            mount: ``""`` for a pure v2 host (mounted at the cgroup root) or ``"unified"`` for a
                hybrid host.

        Returns:
            The mount directory.
        """
        root = self.cgroup / mount if mount else self.cgroup
        root.mkdir(parents=True, exist_ok=True)
        self.write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
        self.proc_self_cgroup(f"0::{path}\n")
        return root

    def v2_level(
        self,
        path: str,
        *,
        max: int | str | None,
        current: int | None = None,
        inactive_file: int | None = 0,
        mount: str = "",
    ) -> Path:
        """Write one v2 cgroup directory's memory files.

        Args:
            path: The cgroup path below the mount (``"/"`` is the mount itself).
            max: ``memory.max`` content: bytes, ``"max"``, any raw string, or ``None`` for no
                file (the root cgroup, or the memory controller not enabled).
            current: ``memory.current`` in bytes, or ``None`` for no file.
            inactive_file: ``inactive_file`` of ``memory.stat``, or ``None`` to leave it out.
            mount: As in :meth:`cgroup_v2`.

        Returns:
            The directory.
        """
        base = self.cgroup / mount if mount else self.cgroup
        d = base.joinpath(*[p for p in path.split("/") if p])
        d.mkdir(parents=True, exist_ok=True)
        if max is not None:
            self.write(d / "memory.max", f"{max}\n")
        if current is not None:
            self.write(d / "memory.current", f"{current}\n")
        stat = ["anon 1048576", "file 4194304", "active_file 1048576"]
        if inactive_file is not None:
            stat.append(f"inactive_file {inactive_file}")
        stat.append("slab 65536")
        self.write(d / "memory.stat", "\n".join(stat) + "\n")
        return d

    # -- cgroup v1 ---------------------------------------------------------------------------

    def cgroup_v1(self, path: str, *, controller_dir: str = "memory") -> Path:
        """Make a cgroup v1 memory hierarchy and put this process at ``path``.

        ``/proc/self/cgroup`` lists other controllers too and a v2 line ``0::/`` as on hybrid
        hosts.

        Returns:
            The memory controller's mount directory.
        """
        root = self.cgroup / controller_dir
        root.mkdir(parents=True, exist_ok=True)
        (self.cgroup / "unified").mkdir(exist_ok=True)
        self.write(self.cgroup / "unified" / "cgroup.controllers", "")
        self.proc_self_cgroup(
            f"9:name=systemd:{path}\n8:pids:{path}\n4:{controller_dir}:{path}\n"
            f"2:cpuacct:/\n1:cpu:/\n0::/\n"
        )
        return root

    def v1_level(
        self,
        path: str,
        *,
        limit: int | str | None,
        usage: int | None = None,
        total_inactive_file: int | None = 0,
        controller_dir: str = "memory",
    ) -> Path:
        """Write one v1 memory cgroup directory's files (``None`` leaves a file out)."""
        d = (self.cgroup / controller_dir).joinpath(*[p for p in path.split("/") if p])
        d.mkdir(parents=True, exist_ok=True)
        if limit is not None:
            self.write(d / "memory.limit_in_bytes", f"{limit}\n")
        if usage is not None:
            self.write(d / "memory.usage_in_bytes", f"{usage}\n")
        stat = ["cache 4194304", "rss 1048576", "inactive_file 4096"]
        if total_inactive_file is not None:
            stat.append(f"total_inactive_file {total_inactive_file}")
        self.write(d / "memory.stat", "\n".join(stat) + "\n")
        return d

    # -- NUMA --------------------------------------------------------------------------------

    def numa_node(
        self,
        node: int,
        *,
        total: int,
        free: int,
        active_file: int | None = 0,
        inactive_file: int | None = 0,
        sreclaimable: int = 0,
        file_pages: int = 0,
        shmem: int = 0,
    ) -> Path:
        """Write ``/sys/devices/system/node/node<N>/meminfo`` (``None`` leaves a line out)."""
        d = self.sysfs / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True, exist_ok=True)
        rows: list[tuple[str, int | None]] = [
            ("MemTotal", total),
            ("MemFree", free),
            ("MemUsed", total - free),
            ("Active(file)", active_file),
            ("Inactive(file)", inactive_file),
            ("FilePages", file_pages),
            ("Shmem", shmem),
            ("SReclaimable", sreclaimable),
        ]
        lines = [f"Node {node} {k + ':':<16}{_kb(v):>10} kB" for k, v in rows if v is not None]
        lines.append(f"Node {node} HugePages_Total:     0")
        self.write(d / "meminfo", "\n".join(lines) + "\n")
        return d

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def write(path: Path, text: str) -> None:
        """Write ``text`` to ``path``, creating parent directories."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def platform(self) -> CpuPlatform:
        """Return a :class:`CpuPlatform` reading this tree (through constructor arguments)."""
        return CpuPlatform(proc_root=self.proc, sysfs_root=self.sysfs, cgroup_root=self.cgroup)

    def use_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point ``ACCELPLAT_PROC_ROOT`` / ``_SYSFS_ROOT`` / ``_CGROUP_ROOT`` at this tree."""
        monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(self.proc))
        monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(self.sysfs))
        monkeypatch.setenv("ACCELPLAT_CGROUP_ROOT", str(self.cgroup))


def fake_statvfs(
    monkeypatch: pytest.MonkeyPatch,
    *,
    total: int,
    free: int,
    bfree: int | None = None,
    prefix: str = "/fake",
) -> list[str]:
    """Make ``os.statvfs`` report a tmpfs of ``total`` bytes for paths under ``prefix``.

    Args:
        monkeypatch: The test's monkeypatch.
        total: Size of the file system in bytes (``f_blocks × f_frsize``).
        free: Bytes free to unprivileged users (``f_bavail × f_frsize``).
        bfree: Bytes free including root-reserved blocks (``f_bfree``); default ``free``.
        prefix: Paths starting with it are faked; ``<prefix>/missing`` raises
            ``FileNotFoundError``; other paths reach the real ``os.statvfs``.

    Returns:
        The faked paths asked about, in order.
    """
    calls: list[str] = []
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        text = os.fspath(path)
        if not text.startswith(prefix):
            return real(text)
        calls.append(text)
        if text == f"{prefix}/missing":
            raise FileNotFoundError(2, "No such file or directory", text)
        blocks, bavail = total // FRSIZE, free // FRSIZE
        b_free = bavail if bfree is None else bfree // FRSIZE
        # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
        return os.statvfs_result((FRSIZE, FRSIZE, blocks, b_free, bavail, 1000, 900, 900, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs)
    return calls
