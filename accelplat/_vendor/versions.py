"""Installed distribution versions, read without importing the package, compared by PEP 440.

Graph-capture capability (of the CUDA, ROCm and XPU backends) is known before torch is imported;
``packaging`` is imported on first use (detection does not need it).
"""

from __future__ import annotations

from accelplat import _boundary
from accelplat._types import GraphSupport

# Local-version-label prefixes of PyTorch wheels (2.5.1+rocm6.2), and the build each names.
BUILD_FLAVOURS: dict[str, str] = {"cu": "CUDA", "rocm": "ROCm", "xpu": "XPU", "cpu": "CPU-only"}


def distribution_version(name: str) -> str | None:
    """Return ``name``'s installed version (``"2.11.0+cu130"``) or ``None``, importing nothing."""
    value = _boundary.call("dist", ("version", name), lambda: _installed_version(name))
    return value if isinstance(value, str) and value else None


def _installed_version(name: str) -> str | None:
    from importlib import metadata  # imported on use: it costs tens of milliseconds

    try:
        return metadata.version(name)
    except Exception:  # not installed, or broken metadata: neither may break a query
        return None


def satisfies(version: str, specifier: str) -> bool | None:
    """Return whether ``version`` meets ``specifier`` (pre-releases too); ``None``: not PEP 440."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)  # 2.6.0a0 is before 2.6
    except InvalidVersion:
        return None
    return SpecifierSet(specifier).contains(parsed, prereleases=True)


def graph_support(
    api: str, min_version: tuple[int, int], *, label: str, flavour: str
) -> GraphSupport:
    """Decide whether the installed torch's ``api`` (from ``min_version``) can capture graphs."""
    # A build labelled with another flavour (+cpu for CUDA) cannot; one without a label (PyPI,
    # source builds) can. Capable is not enabled: vLLM's enforce_eager runs eagerly.
    text = distribution_version("torch")
    need = f"{min_version[0]}.{min_version[1]}"
    meets = None if text is None else satisfies(text, f">={need}")
    local = (text or "").partition("+")[2].lower()  # the local version label
    # Longest prefix first, so that a future "cuda…" label would not read as "cu".
    built = max((f for f in BUILD_FLAVOURS if local.startswith(f)), key=len, default=None)
    if text is None:
        why = f"{label} need torch ({api}); torch is not installed"
    elif meets is None:
        why = f"{label}: cannot read the installed torch version {text!r}"
    elif not meets:
        why = f"{label} need torch >= {need} ({api}); torch {text} is installed"
    elif built is not None and built != flavour:
        why = (
            f"{label} need a {BUILD_FLAVOURS[flavour]} build of torch; torch {text} is a "
            f"{BUILD_FLAVOURS[built]} build"
        )
    else:
        return GraphSupport(True, api, f"{label} via {api} (torch {text})")
    return GraphSupport(False, None, why)
