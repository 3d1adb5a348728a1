"""Threads, process exit, fork, and the lifetimes of processes that hold device memory.

accelplat runs inside other projects' test processes, which poll from many threads, fork workers
and leave orphans behind. These tests drive the fake NVML (tests/fakes/nvml.py) and the real
host (CPU platform, real processes). Each thread test runs for at least a second of real time
and until every thread has done its share of the work: the bounds are on work done, never on
how fast a loaded machine schedules threads; time limits only catch hangs, and are generous.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import accelplat
from accelplat import _registry as registry
from accelplat._backends.simulated import SimulatedClock
from accelplat._memory import PollPolicy
from accelplat._platform import Platform
from accelplat._types import GIB, HolderState, MemoryInfo
from accelplat._vendor import nvml as _nvml
from accelplat._vendor.procs import classify_pid
from accelplat.errors import MemoryNotSettledError
from tests._proc import run_python
from tests.conftest import Install
from tests.fakes.nvml import FakeNvml, h200

REPO = Path(__file__).resolve().parents[2]

THREADS = 32
POLL_SECONDS = 1.0
JOIN_SECONDS = 30.0
STARVED_SECONDS = 120.0
"""How long every thread may take to do its share of the work; only a thread that never gets
to run (a deadlock) reaches it. A loaded machine can leave a thread unscheduled for a second."""
MIXED_ROUNDS = 5
"""Rounds each thread of a mixed-work test does at least: one of each of the five steps."""
HANG_SECONDS = 60.0
"""How long a test waits for a thread, child or process to reach a point: only a hang does."""

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def two_gpus() -> FakeNvml:
    """GPU 0 idle; GPU 1 holding 7 GiB and listed as held by this process."""
    gpus = [h200(0), h200(1, used=7 * GIB)]
    gpus[1].processes = [(os.getpid(), 7 * GIB)]
    return FakeNvml(gpus)


# -- many threads at once ----------------------------------------------------------------------


class Hammer:
    """Runs ``work(thread_index, round)`` on many threads for a while and collects failures."""

    def __init__(self, work: Callable[[int, int], None], *, threads: int = THREADS) -> None:
        self.work = work
        self.threads = threads
        self.errors: list[tuple[int, BaseException]] = []
        self.rounds = [0] * threads
        self._lock = threading.Lock()

    def run(
        self,
        seconds: float,
        during: Callable[[], None] | None = None,
        *,
        min_rounds: int = 1,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Run every thread for at least ``seconds``, and until each has done ``min_rounds``
        rounds and ``until()`` (if given) holds; ``during()`` is called repeatedly meanwhile.

        A thread that failed stops early; its error is in :attr:`errors`.
        """
        barrier = threading.Barrier(self.threads + 1)
        stop = threading.Event()
        done = [False] * self.threads

        def loop(i: int) -> None:
            barrier.wait()
            n = 0
            try:
                while not stop.is_set():
                    self.work(i, n)
                    n += 1
                    self.rounds[i] = n
            except BaseException as exc:
                with self._lock:
                    self.errors.append((i, exc))
            done[i] = True

        def finished() -> bool:
            if self.errors:
                return True
            enough = all(n >= min_rounds for n in self.rounds)
            return enough and (until is None or until())

        workers = [
            threading.Thread(target=loop, args=(i,), daemon=True) for i in range(self.threads)
        ]
        for t in workers:
            t.start()
        barrier.wait()
        start = time.monotonic()
        try:
            while True:
                if during is not None:
                    during()
                else:
                    time.sleep(0.05)
                elapsed = time.monotonic() - start
                if elapsed >= STARVED_SECONDS or (elapsed >= seconds and finished()):
                    break
        finally:
            stop.set()
            for t in workers:
                t.join(JOIN_SECONDS)
        stuck = [t.name for t in workers if t.is_alive()]
        assert stuck == [], f"threads still running after {JOIN_SECONDS} s: deadlock? {stuck}"
        if not self.errors:
            assert min(self.rounds) >= min_rounds, (
                f"a thread did fewer than {min_rounds} rounds in {STARVED_SECONDS} s: "
                f"deadlock or starvation? rounds {self.rounds}"
            )


