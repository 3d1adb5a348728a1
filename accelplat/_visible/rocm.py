"""``ROCR_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` on ROCm.

The ROCm stack filters devices twice, and this module follows both filters exactly as the
runtime libraries implement them:

1. **ROCr** (the HSA runtime) reads ``ROCR_VISIBLE_DEVICES`` first. Its indices count the GPUs of
   the machine in ROCr's enumeration order (KFD topology nodes that are GPUs, in node order,
   leaving out nodes whose render device this process cannot open). Rules:

   * unset: every GPU; set but empty: no GPU;
   * the text is split at commas; each token is trimmed of white space and upper-cased;
   * a token starting with ``G`` is a UUID, ``GPU-`` and 16 hex digits of the KFD ``unique_id``,
     which may be abbreviated to any prefix of 5 to 20 characters that matches exactly one GPU
     (a GPU whose ``unique_id`` is 0 matches nothing);
   * any other token is an integer read like C's ``strtol`` with base 0 (``0x1f`` is hex and
     ``010`` is octal) that must use the whole token;
   * an invalid token, an index out of range, an ambiguous UUID or a GPU named a second time ends
     the list: the GPUs named before it stay visible, in the order named.

2. **HIP** then reads ``HIP_VISIBLE_DEVICES`` when it is non-empty, otherwise
   ``CUDA_VISIBLE_DEVICES``; an empty or unset variable means no filtering. Its indices count the
   GPUs ROCr left, in ROCr's order. Rules:

   * the text is split at commas; a trailing comma is ignored;
   * a token containing ``GPU-`` names the first GPU whose UUID (``GPU-`` and 16 *lower-case* hex
     digits, or ``GPU-XX`` without a ``unique_id``) contains the token; matching is
     case-sensitive;
   * any other token must be a canonical decimal integer (no sign, spaces or leading zeros);
   * an invalid or out-of-range token ends the list; a GPU named again is skipped.

vLLM treats ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` that are both non-empty and
differ as a configuration error (HIP itself would silently prefer the first); so does
:func:`select_hip_variable`. An empty value counts as unset, for HIP and vLLM alike. An empty
token inside the ROCr list (``"0,,1"``) makes ROCr throw while parsing, so it is reported as a
:class:`~accelplat.errors.ConfigurationError` too.

Everything here is a pure function of strings and a UUID table: nothing reads the environment or
imports a vendor library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from accelplat.errors import ConfigurationError

__all__ = [
    "ENV_CUDA_VISIBLE_DEVICES",
    "ENV_HIP_VISIBLE_DEVICES",
    "ENV_ROCR_VISIBLE_DEVICES",
    "hip_uuid",
    "parse_hip_visible_devices",
    "parse_rocr_visible_devices",
    "select_hip_variable",
    "visible_physical_indices",
]

ENV_ROCR_VISIBLE_DEVICES = "ROCR_VISIBLE_DEVICES"
"""The ROCr runtime's filter, applied first."""

ENV_HIP_VISIBLE_DEVICES = "HIP_VISIBLE_DEVICES"
"""HIP's filter, applied to what ROCr left."""

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
"""Honoured by HIP when ``HIP_VISIBLE_DEVICES`` is unset or empty."""

_NO_UUID = "GPU-XX"
_STRTOL_RE = re.compile(r"^[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)$")
_LONG_MAX = 2**63 - 1
_MAX_LONG_DIGITS = 64
"""Significant digits beyond which a number exceeds a 64-bit ``long`` in base 8, 10 or 16."""
_MAX_INDEX_DIGITS = 18
"""Decimal digits of the largest index read exactly; longer text is out of range anyway."""


def hip_uuid(unique_id: int) -> str | None:
    """Return the UUID string ROCm reports for a KFD ``unique_id``.

    Args:
        unique_id: The ``unique_id`` property of a KFD topology node (an unsigned 64-bit value).

    Returns:
        ``"GPU-"`` and 16 lower-case hex digits, or ``None`` for ``0`` (a GPU without a UUID,
        which HIP reports as ``"GPU-XX"``).
    """
    if unique_id <= 0:
        return None
    return f"GPU-{unique_id & 0xFFFFFFFFFFFFFFFF:016x}"


