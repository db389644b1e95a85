"""What saturating a tap costs on CPU, kernel by kernel: LeNet5's forward and backward pass alone (float16,
batch 32, no optimizer, no data pipeline), its five layers tapped, alternating in one process:

    python benchmarks/saturation_kernels.py [rounds]

Variants: untapped; the taps alone (identity transforms); saturation in MindSpore ops for every tensor
(nan_to_num, and the flag's isfinite/all); in host kernels for every tensor (a pyfunc on the bits);
and lsexp's choice, host kernels for a tensor of HOST_FROM values or more and ops below. Then one kind
of kernel at a time, forward saturation only, against the same taps alone: on conv1's output
(32x6x28x28), and on the three Dense layers' (32x120 and smaller). A measurement, not a mode.
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

    from lsexp.formats.saturation import saturate
    from lsexp.taps.saturation import Saturation

    class Identity(Saturation):
        def forward(self, y):
            return y

        def backward(self, dout, state):
            return dout

        def status(self, y, dout, state):
            return ops.zeros((), ms.float32)

    class AllOps(Saturation):
        def __init__(self):
            super().__init__(host=False)

    class AllHost(Saturation):
        def _on_host(self, x):
            return True

    class ForwardOps(Identity):  # forward saturation only, in ops
        def forward(self, y):
            return saturate(y)

    class ForwardHost(Identity):  # forward saturation only, in a host kernel
        def forward(self, y):
            return self.rule(y)

    every = ["conv1", "conv2", "fc1", "fc2", "fc3"]
    dense = ["fc1", "fc2", "fc3"]
    return {
        "untapped": (None, every),
        "the taps alone": (Identity, every),
        "ops for every tensor": (AllOps, every),
        "host for every tensor": (AllHost, every),
        "lsexp (host from 2^14 values)": (Saturation, every),
        "conv1 taps alone": (Identity, ["conv1"]),
        "conv1, forward in ops": (ForwardOps, ["conv1"]),
        "conv1, forward on the host": (ForwardHost, ["conv1"]),
        "dense taps alone": (Identity, dense),
        "dense, forward in ops": (ForwardOps, dense),
        "dense, forward on the host": (ForwardHost, dense),
    }


def main(rounds: int) -> None:
    import mindspore as ms

    from lsexp.runtime.onednn import ENV, auto_isa

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
    base = {}
    for name in steps:  # each against the first of its group: every layer, conv1, the Dense layers
        group = next((g for g in ("conv1", "dense") if name.startswith(g)), "every")
        base.setdefault(group, statistics.median(times[name]))
        base[name] = base[group]
    print(f"onednn_max_cpu_isa={isa}, {rounds} rounds of {STEPS} steps; each against the first of its group")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<32} median {median:6.2f} ms/step ({median / base[name]:.3f}x)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