def _mixed_work(
    get_platform: Callable[[], Platform], busy_device: int | None
) -> Callable[[int, int], None]:
    """Each thread rotates through memory_info, snapshot, record_usage_stats and two waits."""

    def work(i: int, n: int) -> None:
        p = get_platform()
        step = (i + n) % 5
        count = p.device_count()
        if step == 0:
            info = p.memory_info(n % count)
            assert isinstance(info, MemoryInfo)
            assert info.used >= 0
            assert info.free <= info.total
        elif step == 1:
            snap = accelplat.snapshot(platform=p)
            assert sorted(snap.memory) == list(range(count))
        elif step == 2:
            stats = accelplat.record_usage_stats(platform=p)
            assert len(stats) == count
        elif step == 3:
            result = accelplat.wait_for_memory_to_clear(threshold_ratio=1.0, platform=p)
            assert result.already_settled
        else:
            device = busy_device if busy_device is not None else 0
            result = accelplat.wait_for_memory_to_clear(
                [device],
                threshold_ratio=1.0,
                stable_duration_s=0.01,  # polls with real sleeps for 10 ms
                poll=PollPolicy(initial_s=0.001, max_s=0.005),
                timeout_s=10,
                platform=p,
            )
            assert result.polls >= 2

    return work


def test_32_threads_poll_the_cuda_backend_with_one_nvml_init(install: Install) -> None:
    fake = install(two_gpus())
    # yield the GIL inside every memory query, so calls from different threads overlap
    fake.on_call("nvmlDeviceGetMemoryInfo", lambda: time.sleep(0))
    hammer = Hammer(_mixed_work(registry.current_platform, busy_device=1))
    hammer.run(POLL_SECONDS, min_rounds=MIXED_ROUNDS)
    assert hammer.errors == []
    assert min(hammer.rounds) >= MIXED_ROUNDS  # every thread did every step: nobody starved
    assert fake.calls["nvmlInit"] == 1
    assert fake.refcount == 1
    assert fake.max_in_flight > 1  # NVML really was entered from several threads at once
    assert _nvml._state.active == 0  # every call in flight was accounted for
    assert fake.calls["nvmlDeviceGetCount"] == 1  # GPUs were enumerated once, not per thread


def test_32_threads_detect_the_platform_concurrently_once(install: Install) -> None:
    install(two_gpus())
    seen: list[int] = []
    lock = threading.Lock()

    def work(i: int, n: int) -> None:
        p = accelplat.current_platform()
        with lock:
            seen.append(id(p))

    Hammer(work).run(0.2, min_rounds=1)
    assert len(seen) >= THREADS
    assert len(set(seen)) == 1


def test_32_threads_poll_the_cpu_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    hammer = Hammer(_mixed_work(registry.current_platform, busy_device=None))
    hammer.run(POLL_SECONDS, min_rounds=MIXED_ROUNDS)
    assert hammer.errors == []
    assert min(hammer.rounds) >= MIXED_ROUNDS
    assert registry.current_platform().name == "cpu"


def test_shutdown_racing_with_32_pollers_never_closes_nvml_under_a_call(install: Install) -> None:
    fake = install(two_gpus())
    platform = registry.current_platform()
    shutdowns = 0

    def poll(i: int, n: int) -> None:
        info = platform.memory_info(i % 2)
        assert info.used == (0 if i % 2 == 0 else 7 * GIB)

    def close() -> None:
        nonlocal shutdowns
        if _nvml.shutdown():
            shutdowns += 1
        time.sleep(0.002)

    hammer = Hammer(poll)
    hammer.run(POLL_SECONDS, during=close, min_rounds=1, until=lambda: shutdowns > 5)
    assert hammer.errors == []  # no call ever met an uninitialised NVML
    assert shutdowns > 5
    assert not fake.shutdown_while_in_flight
    assert fake.calls["nvmlShutdown"] == shutdowns
    assert fake.calls["nvmlInit"] - fake.calls["nvmlShutdown"] == fake.refcount
    assert fake.refcount in (0, 1)
    assert _nvml._state.active == 0