def _strtol(token: str) -> int | None:
    """Read ``token`` like ``strtol(token, &end, 0)`` that must consume it all; else ``None``.

    Like ``strtol``, a value beyond the range of a C ``long`` saturates at ``LONG_MAX``
    (``LONG_MIN``), so text of any length is read in bounded time.
    """
    if not _STRTOL_RE.match(token):
        return None
    sign = -1 if token.startswith("-") else 1
    body = token.lstrip("+-")
    if body[:2] in ("0x", "0X"):
        digits, base = body[2:], 16
    elif len(body) > 1 and body.startswith("0"):
        digits, base = body[1:], 8
    else:
        digits, base = body, 10
    digits = digits.lstrip("0") or "0"
    if len(digits) > _MAX_LONG_DIGITS:
        return sign * _LONG_MAX
    return sign * min(int(digits, base), _LONG_MAX)


def _rocr_uuid_match(token: str, uuids: Sequence[str | None]) -> int:
    """Return the only GPU whose upper-cased UUID starts with ``token``, else ``-1``."""
    if not 5 <= len(token) <= 20:
        return -1
    found = -1
    for index, uuid in enumerate(uuids):
        if uuid is None:
            continue
        if uuid.upper().startswith(token):
            if found != -1:
                return -1
            found = index
    return found


def parse_rocr_visible_devices(
    value: str | None, count: int, uuids: Sequence[str | None] | None = None
) -> list[int]:
    """Apply ``ROCR_VISIBLE_DEVICES`` to the machine's GPUs, as ROCr does.

    Args:
        value: The variable's text, or ``None`` when it is unset.
        count: Number of GPUs in ROCr's enumeration.
        uuids: Per GPU, its UUID (``"GPU-…"``) or ``None`` when it has none; ``None`` when the
            UUIDs are unknown (a UUID token is then a configuration error).

    Returns:
        Indices into the enumeration, in the order the GPUs become visible.

    Raises:
        ConfigurationError: For an empty token between commas (ROCr throws on it), or for a UUID
            token when ``uuids`` is ``None``.
    """
    if value is None:
        return list(range(count))
    if value == "":
        return []
    if uuids is not None and len(uuids) != count:
        raise ValueError(f"uuids has {len(uuids)} entries for {count} GPUs")
    # C++ getline on a stringstream yields no empty token after a trailing comma.
    tokens = value.split(",")
    if tokens and tokens[-1] == "":
        tokens.pop()
    chosen: list[int] = []
    for raw in tokens[:count]:
        token = raw.strip().upper()
        if token == "":
            raise ConfigurationError(
                f"{ENV_ROCR_VISIBLE_DEVICES}={value!r} has an empty entry; the ROCm runtime "
                f"cannot parse it"
            )
        if token.startswith("G"):
            if uuids is None:
                raise ConfigurationError(
                    f"{ENV_ROCR_VISIBLE_DEVICES}={value!r} names a GPU by UUID, but the GPUs' "
                    f"UUIDs are unknown here (no KFD topology)"
                )
            index = _rocr_uuid_match(token, uuids)
        else:
            parsed = _strtol(token)
            index = -1 if parsed is None else parsed
        if not 0 <= index < count or index in chosen:
            break
        chosen.append(index)
    return chosen


