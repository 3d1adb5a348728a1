"""Budgets that bind: how the processes under a memory share are held to its budget.

The ladder, best first (``docs/leasing.md``, "Enforced budgets"): NVIDIA's MPS with a per-client
device memory limit, where a control daemon runs (or, asked for, one started for the run); the
per-process fraction of torch's caching allocator, set through its environment; else none, and a
budget is a promise. Driver memory limits (NVML's ``nvmlDeviceSetMemoryLimits_v1``) are detected
and named, not applied: they bind a cgroup, and one run's tests share theirs. Each rung is decided
from what the host shows at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from accelplat._leasing._shares import ENV_MEMORY_BYTES, ENV_MEMORY_FRACTION
from accelplat._platform import Platform, optional
from accelplat._types import MIB
from accelplat._vendor import versions
from accelplat.errors import ConfigurationError

ENV_ENFORCE = "ACCELPLAT_ENFORCE"  # auto (default), mps, torch or none; a run passes its choice on
MODES = ("auto", "mps", "torch", "none")
MPS_CONTROL = "nvidia-cuda-mps-control"
# "<ordinal>=<size>M,...": a client's device memory limit, one entry per device it may see
MPS_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_PIPE, MPS_LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
_MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"  # where clients look when CUDA_MPS_PIPE_DIRECTORY is unset
# torch's caching allocator reads its settings from one variable per torch device type; it knows
# per_process_memory_fraction from torch 2.9 (pytorch#161035), and older ones refuse unknown keys
_ALLOC_CONF = {"cuda": "PYTORCH_CUDA_ALLOC_CONF"}
_FRACTION_KEY = "per_process_memory_fraction"
_TORCH_WITH_KEY = ">=2.9"
_DRIVER_LIMITS = ">=615"  # nvmlDeviceSetMemoryLimits_v1 (MPS v3, the cgroup dmem controller)


@dataclass
class Enforcement:
    """How one run holds its shares to their budgets; ``close()`` ends what it started.

    ``environ`` is for every process of the run (the choice, the MPS pipe directory of a daemon
    it started); :meth:`limits` adds one share's bounds for the processes under it.
    """

    kind: str  # "mps", "torch" or "none"
    why: str  # what the ladder found, said in the session header and on stderr
    environ: dict[str, str] = field(default_factory=dict)
    ordinals: int = 1  # devices an MPS client may see
    conf: str = ""  # torch's allocator variable
    close: Callable[[], None] = lambda: None  # stops what the run started (a daemon)

    def __post_init__(self) -> None:
        self.environ.setdefault(ENV_ENFORCE, self.kind)  # a nested run takes the same rung

    def limits(self, lease_environ: Mapping[str, str | None]) -> dict[str, str]:
        """The variables holding a share (a lease's ``environ``) to its budget; none if whole."""
        budget = lease_environ.get(ENV_MEMORY_BYTES)
        fraction = lease_environ.get(ENV_MEMORY_FRACTION)
        if budget is None or fraction is None:
            return {}
        if self.kind == "mps":
            # every ordinal the same budget: the limit's ordinals are the client's or the server's
            mib = int(budget) // MIB  # rounded down: never more than the budget
            return {MPS_LIMIT: ",".join(f"{i}={mib}M" for i in range(self.ordinals))}
        given = os.environ.get(self.conf, "")
        if self.kind != "torch" or _FRACTION_KEY in given:  # the user's own fraction stands
            return {}
        return {self.conf: ",".join(filter(None, [given, f"{_FRACTION_KEY}:{fraction}"]))}

    def describe(self) -> str:
        """One line: the enforcement and why."""
        names = {"mps": "MPS per-client memory limits", "torch": "torch's per-process fraction"}
        how = f"enforced by {names[self.kind]}" if self.kind in names else "promised, not enforced"
        return f"budgets {how} ({self.why})"


def choose(platform: Platform, mode: str | None = None) -> Enforcement:
    """Take the highest rung ``mode`` allows here (``None``: ``$ACCELPLAT_ENFORCE``, else auto).

    ``auto`` uses a running MPS daemon, else torch's fraction, else none; ``mps`` starts a daemon
    for the run when none runs (pipe and log directories private to it, quit by :meth:`close`;
    the compute mode is never changed).

    Raises:
        ConfigurationError: An unknown mode, or one this host cannot give, with the reason.
    """
    asked = (mode or os.environ.get(ENV_ENFORCE) or "auto").strip().lower()
    if asked not in MODES:
        raise ConfigurationError(f"{ENV_ENFORCE}={asked!r}: expected one of {', '.join(MODES)}")
    notes: list[str] = []
    if asked in ("auto", "mps"):
        if (found := _mps(platform, asked == "mps", notes)) is not None:
            return found
        notes.append(_driver_note(platform))
    conf = _ALLOC_CONF.get(platform.device_type, "")
    torch = versions.distribution_version("torch")
    if asked in ("auto", "torch"):
        if conf and torch and versions.satisfies(torch, _TORCH_WITH_KEY):
            return Enforcement(
                "torch", f"{conf}, torch {torch}; binds torch's allocator only", conf=conf
            )
        notes.append(f"torch's fraction: needs torch {_TORCH_WITH_KEY} (found {torch or 'none'})")
    if asked not in ("auto", "none"):
        raise ConfigurationError(f"{ENV_ENFORCE}={asked}: not available here: {'; '.join(notes)}")
    return Enforcement("none", "; ".join(notes) or "asked for none")


def _mps(platform: Platform, start: bool, notes: list[str]) -> Enforcement | None:
    control = shutil.which(MPS_CONTROL)
    if control is None:
        notes.append(f"MPS: no {MPS_CONTROL} on PATH")
        return None
    pipe = os.environ.get(MPS_PIPE) or _MPS_DEFAULT_PIPE
    running = os.path.exists(os.path.join(pipe, "nvidia-cuda-mps-control.pid"))  # NVIDIA's docs
    if running and _mps_call(control, {}, "get_server_list"):
        return Enforcement("mps", f"the control daemon of {pipe}", ordinals=platform.device_count())
    if not start:
        notes.append(f"MPS: no control daemon in {pipe} ({ENV_ENFORCE}=mps starts one for the run)")
        return None
    root = tempfile.mkdtemp(prefix="accelplat-mps-")  # 0700: the run's alone
    env = {MPS_PIPE: os.path.join(root, "pipe"), MPS_LOG: os.path.join(root, "log")}
    for path in env.values():
        os.mkdir(path, 0o700)
    if not (_mps_call(control, env, "", "-d") and _mps_call(control, env, "get_server_list")):
        raise ConfigurationError(f"MPS: {control} -d started no control daemon (log: {root}/log)")

    def stop() -> None:
        _mps_call(control, env, "quit")
        shutil.rmtree(root, ignore_errors=True)

    why = f"a control daemon started for this run in {root}"
    return Enforcement("mps", why, env, platform.device_count(), close=stop)


def _mps_call(control: str, env: Mapping[str, str], command: str, *args: str) -> bool:
    """Give the MPS control program ``command``; whether it succeeded (a daemon answered)."""
    try:
        return subprocess.run(
            [control, *args], check=False, input=command and command + "\n",
            env={**os.environ, **env}, text=True, timeout=30,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,  # a daemon keeps pipes open
            start_new_session=True,  # its own session: a terminal's Ctrl-C is not its to get
        ).returncode == 0  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False


def _driver_note(platform: Platform) -> str:
    read = optional(platform, "driver_version")
    version = str(read()) if callable(read) else "none"
    if versions.satisfies(version, _DRIVER_LIMITS):
        return f"driver limits: offered by driver {version}, not applied (they bind a cgroup)"
    return f"driver limits: need driver {_DRIVER_LIMITS} ({version} here)"
