"""Per quantised tensor and step: the scale the recipe used, the fraction of its elements saturated (beyond
the format's largest value at that scale, clipped) and the fraction flushed to zero (non-zero, cast to 0).

On CPU the casts are numpy kernels (lsexp.formats.host) that run on the host inside the step; each counts
its tensor as it casts it and leaves the counts here, which the loop reads after the step's one host sync
(the loss). A tensor cast twice in one step (a forward pass the step runs for its loss and again for its
gradient) leaves the same counts twice. GPU and Ascend, whose casts are MindSpore ops, record nothing.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Dict, List

import numpy as np

COLUMNS = ("scale", "saturated_fraction", "flushed_fraction")
WORST = ("fp8_saturated_fraction_max", "fp8_flushed_fraction_max")
_latest: Dict[str, tuple] = {}


def record(name: str, x: np.ndarray, y: np.ndarray, scaled: np.ndarray, limit: float, scale: float) -> None:
    """What one cast did to tensor `name`: x as it came, y as cast, scaled as it met the format."""
    n = max(x.size, 1)
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(scaled)
        saturated = np.count_nonzero((magnitude > limit) & np.isfinite(magnitude)) / n  # inf stays inf
        flushed = np.count_nonzero((x != 0) & (y == 0)) / n
    _latest[name] = (float(scale), saturated, flushed)


def take() -> Dict[str, tuple]:
    """The counts left since the last take, by tensor name."""
    out = dict(_latest)
    _latest.clear()
    return out


class PrecisionTable:
    """Every step's counts, written as precision.csv (telemetry/precision.csv in MLflow), with the worst
    tensor per step as history columns and metrics, and per-tensor means in summary.json."""

    def __init__(self):
        self.rows: List[tuple] = []  # (step, overflow, tensor, scale, saturated, flushed)
        take()  # a build's probe or an earlier run in this process may have left counts

    def add(self, step: int, overflow: bool) -> dict:
        counts = take()
        for name in sorted(counts):
            self.rows.append((step, int(overflow), name) + counts[name])
        if not counts:
            return dict.fromkeys(WORST, math.nan)
        return {WORST[0]: max(c[1] for c in counts.values()), WORST[1]: max(c[2] for c in counts.values())}

    def means(self) -> dict:
        """Per tensor, over the steps that did not overflow (an inf in a gradient is not the format's
        doing): the mean saturated and flushed fractions, and the mean log2 of its scale."""
        by: Dict[str, list] = {}
        for _, overflow, name, scale, saturated, flushed in self.rows:
            if not overflow:
                by.setdefault(name, []).append((scale, saturated, flushed))
        return {name: {"scale_log2": float(np.mean([math.log2(s) for s, _, _ in v if s > 0] or [math.nan])),
                       "saturated_fraction": float(np.mean([x for _, x, _ in v])),
                       "flushed_fraction": float(np.mean([x for _, _, x in v]))} for name, v in by.items()}

    def write(self, out_dir: Path) -> None:
        with open(out_dir / "precision.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(("step", "overflow", "tensor") + COLUMNS)
            writer.writerows(self.rows)
