"""The seed's default run through lsexp against a hand-written MindSpore loop doing the same work.

    python benchmarks/handwritten_loop.py [pairs]

The hand-written loop is what a user would type from MindSpore's docs: the seed's LeNet5, N(0,1)
images with random one-hot labels, SoftmaxCrossEntropyWithLogits, Momentum, a fixed loss scale of
128 with dropped overflow updates (TrainOneStepWithLossScaleCell, whose NPU overflow check is swapped
for amp.all_finite, as it must be on CPU), 10 epochs of 32 batches, reading the loss every step.
Both time their loop the same way, from before the first step (which compiles) to after the last;
runs alternate, so machine noise hits both alike. Prints the medians and the per-pair ratios.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def handwritten() -> float:
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.amp import all_finite
    from mindspore.common.initializer import Normal

    class LeNet5(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, pad_mode="valid")
            self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
            self.fc1 = nn.Dense(400, 120, weight_init=Normal(0.02))
            self.fc2 = nn.Dense(120, 84, weight_init=Normal(0.02))
            self.fc3 = nn.Dense(84, 10, weight_init=Normal(0.02))
            self.relu, self.pool, self.flatten = nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten()

        def construct(self, x):
            x = self.pool(self.relu(self.conv1(x)))
            x = self.flatten(self.pool(self.relu(self.conv2(x))))
            return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))

    class Step(nn.TrainOneStepWithLossScaleCell):
        def get_overflow_status(self, status, compute_output):
            return ops.logical_not(all_finite(compute_output))

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1024, 1, 32, 32), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size=1024)]
    net = LeNet5()
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(reduction="mean"))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    step = Step(loss_net, opt, ms.amp.FixedLossScaleManager(128.0).get_update_cell())
    step.set_train()
    started = time.perf_counter()
    steps = 0
    for epoch in range(10):
        order = np.random.default_rng([1, epoch]).permutation(1024)
        for lo in range(0, 1024, 32):
            idx = order[lo:lo + 32]
            loss, _, _ = step(Tensor(x[idx]), Tensor(y[idx]))
            loss.asnumpy()
            steps += 1
    return steps / (time.perf_counter() - started)


def timed_lsexp(cwd: str, name: str) -> float:
    subprocess.run([sys.executable, "-m", "lsexp", "tracking=none", "train.progress=false", f"hydra.run.dir={name}"],
                   cwd=cwd, check=True, capture_output=True)
    return json.loads((Path(cwd) / name / "summary.json").read_text())["steps_per_second"]


def timed_handwritten() -> float:
    out = subprocess.run([sys.executable, __file__, "--handwritten"], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(pairs: int) -> None:
    speeds = {"lsexp": [], "handwritten": []}
    with tempfile.TemporaryDirectory() as cwd:
        for i in range(pairs):
            speeds["lsexp"].append(timed_lsexp(cwd, f"run{i}"))
            speeds["handwritten"].append(timed_handwritten())
    for k, v in speeds.items():
        print(f"{k:<12} median {statistics.median(v):.2f} steps/s  {[round(s, 1) for s in v]}")
    ratios = [h / s for s, h in zip(speeds["lsexp"], speeds["handwritten"])]
    print(f"time per step, lsexp / hand-written: {statistics.median(speeds['handwritten']) / statistics.median(speeds['lsexp']):.3f}x "
          f"(per-pair mean {statistics.mean(ratios):.3f}x, {pairs} pairs)")


if __name__ == "__main__":
    if "--handwritten" in sys.argv:
        print(handwritten())
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
