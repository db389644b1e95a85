"""What each eight-bit recipe costs per step against the same run's float16 step, alternating in one
process, timed over epochs 2 to the last:

    python benchmarks/precision_cost.py [pairs] [overrides ...]

Each pair runs precision=none, then each recipe, on the default experiment at amp O2 with
loss_scale=dynamic from 2^10 (no step overflows), plus the overrides (model=mlp dataset=digits for the
MLP). Emulation is elementwise work around each matrix product: the budget is 2.5x.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report

COMMON = ("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024")
RECIPES = ("fp8_delayed", "fp8_current", "mxfp8", "hif8_current")


def main(pairs: int, overrides: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in RECIPES:
            ms_per_step = {f"precision={recipe}": [], "precision=none": []}
            for i in range(pairs):
                for variant in ms_per_step:
                    folder = Path(tmp) / recipe
                    folder.mkdir(exist_ok=True)
                    ms_per_step[variant].append(lsexp_loop(folder, i, *COMMON, *overrides, variant))
            report(ms_per_step, f"{recipe} / none", " ".join(COMMON + tuple(overrides)))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 5, args[1:])
