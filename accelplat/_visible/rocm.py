"""``ROCR_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` on ROCm.

ROCr applies ``ROCR_VISIBLE_DEVICES`` to its enumeration (KFD GPU nodes in node order), then HIP
applies ``HIP_VISIBLE_DEVICES`` (when empty or unset, ``CUDA_VISIBLE_DEVICES``) to what ROCr left,
as ROCr ``amd_filter_device.cpp`` and ROCm/clr ``rocdevice.cpp`` do (``docs/backends/rocm.md``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from accelplat._util import shown
from accelplat.errors import ConfigurationError

ENV_ROCR_VISIBLE_DEVICES = "ROCR_VISIBLE_DEVICES"
ENV_HIP_VISIBLE_DEVICES = "HIP_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

_NO_UUID = "GPU-XX"  # what HIP calls a GPU without a unique_id (amd_gpu_agent.cpp)
# strtol's base 0: a sign, then 0x and hex digits, 0 and octal digits, or decimal digits
_STRTOL_RE = re.compile(r"^([+-]?)(?:0[xX]([0-9a-fA-F]+)|0([0-7]*)|([1-9][0-9]*))$")
_LONG_MAX = 2**63 - 1
_MAX_LONG_DIGITS = 64  # beyond this, a number exceeds a 64-bit long in base 8, 10 or 16
_MAX_INDEX_DIGITS = 18  # longer decimal text is out of range anyway


def hip_uuid(unique_id: int) -> str | None:
    """Return the UUID ROCm reports for a KFD ``unique_id`` (``GPU-``, 16 hex digits), or None."""
    return None if unique_id <= 0 else f"GPU-{unique_id & 0xFFFFFFFFFFFFFFFF:016x}"


def _strtol(token: str) -> int:
    """Read ``token`` like ``strtol(token, &end, 0)`` that must consume it all; else ``-1``.

    Beyond a long's digits, ``±LONG_MAX`` as strtol saturates; any value above the GPU count
    selects none, so a larger one read exactly does the same.
    """
    match = _STRTOL_RE.match(token)
    if match is None:
        return -1  # no GPU
    sign, hexadecimal, octal, decimal = match.groups()
    base = 16 if hexadecimal else 8 if octal is not None else 10
    digits = (hexadecimal or octal or decimal or "").lstrip("0") or "0"  # "0": octal, empty
    value = int(digits, base) if len(digits) <= _MAX_LONG_DIGITS else _LONG_MAX
    return -value if sign == "-" else value


def _entries(value: str, count: int, uuids: Sequence[str | None] | None) -> list[str]:
    """The comma-separated entries of ``value``, less an empty last one."""
    # C++ getline on a stringstream yields no empty token after a trailing comma (ROCr), and HIP
    # stops once the position reaches the end of the text.
    if uuids is not None and len(uuids) != count:
        raise ValueError(f"uuids has {len(uuids)} entries for {count} GPUs")
    return value.removesuffix(",").split(",")


def _uuids_unknown(what: str) -> ConfigurationError:
    return ConfigurationError(
        f"{what} names a GPU by UUID, but the GPUs' UUIDs are unknown here (no KFD topology)"
    )


def parse_rocr_visible_devices(
    value: str | None, count: int, uuids: Sequence[str | None] | None = None
) -> list[int]:
    """Return the indices ``ROCR_VISIBLE_DEVICES`` surfaces from ROCr's enumeration, in order."""
    if not value:  # unset: every GPU; empty: none (amd_filter_device.cpp, flag.h)
        return list(range(count)) if value is None else []
    chosen: list[int] = []
    for raw in _entries(value, count, uuids)[:count]:
        token = raw.strip().upper()
        if token == "":  # token.at(0) throws in ROCr
            raise ConfigurationError(
                f"{ENV_ROCR_VISIBLE_DEVICES}={shown(value)} has an empty entry; the ROCm runtime "
                f"cannot parse it"
            )
        if token.startswith("G"):  # a UUID: GPU- and the hex digits of unique_id, or a prefix
            if uuids is None:
                raise _uuids_unknown(f"{ENV_ROCR_VISIBLE_DEVICES}={shown(value)}")
            # The only GPU whose upper-cased UUID starts with a prefix of 5 to 20 characters; a
            # GPU whose unique_id is 0 ("Invalid-UUID") matches none.
            hits = [i for i, u in enumerate(uuids) if u is not None and u.upper().startswith(token)]
            index = hits[0] if len(hits) == 1 and 5 <= len(token) <= 20 else -1
        else:
            index = _strtol(token)
        if not 0 <= index < count or index in chosen:
            break  # invalid, out of range, ambiguous or repeated: the list ends here
        chosen.append(index)
    return chosen


