"""The one reader of host and user files: regular files only, bounded reads, bounded id lists.

Each class of hostile file is tried against the reader itself and against every feature that
reads such a file (CPU and ROCm backends, the CUDA host-memory fallback, simulated specs,
timeline traces, the command line), so a new reader that bypasses :mod:`accelplat._files`
shows up here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from accelplat import _files
from accelplat import _registry as registry
from accelplat._backends.rocm import RocmPlatform
from accelplat._backends.simulated import load_spec
from accelplat._types import GIB, ProbeResult
from accelplat._vendor import nvml as _nvml
from accelplat.errors import (
    BackendError,
    ConfigurationError,
    FileTooLargeError,
    NotARegularFileError,
    UnreadableFileError,
)
from accelplat.timeline._trace import load_trace
from tests.fakes.hostfs import HostFS, host_files
from tests.fakes.sysfs import FakeSysfs

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")

# -- the kinds of path that are not regular files -------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


def _directory(path: Path) -> None:
    path.mkdir()


_SOCKETS: list[socket.socket] = []


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    short = Path(f"/tmp/accelplat-test-{os.getpid()}-{len(_SOCKETS)}.sock")
    short.unlink(missing_ok=True)
    sock.bind(str(short))
    _SOCKETS.append(sock)
    path.symlink_to(short)


NOT_REGULAR: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "dev-zero-link": _dev_zero,
    "dev-null-link": _dev_null,
    "directory": _directory,
    "socket": _socket,
}


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while _SOCKETS:
        sock = _SOCKETS.pop()
        name = sock.getsockname()
        sock.close()
        if isinstance(name, str):
            Path(name).unlink(missing_ok=True)


HANG_LIMIT_S = 60.0
"""How long a read may take before it counts as blocked: never reached unless something hangs,
so it can be generous for a loaded machine."""


def _within(seconds: float, work: Callable[[], object]) -> object:
    """Run ``work`` in a thread; fail (instead of hanging the suite) if it blocks."""
    box: list[object] = []

    def target() -> None:
        try:
            box.append(work())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for more than {seconds} s"
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


# -- the reader itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "attribute"
    NOT_REGULAR[kind](path)
    with pytest.raises(NotARegularFileError) as caught:
        _within(HANG_LIMIT_S, lambda: _files.read_text(path))
    assert caught.value.filename == str(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, OSError)  # "no information" for callers that expect OSError


def test_a_file_over_the_limit_is_refused_and_never_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"7" * (_files.ATTRIBUTE_LIMIT + 1))
    with pytest.raises(FileTooLargeError) as caught:
        _files.read_text(path)
    assert caught.value.limit == _files.ATTRIBUTE_LIMIT
    assert str(path) in str(caught.value)
    assert _files.read_text(path, limit=_files.ATTRIBUTE_LIMIT + 1) == "7" * (
        _files.ATTRIBUTE_LIMIT + 1
    )


def test_a_file_at_the_limit_and_procfs_style_files_are_read(tmp_path: Path) -> None:
    path = tmp_path / "exact"
    path.write_bytes(b"x" * 10)
    assert _files.read_bytes(path, limit=10) == b"x" * 10
    assert "MemTotal" in _files.read_text("/proc/meminfo", limit=_files.PROC_LIMIT)


def test_missing_files_are_the_ordinary_os_error_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        _files.read_text(tmp_path / "absent")
    assert caught.value.filename == str(tmp_path / "absent")


def test_every_read_goes_through_the_installed_host_files(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    class Recorder(_files.HostFiles):
        def read_bytes(self, path: str, limit: int) -> bytes:
            seen.append((path, limit))
            return super().read_bytes(path, limit)

    fs = HostFS(tmp_path)
    fs.meminfo(total=8 * GIB, available=6 * GIB)
    with host_files(Recorder()):
        info = fs.platform().memory_info(0)
    assert info.total == 8 * GIB
    assert (str(fs.proc / "meminfo"), _files.PROC_LIMIT) in seen
    assert type(_files.set_host_files(None)) is _files.HostFiles  # the real reader is back


def test_a_document_a_user_names_fails_as_bad_input_naming_it(tmp_path: Path) -> None:
    doc = tmp_path / "doc.json"
    doc.write_text("{}")
    assert _files.read_document(doc, limit=2, what="trace") == b"{}"
    for path, limit, words, why in [
        (doc, 1, {}, "larger than the limit of 1 bytes"),
        (doc, 1, {"limit_text": "1 byte"}, "larger than 1 byte"),
        (tmp_path / "absent.json", 9, {}, "No such file"),
        (tmp_path, 9, {}, "is a directory"),
    ]:
        with pytest.raises(ConfigurationError) as caught:
            _files.read_document(path, limit=limit, what="trace", **words)
        assert str(caught.value).startswith(f"cannot read trace {str(path)!r}: ")
        assert why in str(caught.value)


def test_project_files_are_read_live_with_the_same_rules_and_links_refused_on_request(
    tmp_path: Path,
) -> None:
    seen: list[str] = []

    class Recorder(_files.HostFiles):
        def read_bytes(self, path: str, limit: int) -> bytes:
            seen.append(path)
            return super().read_bytes(path, limit)

    own = tmp_path / "own.json"
    own.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(own)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with host_files(Recorder()):
        assert _files.read_live(own, limit=2) == b"{}"
        assert _files.read_live(link, limit=2) == b"{}"
        with pytest.raises(OSError):
            _files.read_live(link, limit=2, follow_links=False)
        with pytest.raises(FileTooLargeError):
            _files.read_live(own, limit=1)
        with pytest.raises(NotARegularFileError):
            _within(5, lambda: _files.read_live(fifo, limit=2, follow_links=False))
    assert seen == []  # a replayed host's reader never answers for project files


# -- id lists ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["0-30000000000", "0-1023,1024", "99999999999999999999", "4294967296", "0-4294967295"],
)
def test_id_ranges_beyond_the_kernel_limit_are_refused_at_once(text: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ConfigurationError, match="Mems_allowed_list"):
            _files.parse_id_list(text, limit=_files.MAX_NUMA_NODES, what="Mems_allowed_list")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Refused before a range beyond the limit is built: at most the limit's 1,024 ids (under
    # 100 KiB) are ever held, where building either giant range here would take over 100 GiB.
    assert peak < 1024 * 1024


@pytest.mark.parametrize("text", ["3-1", "a", "1-", "-1", "１", "0x3", "1--2"])
def test_malformed_id_lists_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError):
        _files.parse_id_list(text, limit=1 << 13)  # NR_CPUS is at most 8192


@pytest.mark.parametrize(
    ("text", "ids"),
    [("0-3,7", {0, 1, 2, 3, 7}), (" 1 , 2-2 ,", {1, 2}), ("", set()), ("0-1023", set(range(1024)))],
)
def test_id_lists_within_the_limit(text: str, ids: set[int]) -> None:
    assert _files.parse_id_list(text, limit=_files.MAX_NUMA_NODES) == ids


def test_a_giant_mems_allowed_list_leaves_the_numa_devices_usable(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    fs.meminfo(total=64 * GIB, available=60 * GIB)
    fs.numa_node(0, total=32 * GIB, free=30 * GIB)
    fs.numa_node(1, total=32 * GIB, free=30 * GIB)
    fs.mems_allowed("0-30000000000")
    p = fs.platform()
    assert _within(HANG_LIMIT_S, p.device_count) == 2
    assert p.memory_info(1).total == 32 * GIB


# -- every feature that reads such a file ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link"])
@pytest.mark.parametrize(
    "where", ["meminfo", "status", "cpuinfo", "cgroup", "node-meminfo", "memory.max", "memory.stat"]
)
def test_cpu_backend_never_blocks_on_a_hostile_proc_or_cgroup_file(
    tmp_path: Path, kind: str, where: str
) -> None:
    fs = HostFS(tmp_path)
    fs.meminfo(total=16 * GIB, available=12 * GIB)
    fs.cpuinfo("Fake CPU")
    fs.mems_allowed("0-1")
    fs.numa_node(0, total=8 * GIB, free=6 * GIB)
    fs.numa_node(1, total=8 * GIB, free=6 * GIB)
    fs.cgroup_v2("/job")
    level = fs.v2_level("/job", max=4 * GIB, current=GIB)
    target = {
        "meminfo": fs.proc / "meminfo",
        "status": fs.proc / "self" / "status",
        "cpuinfo": fs.proc / "cpuinfo",
        "cgroup": fs.proc / "self" / "cgroup",
        "node-meminfo": fs.sysfs / "devices" / "system" / "node" / "node1" / "meminfo",
        "memory.max": level / "memory.max",
        "memory.stat": level / "memory.stat",
    }[where]
    target.unlink()
    NOT_REGULAR[kind](target)
    p = fs.platform()

    def query() -> object:
        names = [d.name for d in p.devices()]
        answers: list[object] = []
        for device in range(len(names)):
            try:
                answers.append(p.memory_info(device))
            except BackendError as exc:
                answers.append(exc)
        return names, answers

    names, answers = _within(HANG_LIMIT_S, query)  # type: ignore[misc]
    assert names
    for answer in answers:
        if isinstance(answer, BackendError):
            assert str(target) in str(answer)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory"])
@pytest.mark.parametrize("attribute", ["mem_info_vram_used", "mem_info_vram_total"])
def test_rocm_attribute_that_is_not_a_regular_file_is_a_backend_error_naming_it(
    tmp_path: Path, kind: str, attribute: str
) -> None:
    sysfs = FakeSysfs(tmp_path)
    sysfs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=64 * GIB)
    target = sysfs.device_dir(0) / attribute
    target.unlink()
    NOT_REGULAR[kind](target)
    p = RocmPlatform(sysfs_root=sysfs.sys)
    with pytest.raises(BackendError, match=attribute):
        _within(HANG_LIMIT_S, lambda: p.memory_info(0))


def test_rocm_attribute_larger_than_a_page_is_a_backend_error(tmp_path: Path) -> None:
    sysfs = FakeSysfs(tmp_path)
    sysfs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=64 * GIB)
    sysfs.write_attr(0, "mem_info_vram_used", "1" * (_files.ATTRIBUTE_LIMIT + 1))
    with pytest.raises(BackendError, match="mem_info_vram_used"):
        RocmPlatform(sysfs_root=sysfs.sys).memory_info(0)


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_spec_that_is_not_a_regular_file_is_a_configuration_error(
    tmp_path: Path, kind: str, suffix: str
) -> None:
    path = tmp_path / f"spec{suffix}"
    NOT_REGULAR[kind](path)
    with pytest.raises(ConfigurationError, match="spec"):
        _within(HANG_LIMIT_S, lambda: load_spec(path))


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_a_trace_that_is_not_a_regular_file_is_a_configuration_error(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "trace.json"
    NOT_REGULAR[kind](path)
    with pytest.raises(ConfigurationError, match="trace"):
        _within(HANG_LIMIT_S, lambda: load_trace(path))


@pytest.mark.parametrize(
    "command", [["info"], ["stats"], ["wait", "--timeout", "1", "--threshold-ratio", "0.99"]]
)
def test_the_command_line_never_hangs_on_a_fifo_meminfo(tmp_path: Path, command: list[str]) -> None:
    fs = HostFS(tmp_path)
    fs.cpuinfo("Fake CPU")
    os.mkfifo(fs.proc / "meminfo")
    env = {
        **os.environ,
        "ACCELPLAT_PLATFORM": "cpu",
        "ACCELPLAT_PROC_ROOT": str(fs.proc),
        "ACCELPLAT_SYSFS_ROOT": str(fs.sysfs),
        "ACCELPLAT_CGROUP_ROOT": str(fs.cgroup),
    }
    done = subprocess.run(
        [sys.executable, "-m", "accelplat", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr
    assert done.returncode in (0, 1), done.stderr


def test_unreadable_file_errors_survive_pickling(tmp_path: Path) -> None:
    import pickle

    for error in (
        NotARegularFileError(str(tmp_path), "is a FIFO"),
        FileTooLargeError(str(tmp_path), 4096),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error)
        assert str(again) == str(error)
        assert isinstance(again, UnreadableFileError)
        assert again.filename == str(tmp_path)


# -- probes of built-in backends honour the time limit --------------------------------------------


def test_a_built_in_probe_that_hangs_is_bounded_by_the_probe_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accelplat._backends.cuda import CudaPlatform

    release = threading.Event()

    def hanging_probe(cls: type[CudaPlatform]) -> ProbeResult:
        release.wait(120)
        return ProbeResult(False, "released")

    monkeypatch.setattr(CudaPlatform, "probe", classmethod(hanging_probe))
    # as where NVML's library loads: the quick absence check then leaves it to the probe
    monkeypatch.setattr(_nvml, "library_missing", lambda: None)
    # long enough for the other built-in probes on a loaded machine; the hang outlasts it
    monkeypatch.setenv("ACCELPLAT_PROBE_TIMEOUT_S", "1")
    monkeypatch.delenv("ACCELPLAT_PLATFORM", raising=False)
    monkeypatch.setenv("ACCELPLAT_PLUGINS", "")
    registry.reset()
    try:
        report = registry.detect()
        pending = registry._registered["cuda"].pending
        assert pending is not None
        assert pending.is_alive()  # detection returned while the probe still hung
        cuda = next(c for c in report.candidates if c.name == "cuda")
        assert not cuda.available
        assert "did not finish within 1 s" in cuda.reason
        assert cuda.builtin
        assert report.chosen not in (None, "cuda")
    finally:
        release.set()
        registry.reset()


# -- kernel files read through a descriptor kept open ---------------------------------------------


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A regular file standing in for /proc/meminfo, read through a fresh kept-open table."""
    path = tmp_path / "meminfo"
    path.write_text("MemTotal: 1 kB\n")
    table = _files._KeptOpen()
    monkeypatch.setattr(_files, "KEPT_OPEN", frozenset({str(path)}))
    monkeypatch.setattr(_files, "_kept_open", table)
    yield path
    for _pid, fd, _dev, _ino in table._open.values():
        os.close(fd)


