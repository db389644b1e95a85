"""What amp.level=auto's step costs against O1's and O2's, alternating in one process, timed over epochs 2
to the last:

    python benchmarks/amp_cost.py [pairs] [overrides ...]

Each round runs amp=auto, amp=O1 and amp=O2 on the default experiment with loss_scale=dynamic from 2^10
(no step overflows), plus the overrides (model=mlp dataset=digits for the MLP, workload=gpt_python ... for
the GPT). auto casts operator by operator (MindSpore's auto white and black lists), O1 casts its white-listed
cells' inputs, O2 every cell but its black list's.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report

COMMON = ("loss_scale=dynamic", "loss_scale.init_loss_scale=1024")
LEVELS = ("amp=auto", "amp=O1", "amp=O2")


def main(pairs: int, overrides: list) -> None:
    ms_per_step = {level: [] for level in LEVELS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for level in LEVELS:
                ms_per_step[level].append(lsexp_loop(Path(tmp), i, *COMMON, *overrides, level))
    note = " ".join(COMMON + tuple(overrides))
    for other in LEVELS[1:]:
        report({LEVELS[0]: ms_per_step[LEVELS[0]], other: ms_per_step[other]}, f"auto / {other[4:]}", note)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 5, args[1:])
