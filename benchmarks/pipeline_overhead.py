"""What MindSpore's dataset pipeline costs per step, and the peak memory of a full-size CIFAR-10 run.

    python benchmarks/pipeline_overhead.py [pairs] [--images N] [--cifar] [override ...]
    e.g. python benchmarks/pipeline_overhead.py 3 --images 3200 model=resnet model.depth=8

1. Per step: LeNet5 (or the model the overrides name) on MNIST-format files (10 000 images by
   default, written into a temp dir) fed through
   `dataset=mnist` (MnistDataset -> map -> batch, rebuilt per epoch over that epoch's order), against
   the same images, normalised the same way, in the same order, fed from numpy arrays in memory
   (`dataset._target_=pipeline_overhead.mnist_arrays`). Runs alternate, so machine noise hits both
   alike. Time per step is taken from summary.json's epoch_seconds over epochs 2 and 3, so neither
   the first step's compilation nor the evaluation counts; the ratio of the medians is the cost.
2. With --cifar: one epoch of `dataset=cifar10` on full-size files (50 000 images), and the peak
   RSS of the run's process tree (its job and the command).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from data_files import write_cifar10, write_mnist  # noqa: E402
from ratios import report  # noqa: E402

MEAN, STD = 0.1307, 0.3081


def mnist_arrays(path, num_classes=10, **_):
    """The MNIST training images as lsexp.data.Arrays, normalised as lsexp.datasets.mnist does at 28x28."""
    from lsexp.data import Arrays, one_hot

    def idx(name, header):
        return np.fromfile(Path(path) / name, dtype=np.uint8)[header:]

    x = idx("train-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28).astype(np.float32) / (255 * STD) - MEAN / STD
    y = idx("train-labels-idx1-ubyte", 8).astype(np.int64)
    return Arrays(x, one_hot(y, num_classes))


def run(args, cwd, name):
    out = subprocess.run([sys.executable, "-m", "lsexp", "tracking=none", "train.progress=false",
                          f"hydra.run.dir={name}", *args], cwd=cwd, capture_output=True, text=True,
                         env={"PYTHONPATH": str(HERE), **_env()})
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads((Path(cwd) / name / "summary.json").read_text())


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def per_step(pairs: int, extra: list, images: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        data = write_mnist(Path(cwd) / "mnist", train=images, test=100)
        common = ["dataset=mnist", f"dataset.path={data}", "dataset.image_size=28", "train.epochs=3", *extra]
        ms_per_step = {"pipeline": [], "memory": []}
        for i in range(pairs):
            for kind, args in (("pipeline", common), ("memory", [*common, "dataset._target_=pipeline_overhead.mnist_arrays"])):
                summary = run(args, cwd, f"{kind}{i}")
                steps = summary["steps"] // 3
                ms_per_step[kind].append(round(1000 * sum(summary["epoch_seconds"][1:]) / (2 * steps), 2))
    report(ms_per_step, "pipeline / memory", " ".join(extra) or "defaults")


def cifar_memory() -> None:
    with tempfile.TemporaryDirectory() as cwd:
        folder = write_cifar10(Path(cwd) / "cifar")
        summary = run(["dataset=cifar10", f"dataset.path={folder}", "train.epochs=1"], cwd, "cifar")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"cifar10, one epoch of {summary['steps']} steps: eval_accuracy {summary['eval_accuracy']:.3f}, "
          f"{summary['steps_per_second']:.1f} steps/s, peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    argv = sys.argv[1:]
    images = int(argv.pop(argv.index("--images") + 1)) if "--images" in argv else 10000
    numbers = [a for a in argv if a.isdigit()]
    overrides = [a for a in argv if "=" in a]  # e.g. model=resnet, dataset.num_parallel_workers=2
    per_step(int(numbers[0]) if numbers else 5, overrides, images)
    if "--cifar" in sys.argv:
        cifar_memory()