def test_a_kept_open_file_is_read_from_its_start_each_time(kept: Path) -> None:
    assert _files.read_text(kept) == "MemTotal: 1 kB\n"
    with kept.open("r+") as fh:  # rewritten in place, as the kernel regenerates its text
        fh.write("MemTotal: 22 kB\nMemFree: 3 kB\n")
    assert _files.read_text(kept) == "MemTotal: 22 kB\nMemFree: 3 kB\n"
    assert len(_files._kept_open._open) == 1  # one descriptor, opened once


def test_a_kept_open_file_keeps_the_limit(kept: Path) -> None:
    kept.write_text("x" * 100)
    with pytest.raises(FileTooLargeError):
        _files.read_bytes(kept, limit=99)
    assert _files.read_bytes(kept, limit=100) == b"x" * 100


def test_a_kept_open_path_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(_files, "KEPT_OPEN", frozenset({str(fifo)}))
    monkeypatch.setattr(_files, "_kept_open", _files._KeptOpen())
    with pytest.raises(NotARegularFileError):
        _files.read_bytes(fifo)


def test_a_kept_descriptor_closed_and_reused_by_someone_else_is_not_read(
    kept: Path, tmp_path: Path
) -> None:
    _files.read_text(kept)
    ((_pid, fd, _dev, _ino),) = _files._kept_open._open.values()
    os.close(fd)  # someone closes it behind our back ...
    other = tmp_path / "other"
    other.write_text("someone else's file\n")
    reused = os.open(other, os.O_RDONLY)  # ... and the number is reused for their file
    try:
        assert reused == fd
        assert _files.read_text(kept) == "MemTotal: 1 kB\n"
        assert os.read(reused, 100) == b"someone else's file\n"  # still open, still theirs
    finally:
        os.close(reused)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_through_a_descriptor_of_its_own(kept: Path) -> None:
    _files.read_text(kept)
    ((parent_pid, parent_fd, _dev, _ino),) = _files._kept_open._open.values()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            text = _files.read_text(kept)
            ((owner, _fd, _d, _i),) = _files._kept_open._open.values()
            ok = text == "MemTotal: 1 kB\n" and owner == os.getpid() and owner != parent_pid
            os.write(write_end, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 10) == b"ok"
    os.close(read_end)
    assert _files.read_text(kept) == "MemTotal: 1 kB\n"
    assert next(iter(_files._kept_open._open.values()))[:2] == (parent_pid, parent_fd)


def test_the_host_memory_file_is_kept_open() -> None:
    assert "/proc/meminfo" in _files.KEPT_OPEN
