"""``ZE_AFFINITY_MASK`` and ``ONEAPI_DEVICE_SELECTOR``, as Level Zero and SYCL apply them.

torch's XPU devices are the SYCL GPU devices of the Level Zero backend. Three variables decide
which cards (and tiles) they are, in this order: ``ZE_FLAT_DEVICE_HIERARCHY`` picks the device
model, ``ZE_AFFINITY_MASK`` masks devices of that model, and ``ONEAPI_DEVICE_SELECTOR`` filters
what Level Zero reports. These are pure functions of strings and per-card tile counts; the rules
and their sources (the Level Zero spec, compute-runtime, intel/llvm) are in
``docs/backends/xpu.md``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accelplat.errors import ConfigurationError

ENV_AFFINITY_MASK = "ZE_AFFINITY_MASK"
ENV_DEVICE_SELECTOR = "ONEAPI_DEVICE_SELECTOR"
ENV_FLAT_DEVICE_HIERARCHY = "ZE_FLAT_DEVICE_HIERARCHY"

_INDEX_RE = re.compile(r"^[0-9]+$")
_MAX_INDEX_DIGITS = 18
_HUGE_INDEX: int = 10**_MAX_INDEX_DIGITS  # any index too long to read: it selects nothing
# Selector backends other than level_zero and * are accepted and select no XPU device; the
# grammar (intel/llvm sycl/doc/EnvironmentVariables.md) has no "acc" device type.
_BACKENDS = frozenset({"level_zero", "*", "opencl", "cuda", "hip", "native_cpu"})
_NO_XPU_TYPES = frozenset({"cpu", "fpga"})
_STOUL_RE = re.compile(r"^\s*\+?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


class Hierarchy(str, enum.Enum):
    """Level Zero's device model (``ZE_FLAT_DEVICE_HIERARCHY``)."""

    FLAT = "FLAT"  # every tile a device (Data Center GPU Max's default from driver 23.43)
    COMPOSITE = "COMPOSITE"  # every card a device, tiles its sub-devices (the spec's default)
    COMBINED = "COMBINED"  # every tile a device; cards reachable as composite devices


@dataclass(frozen=True)
class XpuTarget:
    """One device as torch sees it: card ``card`` (driver order), whole or only ``tiles``."""

    card: int
    tiles: tuple[int, ...] | None = None


def parse_hierarchy(value: str | None, default: Hierarchy = Hierarchy.COMPOSITE) -> Hierarchy:
    """Read ``ZE_FLAT_DEVICE_HIERARCHY`` (``None``: unset) as the driver does, else ``default``.

    ``default`` is the model the driver defaults to on this machine's GPUs.
    """
    # compute-runtime setDeviceHierarchyMode: an exact-case strcmp; anything else is the GPU's
    # getDefaultDeviceHierarchy (COMPOSITE, but FLAT on Xe HPC from driver 23.43.27642).
    if value in ("FLAT", "COMPOSITE", "COMBINED"):
        return Hierarchy(value)
    return default


def default_devices(tiles: Sequence[int], hierarchy: Hierarchy) -> list[XpuTarget]:
    """Return the devices Level Zero reports without a mask, given each card's tile count.

    One per card (``COMPOSITE``), or per tile of multi-tile cards (``FLAT``, ``COMBINED``),
    numbered card by card.
    """
    out: list[XpuTarget] = []
    for card, count in enumerate(tiles):
        if hierarchy is Hierarchy.COMPOSITE or count <= 1:
            out.append(XpuTarget(card))
        else:
            out.extend(XpuTarget(card, (t,)) for t in range(count))
    return out


