"""What gradient telemetry costs per step: the seed's default run at amp O2 with telemetry=grads
against telemetry=none, alternating in one process, timed per step over epochs 2 to 10.

    python benchmarks/telemetry_cost.py [pairs]     (10 by default)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report

COMMON = ("amp=O2", "loss_scale=dynamic")


def main(pairs: int) -> None:
    ms_per_step = {"none": [], "grads": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            ms_per_step["none"].append(lsexp_loop(Path(tmp), i, *COMMON, "telemetry=none"))
            ms_per_step["grads"].append(lsexp_loop(Path(tmp), i, *COMMON, "telemetry=grads",
                                                   "telemetry.histogram_steps=[]"))
    report({"telemetry=grads": ms_per_step["grads"], "telemetry=none": ms_per_step["none"]}, "grads / none",
           " ".join(COMMON))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
