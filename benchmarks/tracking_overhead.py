"""Wall time of the default run with MLflow tracking against tracking=none, in one session.

    python benchmarks/tracking_overhead.py [pairs]

Runs `python -m lsexp` and `python -m lsexp tracking=none` alternately (so machine noise hits
both alike) in a temporary directory whose mlflow.db already exists, as it does after a user's
first run, and prints the medians of the whole command's wall time and of the training loop's
throughput (summary.json's steps_per_second), and the mean of each pair's wall-time ratio with
its standard error.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(args, cwd, run_dir):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lsexp", "train.progress=false", f"hydra.run.dir={run_dir}", *args],
                   cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return wall, json.loads((Path(cwd) / run_dir / "summary.json").read_text())["steps_per_second"]


def main(pairs: int) -> None:
    results = {"none": [], "mlflow": []}
    with tempfile.TemporaryDirectory() as cwd:
        timed(["train.max_steps=1"], cwd, "warmup")  # creates mlflow.db
        for i in range(pairs):
            results["none"].append(timed(["tracking=none"], cwd, f"none{i}"))
            results["mlflow"].append(timed([], cwd, f"mlflow{i}"))
    wall = {k: statistics.median(w for w, _ in v) for k, v in results.items()}
    speed = {k: statistics.median(s for _, s in v) for k, v in results.items()}
    for k, v in results.items():
        print(f"tracking={k:<6}  wall median {wall[k]:.2f} s {[round(w, 2) for w, _ in v]}  "
              f"training median {speed[k]:.2f} steps/s")
    print(f"overhead: wall time {100 * (wall['mlflow'] / wall['none'] - 1):+.1f}%, "
          f"training throughput {100 * (speed['mlflow'] / speed['none'] - 1):+.1f}% ({pairs} pairs)")
    ratios = [100 * (m / n - 1) for (n, _), (m, _) in zip(results["none"], results["mlflow"])]
    if len(ratios) > 1:
        print(f"per pair: mean wall-time overhead {statistics.mean(ratios):+.1f}% "
              f"(standard error {statistics.stdev(ratios) / len(ratios) ** 0.5:.1f}%)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
