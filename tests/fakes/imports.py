"""Forbid importing torch for one test, recording any attempt."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest


class TorchBlocker(importlib.abc.MetaPathFinder):
    """A meta-path finder that fails, and records, every attempt to import torch."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == "torch" or fullname.startswith("torch."):
            self.attempts.append(fullname)
            raise ImportError(f"test forbids importing {fullname}")
        return None


def forbid_torch(monkeypatch: pytest.MonkeyPatch) -> TorchBlocker:
    """Unload torch (or a fake of it) and block importing it until the test ends."""
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    blocker = TorchBlocker()
    monkeypatch.setattr(sys, "meta_path", [blocker, *sys.meta_path])
    return blocker
