"""What saturating a tap costs on CPU, kernel by kernel: LeNet5's forward and backward pass alone (float16,
batch 32, no optimizer, no data pipeline), its five layers tapped, alternating in one process:

    python benchmarks/saturation_kernels.py [rounds]

Variants: untapped; the taps alone (identity transforms); saturation in MindSpore ops (nan_to_num, and
the flag's isfinite/all), the path where lsexp's kernels cannot be built; lsexp's C++ kernels (aot
operators, lsexp/saturation/kernels.cc), with the backward's saturation and flag in one kernel; and the
same kernels with the backward's two apart. A measurement, not a mode.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

STEPS = 30


def _steps(kinds: dict):
    import mindspore as ms
    import numpy as np
    from mindspore import ParameterTuple, Tensor, nn, ops

    from lsexp.models.lenet5 import LeNet5
    from lsexp.taps.cells import install

    def build(transform, names):
        net = LeNet5(num_class=10).to_float(ms.float16)
        probes = []
        if transform is not None:
            taps = install(net, names, {n: getattr(net, n) for n in names}, lambda name: transform(),
                           observe=False)
            probes = taps.status_probes()
        loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        params = ParameterTuple(list(net.trainable_params()) + probes)
        grad = ops.GradOperation(get_by_list=True)

        class Step(nn.Cell):
            def __init__(self):
                super().__init__()
                self.loss = loss

            def construct(self, x, y):
                return self.loss(x, y), grad(self.loss, params)(x, y)

        return Step()

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((32, 1, 32, 32)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, 32).astype(np.int32))
    steps = {name: build(*kind) for name, kind in kinds.items()}
    for step in steps.values():
        step(x, y)
    return steps, (x, y)


def _variants():
    import mindspore as ms
    from mindspore import ops

    from lsexp.taps.saturating import SaturatingTransform

    class Identity(SaturatingTransform):
        def forward(self, y):
            return y

        def backward_status(self, y, dout, state):
            return dout, ops.zeros((), ms.float32)

    class Ops(SaturatingTransform):
        def __init__(self):
            super().__init__(native=False)

    class Apart(SaturatingTransform):  # the native kernels, the backward's saturation and its flag as two
        def backward_status(self, y, dout, state):
            return self.backward(dout, state), self.status(y, dout, state)

    every = ["conv1", "conv2", "fc1", "fc2", "fc3"]
    return {
        "untapped": (None, every),
        "the taps alone": (Identity, every),
        "MindSpore ops": (Ops, every),
        "lsexp's kernels": (SaturatingTransform, every),
        "lsexp's kernels, backward apart": (Apart, every),
    }


def main(rounds: int) -> None:
    import mindspore as ms

    from lsexp.device.onednn import ENV, auto_isa

    isa = auto_isa()
    if isa:  # the cap lsexp's runs use on this machine (its calibration)
        os.environ[ENV] = isa
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    steps, batch = _steps(_variants())
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(STEPS):
                step(*batch)[0].asnumpy()  # one sync a step, as the train loop's loss
            times[name].append(1000 * (time.perf_counter() - start) / STEPS)
    base = statistics.median(times["untapped"])
    print(f"onednn_max_cpu_isa={isa}, {rounds} rounds of {STEPS} steps; against untapped")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<32} median {median:6.2f} ms/step ({median / base:.3f}x)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
