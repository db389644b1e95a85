"""How every benchmark here reports: per-run times of two variants measured alternately, their
medians, and the ratio of the medians with the mean of the per-pair ratios beside it."""

from __future__ import annotations

import statistics
from typing import Dict, List


def report(ms_per_step: Dict[str, List[float]], what: str, note: str) -> None:
    (a, times_a), (b, times_b) = ms_per_step.items()
    width = max(len(a), len(b))
    for name, times in ms_per_step.items():
        print(f"{name:<{width}}  median {statistics.median(times):.2f} ms/step  "
              f"{[round(t, 2) for t in times]}")
    ratios = [x / y for x, y in zip(times_a, times_b)]
    print(f"time per step, {what}: {statistics.median(times_a) / statistics.median(times_b):.3f}x "
          f"(per-pair mean {statistics.mean(ratios):.3f}x, {len(ratios)} pairs; {note})")