def parse_hip_visible_devices(
    value: str | None, count: int, uuids: Sequence[str | None] | None = None
) -> list[int] | None:
    """Apply HIP's device list (``HIP_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES``), as HIP does.

    Args:
        value: The variable's text, or ``None`` when it is unset.
        count: Number of GPUs ROCr surfaced (after ``ROCR_VISIBLE_DEVICES``).
        uuids: Per surfaced GPU, its UUID or ``None``; ``None`` when the UUIDs are unknown.

    Returns:
        Indices into ROCr's surfaced list in visible order, or ``None`` when the value is unset
        or empty (HIP then applies no filter).

    Raises:
        ConfigurationError: For a UUID token when ``uuids`` is ``None``.
    """
    if not value:
        return None
    if uuids is not None and len(uuids) != count:
        raise ValueError(f"uuids has {len(uuids)} entries for {count} GPUs")
    tokens = value.split(",")
    if tokens[-1] == "":
        tokens.pop()  # HIP stops once the position reaches the end of the text
    chosen: list[int] = []
    for token in tokens:
        if "GPU-" in token:
            if uuids is None:
                raise ConfigurationError(
                    f"HIP device list {value!r} names a GPU by UUID, but the GPUs' UUIDs are "
                    f"unknown here (no KFD topology)"
                )
            index = next(
                (i for i, u in enumerate(uuids) if token in (u if u is not None else _NO_UUID)),
                -1,
            )
        elif token.isascii() and token.isdigit() and (token == "0" or token[0] != "0"):
            # Digits without a leading zero; a longer number than a device index is out of range.
            index = int(token) if len(token) <= _MAX_INDEX_DIGITS else count
        else:
            index = -1
        if not 0 <= index < count:
            break
        if index not in chosen:
            chosen.append(index)
    return chosen


def select_hip_variable(env: Mapping[str, str]) -> tuple[str, str] | None:
    """Return the variable HIP takes its device list from, and its value.

    HIP reads ``HIP_VISIBLE_DEVICES`` when it is non-empty and otherwise ``CUDA_VISIBLE_DEVICES``
    (ROCm clr ``rocdevice.cpp``); vLLM treats an empty value as unset too (Ray sets
    ``HIP_VISIBLE_DEVICES`` to ``""`` while it starts an actor).

    Args:
        env: The environment (or any mapping of variable names to values).

    Returns:
        ``(name, value)`` of ``HIP_VISIBLE_DEVICES`` when it is non-empty, else of
        ``CUDA_VISIBLE_DEVICES`` when that is non-empty, else ``None`` (no HIP filter).

    Raises:
        ConfigurationError: When both are non-empty and different, which vLLM rejects as
            ambiguous (HIP alone would silently prefer ``HIP_VISIBLE_DEVICES``).
    """
    hip = env.get(ENV_HIP_VISIBLE_DEVICES) or None
    cuda = env.get(ENV_CUDA_VISIBLE_DEVICES) or None
    if hip is not None and cuda is not None and hip != cuda:
        raise ConfigurationError(
            f"{ENV_HIP_VISIBLE_DEVICES}={hip!r} and {ENV_CUDA_VISIBLE_DEVICES}={cuda!r} "
            f"disagree; set only one of them, or set both to the same value"
        )
    if hip is not None:
        return ENV_HIP_VISIBLE_DEVICES, hip
    if cuda is not None:
        return ENV_CUDA_VISIBLE_DEVICES, cuda
    return None


def visible_physical_indices(
    count: int, env: Mapping[str, str], uuids: Sequence[str | None] | None = None
) -> list[int]:
    """Apply ROCr's and then HIP's filter to the machine's GPUs.

    Args:
        count: Number of GPUs in ROCr's enumeration (physical indices ``0 .. count - 1``).
        env: The environment to read the three variables from.
        uuids: Per GPU, its UUID or ``None``; ``None`` when unknown.

    Returns:
        Physical indices in visible order: element ``i`` is the GPU that torch calls device
        ``i``.

    Raises:
        ConfigurationError: For conflicting HIP/CUDA variables, an empty ROCr entry, or a UUID
            entry without UUIDs to match it against.
    """
    surfaced = parse_rocr_visible_devices(env.get(ENV_ROCR_VISIBLE_DEVICES), count, uuids)
    selected = select_hip_variable(env)
    if selected is None:
        return surfaced
    _, value = selected
    sub_uuids = None if uuids is None else [uuids[i] for i in surfaced]
    picked = parse_hip_visible_devices(value, len(surfaced), sub_uuids)
    if picked is None:
        return surfaced
    return [surfaced[i] for i in picked]
