"""What the per-layer taps cost per step, alternating in one process, timed over epochs 2 to the last:

    python benchmarks/taps_cost.py layers [pairs] [overrides ...]   telemetry=layers / telemetry=none
    python benchmarks/taps_cost.py locate [pairs] [overrides ...]   the locator on (the default) / off
    python benchmarks/taps_cost.py saturation [pairs] [overrides ...]   overflow_mode saturation / infnan

Both variants of a pair run the default experiment at amp O2 with loss_scale=dynamic from 2^10 (so that
no step overflows and each measures clean steps), plus the overrides (workload=resnet8_digits for
ResNet-8). `layers` compares two runs with the locator's taps installed, one of which also returns their
statistics; `locate` compares the default with telemetry.locate=false, where nothing is tapped;
`saturation` compares device.overflow_mode=saturation (every layer tapped and saturating, the flag read)
with infnan, the default.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report

COMMON = ("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024")
VARIANTS = {
    "layers": (("telemetry=layers",), ("telemetry=none",), "layers / none"),
    "locate": (("telemetry.locate=true",), ("telemetry.locate=false",), "locator on / off"),
    "saturation": (("device.overflow_mode=saturation",), ("device.overflow_mode=infnan",),
                   "saturation / infnan"),
}


def main(which: str, pairs: int, overrides: list) -> None:
    a, b, what = VARIANTS[which]
    ms_per_step = {" ".join(a): [], " ".join(b): []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for variant in (a, b):
                ms_per_step[" ".join(variant)].append(lsexp_loop(Path(tmp), i, *COMMON, *overrides, *variant))
    report(ms_per_step, what, " ".join(COMMON + tuple(overrides)))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]) if len(args) > 1 else 10, args[2:])
