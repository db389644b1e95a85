"""What MindSpore's dataset pipeline costs per step, and the peak memory of a full-size CIFAR-10 run.

    python benchmarks/pipeline_overhead.py [pairs] [--images N] [--cifar] [override ...]
    python benchmarks/pipeline_overhead.py --batches [--images N]
    e.g. python benchmarks/pipeline_overhead.py 5 device.onednn_max_cpu_isa=AVX2
         python benchmarks/pipeline_overhead.py 5 dataset.cache=stream device.onednn_max_cpu_isa=AVX2

1. Per step: LeNet5 (or the model the overrides name) on MNIST-format files (10 000 images by
   default, written into a temp dir, used at their own 28x28) fed through `dataset=mnist` as
   configured (by default `dataset.cache=auto`, which reads these records into memory once;
   `dataset.cache=stream` is MnistDataset -> map -> batch, rebuilt per epoch over that epoch's
   order), against the same images, normalised the same way, in the same order, fed from numpy
   arrays in memory (`dataset._target_=pipeline_overhead.mnist_arrays`). Runs alternate, so machine
   noise hits both alike. Time per step is taken from summary.json's epoch_seconds over epochs 2
   and 3, so neither the first step's compilation nor the reading nor the evaluation counts; the
   ratio of the medians is the cost.
2. With --batches instead: the CPU time (all the process's threads) that making one epoch's
   batches of those images takes with `dataset.cache=memory` and with `dataset.cache=stream`,
   apart from any training; the median of three epochs.
3. With --cifar: one epoch of `dataset=cifar10` on full-size files (50 000 images), with
   `dataset.cache=auto` (held in memory) and `dataset.cache=stream`, and the peak RSS of each run's
   process tree (the command and any job it starts).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from helpers.data_files import write_cifar10, write_mnist  # noqa: E402
from ratios import report  # noqa: E402

MEAN, STD = 0.1307, 0.3081


def mnist_arrays(path, num_classes=10, **_):
    """The MNIST images as lsexp.datasets.kinds.Arrays, normalised as lsexp.datasets.mnist does at 28x28; the
    test images too, so that both sides evaluate between epochs alike."""
    from lsexp.datasets.kinds import Arrays, one_hot

    def split(prefix):
        images = np.fromfile(Path(path) / f"{prefix}-images-idx3-ubyte", dtype=np.uint8)[16:]
        labels = np.fromfile(Path(path) / f"{prefix}-labels-idx1-ubyte", dtype=np.uint8)[8:]
        return (images.reshape(-1, 1, 28, 28).astype(np.float32) / (255 * STD) - MEAN / STD,
                labels.astype(np.int64))

    (x, y), (x_val, y_val) = split("train"), split("t10k")
    return Arrays(x, one_hot(y, num_classes), x_val, y_val.astype(np.int32))


def run(args, cwd, name) -> tuple[dict, float]:
    """The run's summary.json and the peak RSS (MB) of its process tree."""
    with open(Path(cwd) / f"{name}.err", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lsexp", "tracking=none", "train.progress=false",
                                 f"hydra.run.dir={name}", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=err, env={"PYTHONPATH": str(HERE), **_env()})
        _, status, usage = os.wait4(proc.pid, 0)  # this run's own rusage: the largest process it waited for
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(err.read())
    return json.loads((Path(cwd) / name / "summary.json").read_text()), usage.ru_maxrss / 1024


def _env():
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def per_step(pairs: int, extra: list, images: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        data = write_mnist(Path(cwd) / "mnist", train=images, test=100)
        common = ["dataset=mnist", f"dataset.path={data}", "dataset.image_size=28", "train.epochs=3", *extra]
        ms_per_step = {"mnist": [], "arrays": []}
        arrays = [*common, "dataset._target_=pipeline_overhead.mnist_arrays"]
        for i in range(pairs):
            for kind, args in (("mnist", common), ("arrays", arrays)):
                summary, _ = run(args, cwd, f"{kind}{i}")
                steps = summary["steps"] // 3
                ms_per_step[kind].append(round(1000 * sum(summary["epoch_seconds"][1:]) / (2 * steps), 2))
    report(ms_per_step, "dataset=mnist / arrays", " ".join(extra) or "defaults")


def per_batch(images: int) -> None:
    from omegaconf import OmegaConf

    from lsexp.datasets.mnist import mnist

    with tempfile.TemporaryDirectory() as cwd:
        data = write_mnist(Path(cwd) / "mnist", train=images, test=100)
        d = OmegaConf.create({"batch_size": 32, "drop_remainder": True, "shuffle": True, "seed": 1})
        for cache in ("memory", "stream"):
            source = mnist(str(data), image_size=28, cache=cache)
            sum(1 for _ in source.batches(d, 0, 0))  # reads the records once, or warms the pipeline up
            cpu = []
            for epoch in (1, 2, 3):
                started = time.process_time()
                n = sum(1 for _ in source.batches(d, epoch, 0))
                cpu.append(1e6 * (time.process_time() - started) / n)
            print(f"dataset.cache={cache:<6}  median {statistics.median(cpu):.0f} us of CPU per batch of 32 "
                  f"28x28 images  {[round(c) for c in cpu]}")


def cifar_memory(extra: list) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        folder = write_cifar10(Path(cwd) / "cifar")
        for cache in ("auto", "stream"):
            summary, peak = run(["dataset=cifar10", f"dataset.path={folder}", "train.epochs=1",
                                 f"dataset.cache={cache}", *extra], cwd, f"cifar-{cache}")
            print(f"cifar10 dataset.cache={cache}, one epoch of {summary['steps']} steps: eval_accuracy "
                  f"{summary['eval_accuracy']:.3f}, {summary['steps_per_second']:.1f} steps/s, "
                  f"peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    argv = sys.argv[1:]
    images = int(argv.pop(argv.index("--images") + 1)) if "--images" in argv else 10000
    numbers = [a for a in argv if a.isdigit()]
    overrides = [a for a in argv if "=" in a]  # e.g. model=resnet, dataset.cache=stream
    if "--batches" in argv:
        raise SystemExit(per_batch(images))
    per_step(int(numbers[0]) if numbers else 5, overrides, images)
    if "--cifar" in sys.argv:
        cifar_memory([o for o in overrides if o.startswith("device.")])