# -- process exit ------------------------------------------------------------------------------

_EXIT_SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys, threading
    from tests.fakes.nvml import FakeNvml, h200

    fake = FakeNvml([h200(0, used=1 << 30)])
    sys.modules["pynvml"] = fake

    def report():  # registered first, so it runs after every handler registered later
        sys.stdout.write("shutdown=%d in_flight=%d\\n" % (
            fake.calls["nvmlShutdown"], fake.in_flight))
        sys.stdout.flush()

    atexit.register(report)
    import accelplat
    platform = accelplat.current_platform()
    accelplat.wait_for_memory_to_settle(threshold_ratio=0.5)
    if sys.argv[1] == "in-flight":
        inside = threading.Event()
        fake.on_call("nvmlDeviceGetMemoryInfo", lambda: (inside.set(), threading.Event().wait()))
        threading.Thread(target=platform.memory_info, args=(0,), daemon=True).start()
        inside.wait(60)
    """
)


@pytest.mark.parametrize("case", ["idle", "in-flight"])
def test_process_exit_never_shuts_nvml_down_under_a_call(case: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "CUDA_"))}
    env["PYTHONPATH"] = str(REPO)
    done = run_python(_EXIT_SCRIPT, case, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    in_flight = 1 if case == "in-flight" else 0
    # accelplat registers no exit-time nvmlShutdown: the process's exit releases NVML, so a
    # daemon thread still inside a call at exit is never pulled out from under it.
    assert done.stdout.split() == ["shutdown=0", f"in_flight={in_flight}"]


# -- fork --------------------------------------------------------------------------------------


def _pause_inside(inside: threading.Event, release: threading.Event) -> Callable[[], None]:
    """A fake-NVML hook that signals ``inside`` and then blocks until ``release``."""

    def hook() -> None:
        inside.set()
        release.wait(HANG_SECONDS)

    return hook


def _in_child(
    child: Callable[[], dict[str, Any]], *, alarm_s: int = int(HANG_SECONDS)
) -> dict[str, Any]:
    """Fork; run ``child`` there (killed by SIGALRM after ``alarm_s``) and return its report."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read_fd)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a hang ends the child, visibly
            signal.alarm(alarm_s)
            try:
                report = child()
            except BaseException as exc:
                report = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write_fd, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise AssertionError(
            f"the forked child was killed by signal {os.WTERMSIG(status)} "
            f"({'hung: SIGALRM' if os.WTERMSIG(status) == signal.SIGALRM else 'crashed'})"
        )
    assert os.waitstatus_to_exitcode(status) == 0
    result: dict[str, Any] = json.loads(data)
    return result


def _use_everything_then_settle() -> Platform:
    p = accelplat.current_platform()
    accelplat.snapshot()
    accelplat.wait_for_memory_to_settle(threshold_ratio=0.5, timeout_s=5)
    return p


@needs_fork
def test_a_forked_child_starts_with_fresh_registry_and_nvml_state(install: Install) -> None:
    fake = install(two_gpus())
    parent_platform = _use_everything_then_settle()
    assert parent_platform.name == "cuda"
    parent_inits = fake.calls["nvmlInit"]
    parent_generation = _nvml.generation()

    def child() -> dict[str, Any]:
        state = {
            "current_cached": registry._current is not None,
            "instances_cached": sorted(registry._instances),
            "nvml_initialized": _nvml.initialized(),
            "generation_changed": _nvml.generation() != parent_generation,
        }
        p = accelplat.current_platform()
        state["same_object"] = p is parent_platform
        state["used"] = accelplat.record_usage_stats([1])[1][0]
        state["inits"] = fake.calls["nvmlInit"]
        state["settled"] = accelplat.wait_for_memory_to_settle(threshold_ratio=0.5).already_settled
        return state

    report = _in_child(child)
    assert report == {
        "current_cached": False,
        "instances_cached": [],
        "nvml_initialized": False,
        "generation_changed": True,
        "same_object": False,
        "used": 7.0,
        "inits": parent_inits + 1,  # the child initialised NVML for itself
        "settled": True,
    }
    # the parent is untouched
    assert accelplat.current_platform() is parent_platform
    assert _nvml.initialized()
    assert fake.calls["nvmlInit"] == parent_inits


