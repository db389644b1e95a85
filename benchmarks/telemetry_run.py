"""What telemetry=grads costs a whole run as a user starts it: `python -m lsexp amp=O2 train.max_steps=150`
with telemetry=grads (its default histogram step) against telemetry=none, each its own process, process
start and the MLflow run included, alternating, in a scratch folder:

    python benchmarks/telemetry_run.py [pairs]      (5 by default)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from ratios import report

COMMON = ("amp=O2", "train.max_steps=150", "train.progress=false")


def one(cwd: str, *variant: str) -> float:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lsexp", *COMMON, *variant], cwd=cwd, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return 1000 * (time.perf_counter() - started)


def main(pairs: int) -> None:
    ms = {"telemetry=grads": [], "telemetry=none": []}
    with tempfile.TemporaryDirectory() as tmp:
        one(tmp, "telemetry=none")  # warm-up: the first run of a fresh store creates its tables
        for _ in range(pairs):
            for variant in ms:
                ms[variant].append(one(tmp, variant))
    report(ms, "grads / none (whole run, wall)", " ".join(COMMON) + "; ms per run, not per step")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
