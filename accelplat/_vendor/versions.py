"""Installed distribution versions, read without importing the package, compared by PEP 440.

``importlib.metadata`` says which torch is installed without importing it, so graph-capture
capability (shared by the CUDA, ROCm and XPU backends) is known before torch is imported.
Parsing and comparison are ``packaging``'s (imported on first use: detection does not need it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat import _boundary
from accelplat._types import GraphSupport

if TYPE_CHECKING:
    from packaging.version import Version

BUILD_FLAVOURS: dict[str, str] = {"cu": "CUDA", "rocm": "ROCm", "xpu": "XPU", "cpu": "CPU-only"}
"""Local-version-label prefixes of PyTorch wheels (``2.5.1+rocm6.2``), and the build each names."""


def distribution_version(name: str) -> str | None:
    """Return distribution ``name``'s version as its metadata spells it (``"2.11.0+cu130"``).

    Returns:
        The version, or ``None`` when not installed or its metadata is unreadable.

    Side effects:
        Reads installed metadata, importing nothing; asked through the vendor boundary (a replay
        gives the captured host's answer).
    """
    value = _boundary.call("dist", ("version", name), lambda: _installed_version(name))
    return value if isinstance(value, str) and value else None


def _installed_version(name: str) -> str | None:
    from importlib import metadata  # imported on use: it costs tens of milliseconds

    try:
        return metadata.version(name)
    except Exception:  # not installed, or broken metadata: neither may break a query
        return None


def parse_version(text: str) -> Version | None:
    """Return ``text`` as a PEP 440 version (``2.6.0a0`` is before ``2.6``), or ``None``."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def satisfies(version: str, specifier: str) -> bool | None:
    """Return whether ``version`` meets ``specifier`` (``">=2.6,<3"``), pre-releases included.

    Args:
        version: An installed version, e.g. ``"2.6.0a0+git1234"``.
        specifier: A PEP 440 specifier set.

    Returns:
        The verdict, or ``None`` when ``version`` is not a PEP 440 version.

    Raises:
        ValueError: When ``specifier`` is not a PEP 440 specifier set
            (``packaging.specifiers.InvalidSpecifier``).
    """
    from packaging.specifiers import SpecifierSet

    parsed = parse_version(version)
    if parsed is None:
        return None
    return SpecifierSet(specifier).contains(parsed, prereleases=True)


def graph_support(
    api: str, min_version: tuple[int, int] = (0, 0), *, label: str, flavour: str | None = None
) -> GraphSupport:
    """Decide graph capability from the installed torch, without importing it.

    A build whose local label names another flavour (``+cpu`` for CUDA) cannot capture; one
    without a label (PyPI, source builds) counts as capable. Capable is not enabled: an engine
    may still run eagerly (vLLM's ``enforce_eager``).

    Args:
        api: The torch API that captures graphs, e.g. ``"torch.xpu.XPUGraph"``.
        min_version: The first torch ``(major, minor)`` with ``api`` (its pre-releases are before).
        label: What the graphs are called in messages, e.g. ``"HIP graphs"``.
        flavour: The build flavour needed (a key of :data:`BUILD_FLAVOURS`); ``None``: any.

    Returns:
        The verdict; its reason names the installed version or why capture is impossible.
    """
    text = distribution_version("torch")
    if text is None:
        return GraphSupport(False, None, f"{label} need torch ({api}); torch is not installed")
    version = parse_version(text)
    if version is None:
        return GraphSupport(
            False, None, f"{label}: cannot read the installed torch version {text!r}"
        )
    need = f"{min_version[0]}.{min_version[1]}"
    if not satisfies(text, f">={need}"):
        return GraphSupport(
            False, None, f"{label} need torch >= {need} ({api}); torch {text} is installed"
        )
    local = version.local or ""
    # Longest prefix first, so that a future "cuda…" label would not read as "cu".
    built = max((f for f in BUILD_FLAVOURS if local.startswith(f)), key=len, default=None)
    if flavour is not None and built is not None and built != flavour:
        return GraphSupport(
            False,
            None,
            f"{label} need a {BUILD_FLAVOURS[flavour]} build of torch; torch {text} is a "
            f"{BUILD_FLAVOURS[built]} build",
        )
    return GraphSupport(True, api, f"{label} via {api} (torch {text})")