@needs_fork
def test_a_forked_child_of_a_cpu_process_starts_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    parent_platform = _use_everything_then_settle()

    def child() -> dict[str, Any]:
        cached = registry._current is not None
        p = accelplat.current_platform()
        return {
            "cached": cached,
            "same_object": p is parent_platform,
            "name": p.name,
            "total_positive": accelplat.snapshot(holders=False).memory[0].total > 0,
        }

    assert _in_child(child) == {
        "cached": False,
        "same_object": False,
        "name": "cpu",
        "total_positive": True,
    }


@needs_fork
def test_fork_while_another_thread_holds_the_registry_lock(install: Install) -> None:
    install(two_gpus())
    _use_everything_then_settle()
    registry.reset()  # the child must detect again, under the registry's lock
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with registry._lock:
            holding.set()
            release.wait(HANG_SECONDS)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert holding.wait(HANG_SECONDS)
    try:
        report = _in_child(lambda: {"name": accelplat.current_platform().name})
    finally:
        release.set()
        holder.join(HANG_SECONDS)
    assert report == {"name": "cuda"}


@needs_fork
def test_fork_while_another_thread_is_inside_an_nvml_call(install: Install) -> None:
    fake = install(two_gpus())
    platform = _use_everything_then_settle()
    inside = threading.Event()
    release = threading.Event()
    fake.on_call("nvmlDeviceGetMemoryInfo", _pause_inside(inside, release))
    reader = threading.Thread(target=platform.memory_info, args=(1,), daemon=True)
    reader.start()
    assert inside.wait(HANG_SECONDS)
    fake.on_call("nvmlDeviceGetMemoryInfo", None)
    try:
        report = _in_child(
            lambda: {
                "active": _nvml._state.active,
                "used": accelplat.current_platform().memory_info(1).used,
            }
        )
    finally:
        release.set()
        reader.join(HANG_SECONDS)
    assert report == {"active": 0, "used": 7 * GIB}


@needs_fork
def test_fork_while_another_thread_enumerates_gpus(install: Install) -> None:
    fake = install(two_gpus())
    platform = _use_everything_then_settle()
    _nvml.shutdown()  # the next query enumerates the GPUs again
    inside = threading.Event()
    release = threading.Event()
    fake.on_call("nvmlDeviceGetName", _pause_inside(inside, release))
    enumerating = threading.Thread(target=platform.devices, daemon=True)
    enumerating.start()
    assert inside.wait(HANG_SECONDS)
    fake.on_call("nvmlDeviceGetName", None)
    try:
        report = _in_child(lambda: {"used": accelplat.current_platform().memory_info(1).used})
    finally:
        release.set()
        enumerating.join(HANG_SECONDS)
    assert report == {"used": 7 * GIB}


@needs_fork
def test_the_parents_platform_object_works_in_a_child_forked_mid_enumeration(
    install: Install,
) -> None:
    """The instance's own lock, held by the enumerating thread at fork, is fresh in the child."""
    fake = install(two_gpus())
    platform = _use_everything_then_settle()
    _nvml.shutdown()  # the next query enumerates the GPUs again, under the instance's lock
    inside = threading.Event()
    release = threading.Event()
    fake.on_call("nvmlDeviceGetName", _pause_inside(inside, release))
    enumerating = threading.Thread(target=platform.devices, daemon=True)
    enumerating.start()
    assert inside.wait(HANG_SECONDS)
    fake.on_call("nvmlDeviceGetName", None)
    try:
        report = _in_child(lambda: {"used": platform.memory_info(1).used})
    finally:
        release.set()
        enumerating.join(HANG_SECONDS)
    assert report == {"used": 7 * GIB}


# -- who holds the memory: real process lifetimes ----------------------------------------------

