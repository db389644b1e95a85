"""A 4-job sweep on the basic launcher against the same sweep on joblib with n_jobs=2, in one session.

    python benchmarks/parallel_sweep.py [pairs] [overrides...]

Runs `python -m lsexp -m loss_scale=none,fixed_drop,fixed_nodrop,dynamic amp=O2 tracking=none`
(the seed's LeNet5, 10 epochs) alternately on the two launchers, so machine noise hits both alike,
and prints each one's wall time, the ratio of the medians, and whether every job's history.csv is
the same under both. With n_jobs=2, lsexp gives each job device.threads_num = cores / 2 and binds
its threads to its own half of the cores (device.affinity_cpu_list) after its first step.

The jobs run with today's default device.onednn_max_cpu_isa=auto. Where oneDNN runs the
convolutions through its reference loop (see the README's Performance section), add
device.onednn_max_cpu_isa=null to see what that costs: one job then fills both cores with
arithmetic, and no launcher can run a second one beside it for free.
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["-m", "loss_scale=none,fixed_drop,fixed_nodrop,dynamic", "amp=O2", "tracking=none",
         "train.progress=false"]
LAUNCHERS = {"basic": [], "joblib n_jobs=2": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]}


def timed(cwd: str, sweep_dir: str, extra) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lsexp", *SWEEP, *extra, f"hydra.sweep.dir={sweep_dir}"], cwd=cwd,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def histories(folder: Path):
    return {p.parent.name: p.read_text() for p in sorted(folder.glob("*/history.csv"))}


def main(pairs: int, overrides) -> None:
    walls = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory() as cwd:
        for i in range(pairs):
            for name, extra in LAUNCHERS.items():
                walls[name].append(timed(cwd, f"{name.split()[0]}{i}", [*extra, *overrides]))
        same = all(histories(Path(cwd, f"basic{i}")) == histories(Path(cwd, f"joblib{i}"))
                   for i in range(pairs))
        jobs = len(histories(Path(cwd, "basic0")))
    for name, times in walls.items():
        print(f"{name:<16} median {statistics.median(times):.1f} s  {[round(t, 1) for t in times]}")
    ratios = [b / j for b, j in zip(walls["basic"], walls["joblib n_jobs=2"])]
    print("joblib n_jobs=2 is "
          f"{statistics.median(walls['basic']) / statistics.median(walls['joblib n_jobs=2']):.2f}x "
          f"faster than basic (per-pair mean {statistics.mean(ratios):.2f}x, {pairs} pairs, "
          f"{jobs} jobs each); histories identical: {same}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3, sys.argv[2:])
