"""A simulated device whose holders are real forked children, released 0.22 s after they exit.

Each test body, in its child, writes its pid and bytes into a ledger directory; a driver thread
of this process sets every entry as a holder of a :class:`SimulatedPlatform` device and ends it
:data:`RELEASE_DELAY_S` after the child has exited (the SIGKILL release measured on an H200:
NVML shows the memory free 0.22 s later). Shared by ``tests/integrations/test_vllm_release.py``
and ``benchmarks/bench_forked_release.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from accelplat._backends.simulated import SimulatedHolder, SimulatedPlatform

RELEASE_DELAY_S = 0.22
GIB = 1024**3


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@contextmanager
def forked_device(ledger: Path) -> Iterator[SimulatedPlatform]:
    """A one-device simulated platform (141 GiB) whose holders are the ledger's processes."""
    platform = SimulatedPlatform.from_spec(
        {"devices": [{"name": "Simulated H200", "total": "141GiB", "report_holders": True}]}
    )
    stop = threading.Event()
    seen: dict[int, int] = {}  # pid -> bytes, while it runs

    def drive() -> None:
        while not stop.is_set():
            for path in list(ledger.iterdir()):
                if not path.name.isdigit():
                    continue
                pid = int(path.name)
                if pid not in seen:
                    seen[pid] = int(path.read_text())
                    holder = SimulatedHolder(seen[pid], start=platform.elapsed(), pid=pid)
                    platform.set_holder(0, holder)
                elif not _alive(pid):
                    now = platform.elapsed()
                    end = SimulatedHolder(seen.pop(pid), now, now + RELEASE_DELAY_S, pid=pid)
                    platform.set_holder(0, end)
                    path.unlink()
            time.sleep(0.001)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    try:
        yield platform
    finally:
        stop.set()
        thread.join()


def holding_body(ledger: Path, nbytes: int = 8 * GIB, work_s: float = 0.05) -> Callable[[], None]:
    """A test body for a forked child: hold ``nbytes`` for ``work_s``, then return."""

    def body() -> None:
        entry = ledger / f".{os.getpid()}"
        entry.write_text(str(nbytes))
        entry.rename(ledger / str(os.getpid()))  # whole, as a driver table row appears
        time.sleep(work_s)

    return body


def held_by_others(platform: SimulatedPlatform) -> int:
    """Bytes the device's holders hold now (before a test starts: a previous child's)."""
    return sum(h.used_bytes or 0 for h in platform.memory_holders(0) or ())
