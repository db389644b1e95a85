"""What a number in the config must be, as every group's checks test it."""

from __future__ import annotations

import math


def finite_positive(value) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