_ORPHAN_MAKER = textwrap.dedent(
    """
    import os, sys, time
    pid = os.fork()
    if pid == 0:  # the grandchild: outlives its parent, as a forked worker holding the GPU does
        time.sleep(60)
        os._exit(0)
    sys.stdout.write("%d\\n" % pid)
    sys.stdout.flush()
    os._exit(0)
    """
)


def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = HANG_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def orphan() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A child process that forked a grandchild and exited (not yet reaped), and that grandchild."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_MAKER], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    try:
        yield parent, grandchild
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)
        parent.wait(HANG_SECONDS)


def test_holders_of_a_dead_parent_and_its_surviving_forked_child(
    install: Install, orphan: tuple[subprocess.Popen[str], int]
) -> None:
    parent, grandchild = orphan
    _wait_for(
        lambda: psutil.Process(parent.pid).status() == psutil.STATUS_ZOMBIE,
        "the parent to exit",
    )
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gpu = h200(0, used=6 * GIB)
        # NVML keeps listing the dead parent while its forked child holds the memory
        gpu.processes = [
            (parent.pid, 2 * GIB),
            (grandchild, 2 * GIB),
            (sleeper.pid, GIB),
            (os.getpid(), GIB),
        ]
        install(FakeNvml([gpu]))
        snap = accelplat.snapshot()
        states = {h.pid: h.state for h in snap.holders[0]}
        assert states == {
            parent.pid: HolderState.ZOMBIE,  # exited, not reaped yet
            grandchild: HolderState.ALIVE,  # reparented away from us: someone else's now
            sleeper.pid: HolderState.CHILD,
            os.getpid(): HolderState.SELF,
        }
        with pytest.raises(MemoryNotSettledError) as info:
            accelplat.wait_for_memory_to_clear(
                threshold_bytes=GIB, timeout_s=2, clock=SimulatedClock()
            )
        text = str(info.value)
        assert f"pid {grandchild} 'python" in text
        assert f"pid {parent.pid} 'python" in text
        assert "(alive) 2.00 GiB" in text
        assert "(zombie) 2.00 GiB" in text
        assert "(child) 1.00 GiB" in text
        assert "(self) 1.00 GiB" in text
        assert "this process itself holds device memory" in text

        parent.wait(HANG_SECONDS)  # reaped: only the driver remembers it now
        assert classify_pid(parent.pid)[0] is HolderState.GONE
        os.kill(grandchild, signal.SIGKILL)
        _wait_for(
            lambda: classify_pid(grandchild)[0] in (HolderState.GONE, HolderState.ZOMBIE),
            "the grandchild to die",
        )
        held = {h.pid: h.state for h in accelplat.snapshot().holders[0]}
        assert held[parent.pid] is HolderState.GONE
        assert held[grandchild] in (HolderState.GONE, HolderState.ZOMBIE)
    finally:
        sleeper.kill()
        sleeper.wait(HANG_SECONDS)


def test_a_wait_follows_a_real_holder_until_it_exits(
    install: Install, orphan: tuple[subprocess.Popen[str], int]
) -> None:
    _, grandchild = orphan
    gpu = h200(0, used=4 * GIB)
    gpu.processes = [(grandchild, 4 * GIB)]
    fake = install(FakeNvml([gpu]))
    samples: list[int] = []

    def driver(snap: Any, targets: Any) -> None:
        """Plays the driver: memory of a process that is no longer alive comes back."""
        samples.append(snap.memory[0].used)
        if len(samples) == 3:
            os.kill(grandchild, signal.SIGKILL)
        # ALIVE once its parent has exited, CHILD while the parent still lives: both hold.
        if classify_pid(grandchild)[0] in (HolderState.GONE, HolderState.ZOMBIE):
            fake.gpus[0].used = 0
            fake.gpus[0].processes = []

    result = accelplat.wait_for_memory_to_clear(
        threshold_bytes=GIB,
        timeout_s=30,
        poll=PollPolicy(initial_s=0.002, max_s=0.01),
        on_poll=driver,
    )
    assert samples[:3] == [4 * GIB] * 3  # held while the process lived
    assert result.snapshot.memory[0].used == 0
    assert result.polls == len(samples)
