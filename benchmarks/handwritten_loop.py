"""The seed's default run through lsexp against a hand-written MindSpore loop doing the same work.

    python benchmarks/handwritten_loop.py [pairs] [overrides]    (10 by default)
    python benchmarks/handwritten_loop.py --processes [pairs]

The hand-written loop is what a user would type from MindSpore's docs: the seed's LeNet5, N(0,1)
images with random one-hot labels, SoftmaxCrossEntropyWithLogits, Momentum, a fixed loss scale of
128 with dropped overflow updates (TrainOneStepWithLossScaleCell, whose NPU overflow check is swapped
for amp.all_finite, as it must be on CPU), 10 epochs of 32 batches, reading the loss every step.
Both run in this one process, alternating, so machine noise hits both alike, and both are timed
per step over epochs 2 to 10 (lsexp's summary.json epoch_seconds), so the first step's compilation
counts for neither. Prints the medians and the per-pair ratios.

In one process both run with the same oneDNN cap (the one lsexp's default sets first, which oneDNN
keeps for the process): the ratio is lsexp's own overhead. With --processes each run is its own
process, alternating, and the hand-written loop runs as a user types it, with no ONEDNN_MAX_CPU_ISA
set: the ratio is what a user gains or loses by running lsexp instead.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ratios import report


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
    ms.set_seed(1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1024, 1, 32, 32), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size=1024)]
    net = LeNet5()
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(reduction="mean"))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    step = Step(loss_net, opt, ms.amp.FixedLossScaleManager(128.0).get_update_cell())
    step.set_train()
    seconds = []
    for epoch in range(10):
        started = time.perf_counter()
        order = np.random.default_rng([1, epoch]).permutation(1024)
        for lo in range(0, 1024, 32):
            idx = order[lo:lo + 32]
            loss, _, _ = step(Tensor(x[idx]), Tensor(y[idx]))
            loss.asnumpy()
        seconds.append(time.perf_counter() - started)
    return 1000 * sum(seconds[1:]) / (9 * 32)


def lsexp_loop(tmp: Path, i: int, *overrides: str) -> float:
    """The default run (with overrides), through lsexp's own path (compose -> validate -> train) in
    this process; milliseconds per step over epochs 2 to 10 (the epochs' steps are equal)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lsexp.app import train_here
    from lsexp.config import paths
    from lsexp.config.registry import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(paths.conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["tracking=none", "train.progress=false", *overrides])
    out = tmp / f"run{i}-{'-'.join(overrides) or 'default'}"
    out.mkdir()
    summary = train_here(cfg, out)
    epochs = len(summary["epoch_seconds"])
    return 1000 * sum(summary["epoch_seconds"][1:]) / (summary["steps"] * (epochs - 1) / epochs)


def one_process(variant: str) -> float:
    """One run of the variant in a fresh process; milliseconds per step."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    out = subprocess.run([sys.executable, __file__, "--one", variant], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).parent)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"]


def main(pairs: int, overrides=()) -> None:
    ms_per_step = {"lsexp": [], "handwritten": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):  # one process, alternating: both meet the same machine state
            ms_per_step["lsexp"].append(lsexp_loop(Path(tmp), i, *overrides))
            ms_per_step["handwritten"].append(handwritten())
    report(ms_per_step, "lsexp / hand-written", " ".join(overrides) or "the default run")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--one"]:
        import json

        with tempfile.TemporaryDirectory() as tmp:
            ms = lsexp_loop(Path(tmp), 0) if args[1] == "lsexp" else handwritten()
        print(json.dumps({"ms_per_step": ms}))
    elif args[:1] == ["--processes"]:
        n = int(args[1]) if len(args) > 1 else 10
        ms_per_step = {"lsexp": [], "handwritten": []}
        for _ in range(n):
            for variant in ms_per_step:
                ms_per_step[variant].append(one_process(variant))
        report(ms_per_step, "lsexp / hand-written", "each in its own process; the hand-written loop with no "
               "ONEDNN_MAX_CPU_ISA, lsexp with its default")
    else:  # [pairs] [overrides ...], e.g. telemetry.locate=false for the step without taps
        main(int(args[0]) if args else 10, args[1:])
