"""The ``cpu`` platform: host memory, aware of cgroup limits and NUMA nodes; it never fails to load.

One device, or one per NUMA node this process may allocate from (vLLM's CPU worker binds to one);
memory is bounded by the smallest cgroup limit (v2 or v1) on this process's path.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from time import monotonic as _monotonic
from typing import Any, ClassVar, NamedTuple, TypeVar, cast

from accelplat import _boundary, _files
from accelplat._backends._common import (
    ENV_PROC_ROOT,
    ENV_SYSFS_ROOT,
    checked_memory,
    host_meminfo,
    parse_int_values,
    parse_kb_table,
    parse_key_values,
    read_or_empty,
)
from accelplat._platform import BasePlatform, override
from accelplat._types import DeviceInfo, FeatureRule, GraphSupport, MemoryInfo, ProbeResult
from accelplat.errors import BackendError, DeviceNotFoundError

_join = os.path.join

ENV_CGROUP_ROOT = "ACCELPLAT_CGROUP_ROOT"

_T = TypeVar("_T")

_V1_UNLIMITED = 1 << 62  # cgroup v1's "no limit" is a page-aligned value near 2**63

_UTILIZATION_CAP_PERCENT = 92
_UTILIZATION_FLOOR_PERCENT = 5
_UTILIZATION_MARGIN_PERCENT = 90

_NODE_DIR_RE = re.compile(r"^node(\d+)$")
_MEMTOTAL = frozenset({"MemTotal"})
_CPU_MODEL_KEYS = ("model name", "Model", "Hardware", "cpu model", "cpu", "uarch")
_CPU_FLAG_KEYS = ("flags", "Features")  # x86 and Arm spellings in /proc/cpuinfo

# The x86-64 psABI levels, highest first, and the /proc/cpuinfo flags each adds to the lower.
X86_64_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
    ("x86-64-v3", frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"})),
    ("x86-64-v2", frozenset({"cx16", "popcnt", "sse4_1", "sse4_2", "ssse3"})),
)


def _machine() -> str:
    """Return ``uname -m``, through the vendor boundary (a replay gives the captured host's)."""
    import platform  # on use: ~2 ms

    answer = _boundary.call("host", ("machine",), platform.machine)
    return answer if isinstance(answer, str) else ""


def _psutil_memory() -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def cpu_isa(machine: str, flags: frozenset[str] | None) -> str | None:
    """Return the x86-64 level ``/proc/cpuinfo``'s ``flags`` show, else ``machine``, or ``None``."""
    name = machine.strip().lower()
    if name in ("x86_64", "amd64") and flags is not None:
        met = [lv for lv, _ in itertools.takewhile(lambda lv: lv[1] <= flags, X86_64_LEVELS[::-1])]
        return met[-1] if met else "x86_64"
    return name or None


class _CgroupLimit(NamedTuple):
    version: str  # "cgroup-v2" or "cgroup-v1"
    limit: int  # the smallest limit on the path
    headroom: int  # the smallest limit - charge over every limited level, at least 0


class _Roots(NamedTuple):
    """Where ``/proc``, ``/sys`` and the cgroup tree are."""

    proc: str
    sysfs: str
    cgroup: str


def utilization_with_margin(free: int, total: int) -> float:
    """Return the memory utilization an engine can ask for now and still start.

    vLLM's CPU worker refuses to start when ``ceil(total × utilization)`` exceeds the available
    memory: 90 % of ``free / total`` (a margin for what it allocates before it checks), rounded
    *down* to a hundredth, in [0.05, 0.92] (the engine's default; below 0.05 no engine is useful).
    """
    if total <= 0:
        return _UTILIZATION_FLOOR_PERCENT / 100
    percent = (_UTILIZATION_MARGIN_PERCENT * max(0, free)) // total  # exact integer floor
    percent = max(_UTILIZATION_FLOOR_PERCENT, min(_UTILIZATION_CAP_PERCENT, percent))
    return percent / 100


def _read_text(path: str) -> str:
    return _files.read_text(path, limit=_files.PROC_LIMIT)


def _nonnegative(text: str) -> int:
    """Read a cgroup file's number; ``ValueError`` (the cgroup is unusable) if it is none."""
    value = int(text)
    if value < 0:
        raise ValueError(f"a negative value {value}")
    return value


def _node_dirs(roots: _Roots) -> list[tuple[int, str]]:
    """Return each ``nodeN`` directory of the sysfs root and its ``N``; ``[]`` where unreadable."""
    base = _join(roots.sysfs, "devices", "system", "node")
    with contextlib.suppress(OSError):
        names = sorted(_files.listdir(base))
        return [(int(m.group(1)), _join(base, n)) for n in names if (m := _NODE_DIR_RE.match(n))]
    return []


def _bounded(
    where: str, free: int, total: int, source: str, cgroup: _CgroupLimit | None
) -> MemoryInfo:
    """Return the checked reading of ``free`` of ``total``, within ``cgroup``'s limit if any."""
    if cgroup is not None:
        total = min(total, cgroup.limit)
        free = min(free, cgroup.headroom, total)
    return checked_memory("cpu", where, free=free, total=total, used=total - free, source=source)


class CpuPlatform(BasePlatform):
    """Host memory: cgroup-aware, one device per NUMA node; roots not given are read per query."""

    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    is_accelerator: ClassVar[bool] = False
    GRAPH: ClassVar[GraphSupport] = GraphSupport(False, None, "CPU has no graph capture")
    # Seconds the NUMA nodes and the limited cgroup levels (which files to read) are reused;
    # memory figures are read on every query.
    STRUCTURE_TTL_S: ClassVar[float] = 1.0
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {
        "bf16": (FeatureRule(note="computed by torch on any CPU"),),
    }

    def __init__(
        self,
        *,
        proc_root: str | os.PathLike[str] | None = None,
        cgroup_root: str | os.PathLike[str] | None = None,
        sysfs_root: str | os.PathLike[str] | None = None,
    ) -> None:
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._sysfs_root = sysfs_root
        # Reused for STRUCTURE_TTL_S under the same roots: the NUMA nodes, and the cgroup version
        # with the levels that carry a limit; never figures.
        self._seen: dict[str, tuple[_Roots, float, Any]] = {}

    @classmethod
    @override
    def probe(cls) -> ProbeResult:
        """Return available: every machine has host memory."""
        return ProbeResult(True, "host memory is always available (cgroup- and NUMA-aware)")

    def _roots(self) -> _Roots:
        norm = os.path.normpath
        proc = norm(self._proc_root or os.environ.get(ENV_PROC_ROOT) or "/proc")
        sysfs = norm(self._sysfs_root or os.environ.get(ENV_SYSFS_ROOT) or "/sys")
        cgroup = self._cgroup_root or os.environ.get(ENV_CGROUP_ROOT)
        return _Roots(proc, sysfs, norm(cgroup) if cgroup else _join(sysfs, "fs", "cgroup"))

    def _structure(self, what: str, roots: _Roots, scan: Callable[[_Roots], _T]) -> _T:
        """Return ``scan(roots)``, reused for ``STRUCTURE_TTL_S`` while the roots stay the same."""
        now = _monotonic()
        seen = self._seen.get(what)
        if seen is not None and seen[0] == roots and now < seen[1]:
            return cast(_T, seen[2])
        value = scan(roots)
        self._seen[what] = (roots, now + self.STRUCTURE_TTL_S, value)
        return value

    def _scan_numa_nodes(self, roots: _Roots) -> tuple[int, ...]:
        """Return the NUMA nodes to show as devices, or ``()`` for "the host is one device"."""
        candidates = _node_dirs(roots)
        if len(candidates) < 2:
            return ()  # one node (or none): the host is the device, nothing more to read
        nodes: list[int] = []
        for node, path in candidates:
            with contextlib.suppress(OSError):
                table = parse_kb_table(_read_text(_join(path, "meminfo")), skip=2, keys=_MEMTOTAL)
                if table.get("MemTotal", 0) > 0:
                    nodes.append(node)
        if len(nodes) < 2:
            return ()
        allowed = self._mems_allowed(roots)
        kept = [n for n in nodes if n in allowed]
        return tuple(sorted(kept or nodes))

    @staticmethod
    def _mems_allowed(roots: _Roots) -> set[int]:
        with contextlib.suppress(OSError, KeyError, ValueError):
            status = parse_key_values(_read_text(_join(roots.proc, "self", "status")), sep=":")
            mems = status["Mems_allowed_list"]
            return _files.parse_id_list(mems, limit=_files.MAX_NUMA_NODES, what="Mems_allowed_list")
        return set()

    @staticmethod
    def _cpu_identity(roots: _Roots) -> tuple[str, str | None]:
        """Return the CPU's model name and instruction-set name from ``/proc/cpuinfo``."""
        text = read_or_empty(_join(roots.proc, "cpuinfo"), limit=_files.PROC_LIMIT)
        found: dict[str, str] = {}
        flags: frozenset[str] | None = None
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if sep and value and key in _CPU_MODEL_KEYS and key not in found:
                found[key] = value
            elif sep and key in _CPU_FLAG_KEYS and flags is None:
                flags = frozenset(value.split())
            if _CPU_MODEL_KEYS[0] in found and flags is not None:
                break  # the other processors repeat both
        machine = _machine()
        model = next((found[key] for key in _CPU_MODEL_KEYS if key in found), None)
        return model or (f"cpu ({machine})" if machine else "cpu"), cpu_isa(machine, flags)

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the host as device 0, or one per allowed NUMA node (``physical_index``)."""
        roots = self._roots()
        model, arch = self._cpu_identity(roots)
        nodes = self._structure("nodes", roots, self._scan_numa_nodes)
        if not nodes:
            return (DeviceInfo(0, 0, model, arch=arch),)
        return tuple(
            DeviceInfo(i, node, f"{model} (node {node})", arch=arch) for i, node in enumerate(nodes)
        )

    @override
    def device_count(self) -> int:
        """Return 1, or the number of allowed NUMA nodes on a multi-node machine."""
        return max(1, len(self._structure("nodes", self._roots(), self._scan_numa_nodes)))

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        roots = self._roots()
        nodes = self._structure("nodes", roots, self._scan_numa_nodes)
        cgroup = self._cgroup_limit(roots)
        if not nodes:
            return self._host_memory(roots, cgroup)
        if device >= len(nodes):  # a node went away since the index was checked
            raise DeviceNotFoundError(device, len(nodes), self.name)
        return self._node_memory(roots, nodes[device], cgroup)

    def _host_memory(self, roots: _Roots, cgroup: _CgroupLimit | None) -> MemoryInfo:
        total, available, source, where = self._meminfo(roots)
        # The host's own figures first, as read: free above total or a wrapped counter is not
        # clamped into a plausible-looking answer (the one rule, accelplat._backends._common).
        used = max(0, total - available)
        read = checked_memory("cpu", where, free=available, total=total, used=used, source=source)
        if cgroup is None:
            return read
        where = f"{where} within the {cgroup.version} limit"
        return _bounded(where, available, total, cgroup.version, cgroup)

    def _node_memory(self, roots: _Roots, node: int, cgroup: _CgroupLimit | None) -> MemoryInfo:
        path = _join(roots.sysfs, "devices", "system", "node", f"node{node}", "meminfo")
        try:
            table = parse_kb_table(_read_text(path), skip=2)
        except OSError as exc:
            why = f"cannot read NUMA node {node} memory from {path}: {exc}"
            raise BackendError("cpu", why) from exc
        if "MemTotal" not in table or "MemFree" not in table:
            raise BackendError("cpu", f"NUMA node {node}: {path} has no MemTotal/MemFree lines")
        total, mem_free = table["MemTotal"], table["MemFree"]
        where = f"NUMA node {node} ({path})"
        # The node's own figures, as read, must be possible (the one rule) ...
        source, used = "numa-node", max(0, total - mem_free)
        checked_memory("cpu", where, free=mem_free, total=total, used=used, source=source)
        if "Active(file)" in table and "Inactive(file)" in table:
            available = mem_free + table["Active(file)"] + table["Inactive(file)"]
        else:
            available = mem_free + max(0, table.get("FilePages", 0) - table.get("Shmem", 0))
        available += table.get("SReclaimable", 0)
        free = min(available, total)  # an estimate of what could be freed, at most the node
        source += f"+{cgroup.version}" if cgroup is not None else ""
        return _bounded(where, free, total, source, cgroup)  # ... and so must what is made of them

    @staticmethod
    def _meminfo(roots: _Roots) -> tuple[int, int, str, str]:
        """Return ``(MemTotal, MemAvailable, source, where read)``, bytes as read (unchecked)."""
        with contextlib.suppress(OSError):
            if (meminfo := host_meminfo(roots.proc)) is not None:
                return meminfo.total, meminfo.available, "meminfo", meminfo.path
        # Asked through the vendor boundary, so a replay answers with the captured host's.
        answer = _boundary.call("host", ("virtual_memory",), _psutil_memory)
        if (
            not isinstance(answer, (tuple, list))
            or len(answer) != 2
            or not all(type(v) is int and v >= 0 for v in answer)
        ):
            why = "host memory is unknown: /proc/meminfo is unreadable and psutil gave no answer"
            raise BackendError("cpu", why)
        return answer[0], answer[1], "psutil", "psutil.virtual_memory()"

    def _cgroup_limit(self, roots: _Roots) -> _CgroupLimit | None:
        """Return the binding cgroup limit, or ``None`` when unlimited or unusable."""
        limited = self._structure("cgroup", roots, self._limited_levels)
        with contextlib.suppress(OSError, ValueError):  # a file missing where it must be, malformed
            return None if limited is None else self._limit_over(*limited)
        return None

    def _limited_levels(self, roots: _Roots) -> tuple[str, tuple[str, ...]] | None:
        """Return the cgroup version and this process's levels that carry a memory limit."""
        with contextlib.suppress(OSError, ValueError):
            return self._cgroup_levels(roots)
        return None

    def _cgroup_levels(self, roots: _Roots) -> tuple[str, tuple[str, ...]] | None:
        """Return the cgroup version and this process's limited levels, leaf first."""
        v2_path: str | None = None
        v1_path: str | None = None
        for line in _read_text(_join(roots.proc, "self", "cgroup")).splitlines():
            parts = line.strip().split(":", 2)
            if len(parts) != 3:
                continue
            hierarchy, controllers, path = parts
            if hierarchy == "0" and controllers == "":
                v2_path = path
            elif "memory" in controllers.split(","):
                v1_path = path
        # A memory controller bound to a v1 hierarchy is not available on v2.
        if v1_path is not None:
            mount = self._v1_memory_mount(roots.cgroup)
            if mount is not None:
                return "cgroup-v1", self._levels(mount, v1_path, "cgroup-v1")
        if v2_path is not None:
            for mount in (roots.cgroup, _join(roots.cgroup, "unified")):
                if _files.is_file(_join(mount, "cgroup.controllers")):
                    return "cgroup-v2", self._levels(mount, v2_path, "cgroup-v2")
        return None

    @staticmethod
    def _v1_memory_mount(root: str) -> str | None:
        names = ["memory"]  # its own mount first, then co-mounted controllers, e.g. "cpu,memory"
        with contextlib.suppress(OSError):
            names += sorted(_files.listdir(root))
        for name in names:
            if "memory" in name.split(",") and _files.is_dir(_join(root, name)):
                return _join(root, name)
        return None

    @classmethod
    def _levels(cls, mount: str, cgroup_path: str, version: str) -> tuple[str, ...]:
        """Return this process's cgroup directory and those above it up to ``mount``, limited."""
        # Inside a cgroup namespace, or when a container sees only its own subtree mounted, the
        # path in /proc/self/cgroup names directories above the mount: drop leading parts.
        parts = [p for p in cgroup_path.split("/") if p and p != "."]
        tails = [] if ".." in parts else [_join(mount, *parts[i:]) for i in range(len(parts))]
        levels = [next((d for d in tails if _files.is_dir(d)), mount)]
        while levels[-1] != mount:
            levels.append(os.path.dirname(levels[-1]))
        return tuple(d for d in levels if cls._level_limit(d, version) is not None)

    def _limit_over(self, version: str, levels: Sequence[str]) -> _CgroupLimit | None:
        """Return the binding limit over ``levels``: the smallest limit, the smallest room."""
        limited = [(lim, d) for d in levels if (lim := self._level_limit(d, version)) is not None]
        if not limited:
            return None
        rooms = [max(0, lim - self._level_charge(d, version)) for lim, d in limited]
        return _CgroupLimit(version, min(lim for lim, _ in limited), min(rooms))

    @staticmethod
    def _level_limit(level: str, version: str) -> int | None:
        v2 = version == "cgroup-v2"
        path = _join(level, "memory.max" if v2 else "memory.limit_in_bytes")
        try:
            text = _read_text(path).strip()
        except FileNotFoundError:
            return None  # the root cgroup, or a level without the memory controller
        if v2 and text == "max":
            return None
        value = _nonnegative(text)
        return None if not v2 and value >= _V1_UNLIMITED else value

    @staticmethod
    def _level_charge(level: str, version: str) -> int:
        v2 = version == "cgroup-v2"
        current = "memory.current" if v2 else "memory.usage_in_bytes"
        usage = _nonnegative(_read_text(_join(level, current)))
        stat = parse_int_values(parse_key_values(_read_text(_join(level, "memory.stat"))))
        keys = ("inactive_file",) if v2 else ("total_inactive_file", "inactive_file")
        inactive = [stat[key] for key in keys if key in stat]
        if not inactive:
            raise ValueError("memory.stat has no inactive_file line")
        return max(0, usage - max(0, inactive[0]))

    @property
    def default_memory_utilization(self) -> float:  # type: ignore[override]
        """The smallest :func:`utilization_with_margin` of the devices and vLLM's node files."""
        views = self._engine_node_views()
        for device in range(self.device_count()):
            with contextlib.suppress(BackendError):
                views.append(self.memory_info(device))
        values = [utilization_with_margin(v.free, v.total) for v in views]
        return min(values, default=_UTILIZATION_CAP_PERCENT / 100)

    def _engine_node_views(self) -> list[MemoryInfo]:
        """Node memory as vLLM's CPU worker reads it on a machine shown as one host device."""
        # vLLM reads <sysfs>/devices/system/node/node<N>/meminfo whenever it exists, even on a
        # single-node machine, where it can disagree with /proc/meminfo (seen in virtual machines
        # whose node 0 reports less than the host): the default utilization must pass both.
        roots = self._roots()
        if self._structure("nodes", roots, self._scan_numa_nodes):
            return []  # already the devices themselves
        found = [node for node, path in _node_dirs(roots) if _files.is_file(_join(path, "meminfo"))]
        cgroup = self._cgroup_limit(roots) if found else None
        views: list[MemoryInfo] = []
        for node in found:
            with contextlib.suppress(BackendError):
                views.append(self._node_memory(roots, node, cgroup))
        return views