def _number(digits: str) -> int:
    """Read a string of decimal digits; one too long for any device index reads as huge."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_INDEX_DIGITS else _HUGE_INDEX


def _mask_number(entry: str, value: str) -> int:
    """Read a mask number as the driver does (``std::stoul(s, nullptr, 0)``, string_helpers.h).

    ``0x1`` is hex, ``010`` octal (8), and reading stops at the first non-digit.

    Raises:
        ConfigurationError: When the entry does not start with a number (``stoul`` throws).
    """
    match = _STOUL_RE.match(entry)
    if match is None:
        if re.match(r"^\s*-\s*[0-9]", entry):
            return _HUGE_INDEX  # stoul wraps a negative number around: no device has that index
        raise ConfigurationError(
            f"{ENV_AFFINITY_MASK}={value!r}: {entry!r} is not a device index (expected a "
            f"non-negative integer: decimal, 0x-hex or 0-octal, as the driver reads it)"
        )
    text = match.group(1)
    if text[:2] in ("0x", "0X"):
        digits, base = text[2:], 16
    elif len(text) > 1:
        digits, base = (text[1:], 8) if text.startswith("0") else (text, 10)
    else:
        digits, base = text, 10
    digits = digits.lstrip("0") or "0"
    return int(digits, base) if len(digits) <= _MAX_INDEX_DIGITS else _HUGE_INDEX


def _normalise(target: XpuTarget, tiles: Sequence[int]) -> XpuTarget:
    """Drop a tile list that covers the whole card."""
    if target.tiles is not None and set(target.tiles) == set(range(max(1, tiles[target.card]))):
        return XpuTarget(target.card)
    return target


def parse_affinity_mask(
    value: str | None, tiles: Sequence[int], hierarchy: Hierarchy = Hierarchy.COMPOSITE
) -> list[XpuTarget]:
    """Apply ``ZE_AFFINITY_MASK`` to the machine's cards.

    Args:
        value: The variable's text, or ``None`` when it is unset.
        tiles: Per physical card (in driver order), its number of tiles.
        hierarchy: The device model from ``ZE_FLAT_DEVICE_HIERARCHY``.

    Returns:
        The devices Level Zero reports, in its order.

    Raises:
        ConfigurationError: For an entry that is not an index (or ``X.Y`` in ``COMPOSITE``), for
            ``X.Y`` in the ``FLAT``/``COMBINED`` models, and for deeper forms.
    """
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
                raise ConfigurationError(
                    f"{ENV_AFFINITY_MASK}={value!r}: {entry!r} names a sub-device, which is not "
                    f"valid with {ENV_FLAT_DEVICE_HIERARCHY}={hierarchy.value} (every tile is "
                    f"already a device: use flat indices, or set "
                    f"{ENV_FLAT_DEVICE_HIERARCHY}=COMPOSITE)"
                )
            wanted.add(_mask_number(entry, value))
        return [d for i, d in enumerate(devices) if i in wanted]
    whole: set[int] = set()
    parts: dict[int, set[int]] = {}
    for entry in entries:
        pieces = entry.split(".")
        if len(pieces) > 2:
            raise ConfigurationError(
                f"{ENV_AFFINITY_MASK}={value!r}: {entry!r} names a sub-sub-device; only 'X' and "
                f"'X.Y' are supported"
            )
        card = _mask_number(pieces[0], value)
        if card >= len(tiles):
            continue
        if len(pieces) == 1:
            whole.add(card)
            continue
        tile = _mask_number(pieces[1], value)  # one tile: that tile; several: the card limited
        if tile < max(1, tiles[card]):
            parts.setdefault(card, set()).add(tile)
    out: list[XpuTarget] = []
    for card in range(len(tiles)):
        if card in whole:
            out.append(XpuTarget(card))
        elif card in parts:
            out.append(_normalise(XpuTarget(card, tuple(sorted(parts[card]))), tiles))
    return out


@dataclass(frozen=True)
class _Term:
    negative: bool
    applies: bool  # backend is level_zero or *
    items: tuple[str, ...]


def _parse_selector(value: str) -> list[_Term]:
    terms: list[_Term] = []
    for raw in value.split(";"):
        text = raw.strip()
        if not text:
            continue
        negative = text.startswith("!")
        if negative:
            text = text[1:].strip()
        elif any(t.negative for t in terms):  # discard filters "must all appear at the end"
            raise ConfigurationError(
                f"{ENV_DEVICE_SELECTOR}={value!r}: the '!' (discard) terms must all come after "
                f"the accepting terms, but {raw.strip()!r} follows one"
            )
        backend, colon, devices = text.partition(":")
        backend = backend.strip().lower()  # backends are case-insensitive
        if not colon or not devices.strip():
            raise ConfigurationError(
                f"{ENV_DEVICE_SELECTOR}={value!r}: term {raw.strip()!r} is not of the form "
                f"'backend:devices' (e.g. 'level_zero:0,1' or 'level_zero:*')"
            )
        if backend not in _BACKENDS:
            raise ConfigurationError(
                f"{ENV_DEVICE_SELECTOR}={value!r}: unknown backend {backend!r} (expected one of "
                f"{', '.join(sorted(_BACKENDS))})"
            )
        items = tuple(d.strip().lower() for d in devices.split(","))
        for item in items:
            _check_item(item, negative, value)
        terms.append(_Term(negative, backend in ("level_zero", "*"), items))
    return terms


def _check_item(item: str, negative: bool, value: str) -> None:
    if item in ("*", "gpu") or item in _NO_XPU_TYPES or _INDEX_RE.match(item):
        return
    pieces = item.split(".")
    if (
        len(pieces) == 2
        and _INDEX_RE.match(pieces[0])
        and (pieces[1] == "*" or _INDEX_RE.match(pieces[1]))
    ):
        if negative:
            raise ConfigurationError(
                f"{ENV_DEVICE_SELECTOR}={value!r}: a '!' term cannot name a sub-device ({item!r})"
            )
        return
    raise ConfigurationError(
        f"{ENV_DEVICE_SELECTOR}={value!r}: unsupported device {item!r} (supported: '*', 'gpu', "
        f"an index 'N', 'N.M' or 'N.*')"
    )


def apply_device_selector(
    value: str | None,
    devices: Sequence[XpuTarget],
    tiles: Sequence[int],
    hierarchy: Hierarchy = Hierarchy.COMPOSITE,
) -> list[XpuTarget]:
    """Filter the Level Zero devices with ``ONEAPI_DEVICE_SELECTOR``.

    Args:
        value: The variable's text, or ``None`` when it is unset.
        devices: The devices Level Zero reports (after ``ZE_AFFINITY_MASK``), in its order.
        tiles: Per physical card, its number of tiles (to expand ``N.*`` and check ``N.M``).
        hierarchy: The device model; tile forms need ``COMPOSITE``.

    Returns:
        The devices SYCL (and so torch) exposes, in order.

    Raises:
        ConfigurationError: For malformed or unsupported terms, and for tile forms outside the
            ``COMPOSITE`` model.
    """
    if value is None or not value.strip():
        return list(devices)
    terms = _parse_selector(value)
    positives = [t for t in terms if not t.negative]
    accept_all = not positives  # discard-only input implies accept-all (EnvironmentVariables.md)
    whole: set[int] = set()
    sub: dict[int, set[int]] = {}
    for term in positives:
        if not term.applies:
            continue
        for item in term.items:
            if item in ("*", "gpu"):
                whole.update(range(len(devices)))
            elif item in _NO_XPU_TYPES:
                continue
            elif "." in item:
                if hierarchy is not Hierarchy.COMPOSITE:
                    raise ConfigurationError(
                        f"{ENV_DEVICE_SELECTOR}={value!r}: {item!r} names a sub-device, but "
                        f"with {ENV_FLAT_DEVICE_HIERARCHY}={hierarchy.value} devices have "
                        f"none; use device indices"
                    )
                head, _, tail = item.partition(".")
                n = _number(head)
                if n >= len(devices):
                    continue
                available = _device_tiles(devices[n], tiles)
                if len(available) <= 1:
                    continue
                if tail == "*":
                    chosen = available
                else:  # sub-devices are numbered among the tiles the device exposes
                    m = _number(tail)
                    chosen = available[m : m + 1]
                sub.setdefault(n, set()).update(chosen)
            else:
                whole.add(_number(item))
    if accept_all:
        whole = set(range(len(devices)))
    drop: set[int] = set()
    for term in terms:
        if not term.negative or not term.applies:
            continue
        for item in term.items:
            if item in ("*", "gpu"):
                drop.update(range(len(devices)))
            elif item not in _NO_XPU_TYPES:
                drop.add(_number(item))
    out: list[XpuTarget] = []
    for n, device in enumerate(devices):
        if n in drop:
            continue
        if n in whole:
            out.append(device)
        for tile in sorted(sub.get(n, ())):
            out.append(XpuTarget(device.card, (tile,)))
    return out


def _device_tiles(device: XpuTarget, tiles: Sequence[int]) -> list[int]:
    if device.tiles is not None:
        return list(device.tiles)
    return list(range(max(1, tiles[device.card])))


def visible_targets(
    tiles: Sequence[int],
    env: Mapping[str, str],
    default_hierarchy: Hierarchy = Hierarchy.COMPOSITE,
) -> list[XpuTarget]:
    """Apply all three variables to the machine's cards.

    Args:
        tiles: Per physical card (in driver order), its number of tiles.
        env: The environment to read the three variables from.
        default_hierarchy: The driver's default model for these cards.

    Returns:
        The devices torch numbers ``0, 1, …``, in that order.

    Raises:
        ConfigurationError: For an unsupported or malformed value, naming the variable.
    """
    hierarchy = parse_hierarchy(env.get(ENV_FLAT_DEVICE_HIERARCHY), default_hierarchy)
    masked = parse_affinity_mask(env.get(ENV_AFFINITY_MASK), tiles, hierarchy)
    return apply_device_selector(env.get(ENV_DEVICE_SELECTOR), masked, tiles, hierarchy)


def affinity_mask_for(
    targets: Sequence[XpuTarget], tiles: Sequence[int], hierarchy: Hierarchy
) -> str:
    """Write the ``ZE_AFFINITY_MASK`` that shows exactly ``targets`` (with no device selector).

    The inverse of :func:`visible_targets` for one subset: ``X``/``X.Y`` entries under
    ``COMPOSITE``, flat device indices under ``FLAT`` and ``COMBINED``.
    """
    entries: list[str] = []
    for target in targets:
        chosen = range(tiles[target.card]) if target.tiles is None else target.tiles
        if hierarchy is Hierarchy.COMPOSITE:
            if target.tiles is None:
                entries.append(str(target.card))
            else:
                entries.extend(f"{target.card}.{t}" for t in chosen)
        else:
            first = sum(tiles[: target.card])
            entries.extend(str(first + t) for t in chosen)
    return ",".join(entries)
