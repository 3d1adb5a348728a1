"""The one size formatter for people (``_util.format_bytes``)."""

from __future__ import annotations

import math

import pytest

from accelplat._types import GIB, MIB
from accelplat._util import format_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536 * MIB, "1.50 GiB"),
        (1024 * MIB, "1.00 GiB"),  # not "1024 MiB"
        (GIB - 1000, "1.00 GiB"),  # 1023.999 MiB rounds to 1024: the next unit, not "1024.00 MiB"
        (GIB - 6 * MIB, "1018.00 MiB"),
        (-4 * GIB, "-4.00 GiB"),
        (1024**6 * 3, "3072.00 PiB"),  # beyond the last unit: more of it
        (None, "?"),
        (math.nan, "?"),
        (math.inf, "?"),
    ],
)
def test_format_bytes_picks_the_unit_the_rounded_figure_fits(n: float | None, text: str) -> None:
    assert format_bytes(n) == text
