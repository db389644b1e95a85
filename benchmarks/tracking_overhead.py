"""Wall time of the default run with MLflow tracking against tracking=none, in one session.

    python benchmarks/tracking_overhead.py [pairs]

Runs `python -m lsexp` and `python -m lsexp tracking=none` alternately (so machine noise hits
both alike) in a temporary directory with a fresh mlflow.db, and prints the medians and ratio.
"""

import statistics
import subprocess
import sys
import tempfile
import time


def timed(args, cwd):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lsexp", "train.progress=false", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(pairs: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        timed(["train.max_steps=1"], cwd)  # create mlflow.db once, as any store after its first run
        none, tracked = [], []
        for _ in range(pairs):
            none.append(timed(["tracking=none"], cwd))
            tracked.append(timed([], cwd))
    m_none, m_tracked = statistics.median(none), statistics.median(tracked)
    print(f"tracking=none   median {m_none:.2f} s  {[round(t, 2) for t in none]}")
    print(f"tracking=mlflow median {m_tracked:.2f} s  {[round(t, 2) for t in tracked]}")
    print(f"overhead {100 * (m_tracked / m_none - 1):+.1f}% of wall time ({pairs} pairs)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
