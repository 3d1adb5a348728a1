"""``ZE_AFFINITY_MASK`` and ``ONEAPI_DEVICE_SELECTOR``, as Level Zero and SYCL apply them.

torch's XPU devices are SYCL's Level Zero GPUs: ``ZE_FLAT_DEVICE_HIERARCHY`` picks the model, the
mask masks its devices, the selector filters the rest; rules and sources: ``docs/backends/xpu.md``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accelplat._util import shown
from accelplat.errors import ConfigurationError

ENV_AFFINITY_MASK = "ZE_AFFINITY_MASK"
ENV_DEVICE_SELECTOR = "ONEAPI_DEVICE_SELECTOR"
ENV_FLAT_DEVICE_HIERARCHY = "ZE_FLAT_DEVICE_HIERARCHY"

_MAX_INDEX_DIGITS = 18
_HUGE_INDEX: int = 10**_MAX_INDEX_DIGITS  # any index too long to read: it selects nothing
# Selector backends other than level_zero and * are accepted and select no XPU device; the
# grammar (intel/llvm sycl/doc/EnvironmentVariables.md) has no "acc" device type.
_BACKENDS = frozenset({"level_zero", "*", "opencl", "cuda", "hip", "native_cpu"})
_NO_XPU_TYPES = frozenset({"cpu", "fpga"})
# A selector's device: a whole one (group 1: "*", "gpu", a type without XPUs, an index), or a
# sub-device "N.M" or "N.*"
_ITEM_RE = re.compile(rf"(\*|gpu|{'|'.join(sorted(_NO_XPU_TYPES))}|[0-9]+)|[0-9]+\.(?:\*|[0-9]+)")
_STOUL_RE = re.compile(r"^\s*\+?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def _error(variable: str, value: str, words: str) -> ConfigurationError:
    return ConfigurationError(f"{variable}={shown(value)}: {words}")


class Hierarchy(str, enum.Enum):  # Level Zero's device model (ZE_FLAT_DEVICE_HIERARCHY)
    FLAT = "FLAT"  # every tile a device (Data Center GPU Max's default from driver 23.43)
    COMPOSITE = "COMPOSITE"  # every card a device, tiles its sub-devices (the spec's default)
    COMBINED = "COMBINED"  # every tile a device; cards reachable as composite devices


@dataclass(frozen=True)
class XpuTarget:  # one device as torch sees it: a card (driver order), whole or only some tiles
    card: int
    tiles: tuple[int, ...] | None = None


def parse_hierarchy(value: str | None, default: Hierarchy = Hierarchy.COMPOSITE) -> Hierarchy:
    """Read ``ZE_FLAT_DEVICE_HIERARCHY`` as the driver does, else ``default`` (the GPUs')."""
    # compute-runtime setDeviceHierarchyMode: an exact-case strcmp; anything else is the GPU's
    # getDefaultDeviceHierarchy (COMPOSITE, but FLAT on Xe HPC from driver 23.43.27642).
    return Hierarchy(value) if value in ("FLAT", "COMPOSITE", "COMBINED") else default


def default_devices(tiles: Sequence[int], hierarchy: Hierarchy) -> list[XpuTarget]:
    """Return the devices Level Zero reports unmasked: per card, or per tile if not COMPOSITE."""
    out: list[XpuTarget] = []
    for card, count in enumerate(tiles):
        if hierarchy is Hierarchy.COMPOSITE or count <= 1:
            out.append(XpuTarget(card))
        else:
            out.extend(XpuTarget(card, (t,)) for t in range(count))
    return out


def _number(digits: str, base: int = 10) -> int:
    """Read digits; a number too long for any device index reads as huge."""
    digits = digits.lstrip("0") or "0"
    return int(digits, base) if len(digits) <= _MAX_INDEX_DIGITS else _HUGE_INDEX


def _mask_number(entry: str, value: str) -> int:
    """Read a mask number as the driver does (``std::stoul(s, nullptr, 0)``, string_helpers.h)."""
    match = _STOUL_RE.match(entry)
    if match is None:
        if re.match(r"^\s*-\s*[0-9]", entry):
            return _HUGE_INDEX  # stoul wraps a negative number around: no device has that index
        raise _error(
            ENV_AFFINITY_MASK,
            value,
            f"{shown(entry)} is not a device index (expected a non-negative integer: decimal, "
            f"0x-hex or 0-octal, as the driver reads it)",
        )
    text = match.group(1)
    if text[:2] in ("0x", "0X"):
        return _number(text[2:], 16)
    return _number(text[1:], 8) if text.startswith("0") else _number(text)


def parse_affinity_mask(
    value: str | None, tiles: Sequence[int], hierarchy: Hierarchy = Hierarchy.COMPOSITE
) -> list[XpuTarget]:
    """Return the devices Level Zero reports under ``ZE_AFFINITY_MASK`` (``None``: unset)."""
    # compute-runtime parseAffinityMask: out-of-range entries are ignored, repeats count once, and
    # the mask never reorders devices ("not affected by the order ... in the affinity mask").
    devices = default_devices(tiles, hierarchy)
    if value is None or value.strip() in ("", "default"):
        return devices
    entries = [e.strip() for e in value.split(",")]
    if hierarchy is not Hierarchy.COMPOSITE:
        wanted: set[int] = set()
        for entry in entries:
            if "." in entry:  # the spec calls X.Y "not valid" here; the driver drops it silently
                words = (
                    f"{shown(entry)} names a sub-device, which is not valid with "
                    f"{ENV_FLAT_DEVICE_HIERARCHY}={hierarchy.value} (every tile is already a "
                    f"device: use flat indices, or set {ENV_FLAT_DEVICE_HIERARCHY}=COMPOSITE)"
                )
                raise _error(ENV_AFFINITY_MASK, value, words)
            wanted.add(_mask_number(entry, value))
        return [d for i, d in enumerate(devices) if i in wanted]
    parts: dict[int, set[int]] = {}  # per card, the tiles named (all of them for "X")
    for entry in entries:
        pieces = entry.split(".")
        if len(pieces) > 2:
            words = f"{shown(entry)} names a sub-sub-device; only 'X' and 'X.Y' are supported"
            raise _error(ENV_AFFINITY_MASK, value, words)
        card = _mask_number(pieces[0], value)
        if card >= len(tiles):
            continue
        every = set(range(max(1, tiles[card])))
        # One tile: that tile; several: the card limited to them; all of them: the card.
        named = every if len(pieces) == 1 else {_mask_number(pieces[1], value)} & every
        parts.setdefault(card, set()).update(named)
    return [  # every tile named: the whole card
        XpuTarget(card, None if len(chosen) == max(1, tiles[card]) else tuple(sorted(chosen)))
        for card, chosen in sorted(parts.items())
        if chosen
    ]


_Term = tuple[bool, bool, tuple[str, ...]]  # negative, applies (level_zero or *), the devices


def _parse_selector(value: str) -> list[_Term]:
    terms: list[_Term] = []
    for raw in value.split(";"):
        text = raw.strip()
        if not text:
            continue
        negative = text.startswith("!")
        if not negative and terms and terms[-1][0]:  # discard filters "must all appear at the end"
            words = (
                f"the '!' (discard) terms must all come after the accepting terms, but "
                f"{shown(raw.strip())} follows one"
            )
            raise _error(ENV_DEVICE_SELECTOR, value, words)
        backend, colon, devices = text.removeprefix("!").partition(":")
        backend = backend.strip().lower()  # backends are case-insensitive
        if not colon or not devices.strip():
            words = "is not of the form 'backend:devices' (e.g. 'level_zero:0,1' or 'level_zero:*')"
            raise _error(ENV_DEVICE_SELECTOR, value, f"term {shown(raw.strip())} {words}")
        if backend not in _BACKENDS:
            expected = ", ".join(sorted(_BACKENDS))
            words = f"unknown backend {shown(backend)} (expected one of {expected})"
            raise _error(ENV_DEVICE_SELECTOR, value, words)
        items = tuple(d.strip().lower() for d in devices.split(","))
        for item in items:
            _check_item(item, negative, value)
        terms.append((negative, backend in ("level_zero", "*"), items))
    return terms


def _check_item(item: str, negative: bool, value: str) -> None:
    match = _ITEM_RE.fullmatch(item)
    if match is None:
        words = "(supported: '*', 'gpu', an index 'N', 'N.M' or 'N.*')"
        raise _error(ENV_DEVICE_SELECTOR, value, f"unsupported device {shown(item)} {words}")
    if negative and match[1] is None:
        words = f"a '!' term cannot name a sub-device ({shown(item)})"
        raise _error(ENV_DEVICE_SELECTOR, value, words)


def apply_device_selector(
    value: str | None,
    devices: Sequence[XpuTarget],
    tiles: Sequence[int],
    hierarchy: Hierarchy = Hierarchy.COMPOSITE,
) -> list[XpuTarget]:
    """Return the devices SYCL exposes: Level Zero's (masked) filtered by ``value``."""
    if value is None or not value.strip():
        return list(devices)
    terms = _parse_selector(value)
    whole: set[int] = set()
    drop: set[int] = set()
    sub: dict[int, set[int]] = {}
    for negative, applies, items in terms:
        chosen = drop if negative else whole  # a '!' term names no sub-device (checked)
        for item in items if applies else ():
            if item in ("*", "gpu"):
                chosen.update(range(len(devices)))
            elif "." in item:
                if hierarchy is not Hierarchy.COMPOSITE:
                    words = (
                        f"{shown(item)} names a sub-device, but with {ENV_FLAT_DEVICE_HIERARCHY}="
                        f"{hierarchy.value} devices have none; use device indices"
                    )
                    raise _error(ENV_DEVICE_SELECTOR, value, words)
                head, _, tail = item.partition(".")
                n = _number(head)
                if n >= len(devices):
                    continue
                own = devices[n].tiles
                available = list(range(max(1, tiles[devices[n].card])) if own is None else own)
                if len(available) <= 1:
                    continue
                if tail != "*":  # sub-devices are numbered among the tiles the device exposes
                    m = _number(tail)
                    available = available[m : m + 1]
                sub.setdefault(n, set()).update(available)
            elif item not in _NO_XPU_TYPES:  # an index (checked)
                chosen.add(_number(item))
    if all(negative for negative, _, _ in terms):  # discard-only input implies accept-all
        whole = set(range(len(devices)))  # (EnvironmentVariables.md)
    out: list[XpuTarget] = []
    for n, device in enumerate(devices):
        if n in drop:
            continue
        if n in whole:
            out.append(device)
        out.extend(XpuTarget(device.card, (tile,)) for tile in sorted(sub.get(n, ())))
    return out


def visible_targets(
    tiles: Sequence[int], env: Mapping[str, str], default_hierarchy: Hierarchy = Hierarchy.COMPOSITE
) -> list[XpuTarget]:
    """Return the devices torch numbers ``0, 1, …``, all three variables of ``env`` applied."""
    hierarchy = parse_hierarchy(env.get(ENV_FLAT_DEVICE_HIERARCHY), default_hierarchy)
    masked = parse_affinity_mask(env.get(ENV_AFFINITY_MASK), tiles, hierarchy)
    return apply_device_selector(env.get(ENV_DEVICE_SELECTOR), masked, tiles, hierarchy)


def affinity_mask_for(
    targets: Sequence[XpuTarget], tiles: Sequence[int], hierarchy: Hierarchy
) -> str:
    """Write the ``ZE_AFFINITY_MASK`` that shows exactly ``targets`` (with no device selector)."""
    entries: list[str] = []
    for target in targets:
        chosen = range(tiles[target.card]) if target.tiles is None else target.tiles
        if hierarchy is not Hierarchy.COMPOSITE:  # flat indices
            entries.extend(str(sum(tiles[: target.card]) + t) for t in chosen)
        elif target.tiles is None:
            entries.append(str(target.card))
        else:
            entries.extend(f"{target.card}.{t}" for t in chosen)
    return ",".join(entries)
