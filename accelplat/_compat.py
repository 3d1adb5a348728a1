"""Typing helpers of typing-extensions, from the standard library where it already has them.

``override`` marks a backend method that implements or replaces one of
:class:`~accelplat.platform.BasePlatform`: mypy then reports a method whose base was renamed or
removed. On Python 3.12 and later it is :func:`typing.override` (nothing more to import, which
keeps detection fast); before that it comes from typing-extensions. At run time it only sets
``__override__ = True`` on the function.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 12):
    from typing import override
else:
    from typing_extensions import override

__all__ = ["override"]
