"""Quick answers to "is this accelerator certainly absent here?", asked before a backend loads.

Detection probes the built-in backends in order (CUDA, ROCm, XPU, then CPU). On a host without
any accelerator driver, importing each GPU backend with its visible-device parser and its
vendor binding only to hear "absent" cost more than the rest of detection together. Each
function here answers from the few facts that decide absence, importing no backend module:

* :func:`cuda`: NVML's library cannot be loaded (asked of the dynamic loader, as before
  ``pynvml`` is imported);
* :func:`rocm`: no AMD card under ``<sysfs>/class/drm``, amdsmi not installed, torch not
  imported;
* :func:`xpu`: no Intel card under ``<sysfs>/class/drm`` and no Level Zero loader.

Each returns the reason the backend's own ``probe()`` gives in that case, word for word (the
sentences are defined here and used by the backends), or ``None`` whenever anything could make
the backend available — then the registry loads the backend and runs its full probe. While a
capture records or a replay answers (:mod:`accelplat._boundary`) every function returns
``None``: the captured host decides, through the backends.

Nothing here imports a vendor library or creates a device context; :func:`cuda` and
:func:`xpu` ask the dynamic loader for a library (``ctypes.CDLL``), as the backends would next.
"""

from __future__ import annotations

import os
import re
import sys

from accelplat import _boundary, _files

__all__ = [
    "AMDSMI_NOT_INSTALLED",
    "AMD_VENDOR_ID",
    "ENV_LEVEL_ZERO_LIB",
    "ENV_SYSFS_ROOT",
    "INTEL_VENDOR_ID",
    "LEVEL_ZERO_LOADER",
    "ROCM_TORCH_NOT_IMPORTED",
    "cuda",
    "drm_cards",
    "level_zero_loader_name",
    "level_zero_not_found",
    "no_amd_gpu",
    "no_intel_gpu",
    "rocm",
    "xpu",
]

ENV_SYSFS_ROOT = "ACCELPLAT_SYSFS_ROOT"
"""Variable that moves ``/sys`` (tests, chroots) for the CPU, ROCm and XPU backends."""

ENV_LEVEL_ZERO_LIB = "ACCELPLAT_LEVEL_ZERO_LIB"
"""Variable naming the Level Zero loader library to load instead of :data:`LEVEL_ZERO_LOADER`."""

LEVEL_ZERO_LOADER = "libze_loader.so.1"
"""The Level Zero loader's library name (``accelplat._vendor.levelzero.LOADER_NAME``)."""

AMDSMI_NOT_INSTALLED = "amdsmi is not installed"
ROCM_TORCH_NOT_IMPORTED = "torch is not imported by the caller (accelplat never imports it on ROCm)"

AMD_VENDOR_ID = 0x1002
"""PCI vendor id of AMD."""

INTEL_VENDOR_ID = 0x8086
"""PCI vendor id of Intel (``accelplat._vendor.levelzero.INTEL_VENDOR_ID``)."""

_CARD_RE = re.compile(r"^card(\d+)$")


DrmPath = str | os.PathLike[str]
"""``<sysfs>/class/drm``: a ``Path`` in the backends, text here (no pathlib on a bare host)."""


def no_amd_gpu(drm: DrmPath) -> str:
    """The ROCm probe's first reason when ``drm`` holds no usable AMD card."""
    return f"no AMD GPU with VRAM files under {drm}"


def no_intel_gpu(drm: DrmPath) -> str:
    """The XPU probe's reason when ``drm`` holds no Intel card bound to xe or i915."""
    return f"no Intel GPU bound to xe or i915 under {drm}"


def level_zero_loader_name() -> str:
    """The Level Zero loader to load: ``ACCELPLAT_LEVEL_ZERO_LIB``, else the standard one."""
    return os.environ.get(ENV_LEVEL_ZERO_LIB) or LEVEL_ZERO_LOADER


def level_zero_not_found(name: str, exc: BaseException) -> str:
    """The XPU probe's reason when the Level Zero loader ``name`` cannot be loaded."""
    return f"Level Zero loader {name} not found ({exc})"


def drm_cards(drm: DrmPath) -> tuple[list[str], str]:
    """List the ``cardN`` entries of a DRM class directory, sorted.

    Args:
        drm: ``<sysfs>/class/drm``.

    Returns:
        The entries (connectors such as ``card0-DP-1`` and render nodes left out) and ``""``;
        or no entries and a note saying why none could be listed (missing, unreadable).

    Side effects:
        Lists one directory through :mod:`accelplat._files`.
    """
    try:
        entries = sorted(_files.listdir(drm))
    except FileNotFoundError:
        return [], f"{drm} does not exist"
    except OSError as exc:
        return [], f"{drm} is not readable ({exc.strerror or exc})"
    return [e for e in entries if _CARD_RE.match(e)], ""


def _sysfs_drm() -> DrmPath:
    root = os.environ.get(ENV_SYSFS_ROOT)
    if not root:
        return "/sys/class/drm"
    from pathlib import Path  # a moved root is spelled as the backends spell it

    return Path(root) / "class" / "drm"


def _may_hold_vendor(drm: DrmPath, cards: list[str], vendor: int) -> bool:
    """Whether any card may be of ``vendor``; an unreadable vendor file counts as maybe."""
    for card in cards:
        try:
            found = int(_files.read_text(os.path.join(drm, card, "device", "vendor")).strip(), 16)
        except (OSError, ValueError):
            return True
        if found == vendor:
            return True
    return False


def _loader_failure(name: str) -> str | None:
    import ctypes

    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return level_zero_not_found(name, exc)
    return None


def cuda() -> str | None:
    """Return why CUDA is certainly unavailable here, or ``None`` when only its probe can tell.

    Side effects:
        May load ``libnvidia-ml.so.1`` (see
        :func:`accelplat._vendor.nvml.unavailable_before_import`).
    """
    from accelplat._vendor import nvml as _nvml

    return _nvml.unavailable_before_import()


def rocm() -> str | None:
    """Return why ROCm is certainly unavailable here, or ``None`` when only its probe can tell.

    Side effects:
        Lists ``<sysfs>/class/drm``, reads its cards' ``vendor`` files and asks the import system
        whether ``amdsmi`` is installed (without importing it).
    """
    if _boundary.active() is not None or "amdsmi" in sys.modules or "torch" in sys.modules:
        return None
    drm = _sysfs_drm()
    cards, note = drm_cards(drm)
    if _may_hold_vendor(drm, cards, AMD_VENDOR_ID):
        return None
    import importlib.util

    try:
        if importlib.util.find_spec("amdsmi") is not None:
            return None
    except (ImportError, ValueError):
        return None
    reasons = (no_amd_gpu(drm), note, AMDSMI_NOT_INSTALLED, ROCM_TORCH_NOT_IMPORTED)
    return "; ".join(r for r in reasons if r)


def xpu() -> str | None:
    """Return why XPU is certainly unavailable here, or ``None`` when only its probe can tell.

    Side effects:
        Lists ``<sysfs>/class/drm``, reads its cards' ``vendor`` files and asks the dynamic
        loader for the Level Zero loader (which stays loaded when present, as the backend
        would load it next).
    """
    if _boundary.active() is not None:
        return None
    drm = _sysfs_drm()
    cards, note = drm_cards(drm)
    if _may_hold_vendor(drm, cards, INTEL_VENDOR_ID):
        return None
    failure = _loader_failure(level_zero_loader_name())
    if failure is None:
        return None
    return f"{note or no_intel_gpu(drm)}; {failure}"
