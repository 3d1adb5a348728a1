"""Graph-capture capability decided from installed versions, without importing torch.

Whether a platform *can* capture device graphs depends on the installed torch: CUDA and ROCm use
``torch.cuda.CUDAGraph`` (every torch from 1.10), XPU uses ``torch.xpu.XPUGraph`` (torch 2.11 and
later). ``importlib.metadata`` answers "which torch is installed" in well under a millisecond and
never imports the package, so capability can be known before — or without — torch being
imported.

Wheels from the PyTorch package index carry their build flavour in the local version label
(``2.11.0+cu130``, ``2.5.1+rocm6.2``, ``2.8.0+xpu``, ``2.4.0+cpu``). When the label names a
flavour other than the one a platform needs, graphs cannot work there; a version without a label
(a PyPI or source build) says nothing about its flavour and is taken as capable.

Capability is not the same as "enabled": an engine may still run eagerly (vLLM's
``enforce_eager``).
"""

from __future__ import annotations

import re

from accelplat import _boundary
from accelplat._types import GraphSupport

__all__ = [
    "BUILD_FLAVOURS",
    "build_flavour",
    "distribution_version",
    "graph_support",
    "parse_version",
]

BUILD_FLAVOURS: dict[str, str] = {
    "cu": "CUDA",
    "rocm": "ROCm",
    "xpu": "XPU",
    "cpu": "CPU-only",
}
"""Local-version-label prefixes of PyTorch wheels, and the build flavour each names."""

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)")


def distribution_version(name: str) -> str | None:
    """Return the installed version string of distribution ``name``, or ``None``.

    Args:
        name: A distribution name, e.g. ``"torch"``.

    Returns:
        The version as its metadata spells it (``"2.11.0+cu130"``), or ``None`` when the
        distribution is not installed or its metadata is unreadable.

    Side effects:
        Reads installed metadata only; imports nothing. Asked through the vendor boundary, so a
        capture records the answer and a replay gives the captured host's.
    """
    value = _boundary.call("dist", ("version", name), lambda: _installed_version(name))
    return value if isinstance(value, str) and value else None


def _installed_version(name: str) -> str | None:
    from importlib import metadata  # imported on use: it costs tens of milliseconds

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken distribution's metadata must not break a capability query
        return None


def parse_version(text: str) -> tuple[int, int] | None:
    """Return ``(major, minor)`` of a version string, or ``None`` when it has no such prefix.

    Args:
        text: A version such as ``"2.11.0+cu130"`` or ``"2.12.0.dev20260101"``.

    Returns:
        The first two numeric components.
    """
    match = _VERSION_RE.match(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def build_flavour(text: str) -> str | None:
    """Return the build-flavour prefix in a version's local label, if it names a known one.

    Args:
        text: A version string, e.g. ``"2.5.1+rocm6.2"``.

    Returns:
        One of the keys of :data:`BUILD_FLAVOURS` (``"rocm"`` here), or ``None`` for a version
        without a local label or with one that names no known flavour.
    """
    _, plus, label = text.partition("+")
    if not plus:
        return None
    label = label.strip().lower()
    # Longest prefix first, so that a future "cuda…" label would not read as "cu".
    for prefix in sorted(BUILD_FLAVOURS, key=len, reverse=True):
        if label.startswith(prefix):
            return prefix
    return None


def graph_support(
    api: str,
    min_version: tuple[int, int] = (0, 0),
    *,
    label: str,
    flavour: str | None = None,
) -> GraphSupport:
    """Decide graph capability from the installed torch, without importing it.

    Args:
        api: The torch API that captures graphs, e.g. ``"torch.xpu.XPUGraph"``.
        min_version: The first torch ``(major, minor)`` that has ``api``.
        label: What the graphs are called in messages, e.g. ``"HIP graphs"``.
        flavour: The build flavour the platform needs (a key of :data:`BUILD_FLAVOURS`), or
            ``None`` to accept any build.

    Returns:
        A :class:`~accelplat._types.GraphSupport`; ``api`` is set only when available. The
        reason names the installed version, or why capture is impossible: torch absent, an
        unreadable version, a version older than ``min_version``, or a build of another
        flavour.

    Side effects:
        Reads installed metadata; imports no framework and creates no device context.
    """
    text = distribution_version("torch")
    if text is None:
        return GraphSupport(False, None, f"{label} need torch ({api}); torch is not installed")
    version = parse_version(text)
    if version is None:
        return GraphSupport(
            False, None, f"{label}: cannot read the installed torch version {text!r}"
        )
    if version < min_version:
        need = f"{min_version[0]}.{min_version[1]}"
        return GraphSupport(
            False, None, f"{label} need torch >= {need} ({api}); torch {text} is installed"
        )
    built = build_flavour(text)
    if flavour is not None and built is not None and built != flavour:
        return GraphSupport(
            False,
            None,
            f"{label} need a {BUILD_FLAVOURS[flavour]} build of torch; torch {text} is a "
            f"{BUILD_FLAVOURS[built]} build",
        )
    return GraphSupport(True, api, f"{label} via {api} (torch {text})")
