"""Typing helpers of typing-extensions, from the standard library where it already has them.

``override`` marks a backend method that implements or replaces one of
:class:`~accelplat.platform.BasePlatform`: mypy (which reads ``typing_extensions.override``
here) then reports a method whose base was renamed or removed. On Python 3.12 and later it is
:func:`typing.override`. On 3.10 and 3.11 the run-time decorator does what
``typing_extensions.override`` does — set ``__override__ = True`` on the function — without
importing typing-extensions (a few milliseconds) while every backend module loads for detection.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["override"]

_F = TypeVar("_F", bound=Any)

if sys.version_info >= (3, 12):
    from typing import override
elif TYPE_CHECKING:
    from typing_extensions import override
else:

    def override(method: _F, /) -> _F:
        """Mark ``method`` as replacing a base-class method (sets ``__override__``)."""
        with contextlib.suppress(AttributeError, TypeError):  # some objects refuse attributes
            method.__override__ = True
        return method