def parse_hip_visible_devices(
    value: str | None, count: int, uuids: Sequence[str | None] | None = None
) -> list[int] | None:
    """Return the indices HIP's device list picks from ROCr's, or ``None`` when empty or unset."""
    if not value:
        return None
    chosen: list[int] = []
    for token in _entries(value, count, uuids):  # rocdevice.cpp:496-545
        if "GPU-" in token:  # the first GPU whose UUID contains it, case-sensitively
            if uuids is None:
                raise _uuids_unknown(f"HIP device list {shown(value)}")
            index = next((i for i, u in enumerate(uuids) if token in (u or _NO_UUID)), -1)
        elif token.isascii() and token.isdigit() and (token == "0" or token[0] != "0"):
            # Canonical decimal (str_id == to_string(atoi)); a longer one is out of range anyway.
            index = int(token) if len(token) <= _MAX_INDEX_DIGITS else count
        else:
            index = -1
        if not 0 <= index < count:
            break
        if index not in chosen:  # a GPU named again is skipped
            chosen.append(index)
    return chosen


def select_hip_variable(env: Mapping[str, str]) -> tuple[str, str] | None:
    """Return ``(name, value)`` of the variable HIP takes its device list from, or ``None``."""
    # HIP reads HIP_VISIBLE_DEVICES when non-empty, else CUDA_VISIBLE_DEVICES (rocdevice.cpp:496);
    # vLLM's _sync_hip_cuda_env_vars treats empty as unset too, and rejects two different values
    # (HIP alone would prefer HIP_VISIBLE_DEVICES); Ray sets HIP_VISIBLE_DEVICES="" while it
    # starts an actor (vllm/triton_utils/importing.py).
    hip = env.get(ENV_HIP_VISIBLE_DEVICES) or None
    cuda = env.get(ENV_CUDA_VISIBLE_DEVICES) or None
    if hip is not None and cuda is not None and hip != cuda:
        raise ConfigurationError(
            f"{ENV_HIP_VISIBLE_DEVICES}={shown(hip)} and {ENV_CUDA_VISIBLE_DEVICES}={shown(cuda)} "
            f"disagree; set only one of them, or set both to the same value"
        )
    if hip is not None:
        return ENV_HIP_VISIBLE_DEVICES, hip
    return None if cuda is None else (ENV_CUDA_VISIBLE_DEVICES, cuda)


def visible_physical_indices(
    count: int, env: Mapping[str, str], uuids: Sequence[str | None] | None = None
) -> list[int]:
    """Return physical indices in visible order (ROCr's, then HIP's filter): ``[i]`` is torch's."""
    surfaced = parse_rocr_visible_devices(env.get(ENV_ROCR_VISIBLE_DEVICES), count, uuids)
    selected = select_hip_variable(env)
    if selected is None:
        return surfaced
    sub_uuids = None if uuids is None else [uuids[i] for i in surfaced]
    picked = parse_hip_visible_devices(selected[1], len(surfaced), sub_uuids)
    return surfaced if picked is None else [surfaced[i] for i in picked]
