"""What the training recipes cost per step, each pair in this one process, alternating, timed over
epochs 2 to 10 of the default run (summary.json's epoch_seconds; the first epoch's compilation counts
for neither):

    python benchmarks/recipes.py clip [pairs] [override ...]   optimizer.clip_grad_norm=1.0 against none
    python benchmarks/recipes.py accumulate [pairs]            one optimizer step over 4 micro-batches of 8
                                                               against four plain steps of batch 8

With everything off the step is the one benchmarks/handwritten_loop.py measures against a hand-written
loop.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report


def ms_per_step(tmp: Path, i: int, *overrides: str, per: int = 1) -> float:
    """Milliseconds per optimizer step of the default run with overrides, over epochs 2-10, through
    lsexp's own path in this process; per: the steps it stands for (4 plain steps for one of 4
    micro-batches)."""
    return lsexp_loop(tmp, i, *overrides) / per


def main(what: str, pairs: int, *common: str) -> None:
    variants = {
        "clip": {"clip_grad_norm=1.0": (["optimizer.clip_grad_norm=1.0"], 1), "no clipping": ([], 1)},
        "accumulate": {
            "4 micro-batches of 8, per 4": (["train.accumulate_steps=4", "dataset.batch_size=8"], 4),
            "batch 8": (["dataset.batch_size=8"], 1),
        },
    }[what]
    times = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for name, (overrides, per) in variants.items():
                times[name].append(ms_per_step(Path(tmp), i, *common, *overrides, per=per))
    a, b = variants
    report(times, f"{a} / {b}", f"{' '.join(common) or 'the default run'}, one process, alternating")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5, *sys.argv[3:])
