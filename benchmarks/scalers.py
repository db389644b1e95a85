"""What the newer scalers cost per step against MindSpore's DynamicLossScaleManager (loss_scale=dynamic):
each run in this one process, the three alternating, timed over epochs 2 to 10 of the default run
(summary.json's epoch_seconds; the first epoch's compilation counts for none):

    python benchmarks/scalers.py [rounds] [override ...]

amax_history adds the amax of every gradient tensor after the reducer and the history's update to the
compiled step; adaptive_window a few more scalar ops than DynamicLossScaleUpdateCell.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report

VARIANTS = {
    "dynamic": ["loss_scale=dynamic"],
    "adaptive_window": ["loss_scale=adaptive_window"],
    "amax_history": ["loss_scale=amax_history"],
}


def main(rounds: int, *common: str) -> None:
    times = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for name, overrides in VARIANTS.items():
                times[name].append(lsexp_loop(Path(tmp), i, *common, *overrides))
    note = f"{' '.join(common) or 'the default run'}, one process, alternating"
    for name in ("adaptive_window", "amax_history"):
        report({name: times[name], "dynamic": times["dynamic"]}, f"{name} / dynamic", note)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, *sys.argv[2:])
