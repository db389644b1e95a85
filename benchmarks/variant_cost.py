"""What one variant's step costs against another's, alternating in one process, timed over epochs 2 to
the last:

    python benchmarks/variant_cost.py PAIRS "A's overrides" "B's overrides" [common overrides ...]

for example, unit scaling's step against the standard MLP's (docs/unit_scaling.md):

    python benchmarks/variant_cost.py 3 "model.scaling=unit" "model.scaling=standard" model=mlp dataset=digits
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report


def main(pairs: int, a: str, b: str, common: list) -> None:
    variants = {a: a.split(), b: b.split()}
    ms_per_step = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for name, overrides in variants.items():
                ms_per_step[name].append(lsexp_loop(Path(tmp), i, *common, *overrides))
    report(ms_per_step, f"{a} / {b}", " ".join(common))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:])
