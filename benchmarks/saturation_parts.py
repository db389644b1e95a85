"""Where device.overflow_mode=saturation's cost goes, one piece removed at a time, alternating in one
process, timed over epochs 2 to the last:

    python benchmarks/saturation_parts.py [rounds] [overrides ...]

Each round runs the default experiment at amp O2 with loss_scale=dynamic from 2^10 (no step overflows):
infnan; saturation; saturation whose taps report no status (the flag from the parameter gradients only);
and saturation whose taps neither saturate nor report (the taps alone). A measurement, not a mode: the
variants replace lsexp.taps.saturation.Saturation for the run.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop

COMMON = ("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024")


def main(rounds: int, overrides: list) -> None:
    import mindspore as ms
    from mindspore import ops

    import lsexp.taps.saturation as module

    full = module.Saturation

    class NoStatus(full):
        def status(self, y, dout, state):
            return ops.zeros((), ms.float32)

    class TapsOnly(NoStatus):
        def forward(self, y):
            return y

        def backward(self, dout, state):
            return dout

    saturating = ("device.overflow_mode=saturation",)
    variants = {"infnan": (full, ()), "saturation": (full, saturating),
                "saturation, no tap status": (NoStatus, saturating),
                "the taps alone": (TapsOnly, saturating)}
    times = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for j, (name, (cls, extra)) in enumerate(variants.items()):
                module.Saturation = cls
                times[name].append(lsexp_loop(Path(tmp), 10 * i + j, *COMMON, *overrides, *extra))
    module.Saturation = full
    base = statistics.median(times["infnan"])
    for name, values in times.items():
        median = statistics.median(values)
        each = [round(v, 2) for v in values]
        print(f"{name:<26} median {median:.2f} ms/step ({median / base:.3f}x)  {each}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 3, args[1:])
