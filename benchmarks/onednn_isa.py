"""What device.onednn_max_cpu_isa=auto gains, and what its calibration costs.

    python benchmarks/onednn_isa.py [pairs] [override ...]     e.g. 3 workload=resnet8_digits amp=O2
    python benchmarks/onednn_isa.py --cost [pairs]

1. Alternately, `python -m lsexp tracking=none <overrides>` with today's default (auto: this
   machine's calibrated cap) and with `device.onednn_max_cpu_isa=null` (all the CPU has), each in
   its own process (oneDNN reads its cap once per process). Time per step from summary.json's
   steps_per_second; prints the medians and the ratio null / auto, and the cap in force.
2. --cost: the default run with an empty calibration cache (the first run on a machine) against the
   same run with the cache that run left; prints the medians of the whole command's wall time and
   whether the second run started a calibration probe.
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

from ratios import report

PROBE = "timing oneDNN"  # what lsexp prints when it calibrates


def lsexp(cwd: Path, name: str, *overrides: str, env=None) -> tuple:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lsexp", "tracking=none", "train.progress=false",
                          f"hydra.run.dir={name}", *overrides], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, **(env or {})})
    wall = time.perf_counter() - started
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads((cwd / name / "summary.json").read_text()), wall, PROBE in out.stdout + out.stderr


def gain(pairs: int, overrides: list) -> None:
    ms_per_step = {"onednn_max_cpu_isa=null": [], "default (auto)": []}
    caps = set()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for name, extra in (("onednn_max_cpu_isa=null", ["device.onednn_max_cpu_isa=null"]),
                                ("default (auto)", [])):
                summary, _, _ = lsexp(Path(tmp), f"{i}-{len(extra)}", *overrides, *extra)
                ms_per_step[name].append(1000 / summary["steps_per_second"])
                if not extra:
                    caps.add(summary["onednn_max_cpu_isa"])
    report(ms_per_step, "null / auto",
           f"auto ran with {', '.join(map(str, caps))}; {' '.join(overrides) or 'defaults'}")


def cost(pairs: int) -> None:
    walls = {"first run (calibrates)": [], "second run (cached)": []}
    probed_again = False
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            env = {"LSEXP_CACHE_DIR": str(Path(tmp) / f"cache{i}")}
            for name in walls:
                _, wall, probed = lsexp(Path(tmp), f"{i}-{len(walls[name])}-{name[:5]}", env=env)
                walls[name].append(wall)
                probed_again |= probed and name.startswith("second")
    for name, times in walls.items():
        print(f"{name:<22}  median {statistics.median(times):.1f} s  {[round(t, 1) for t in times]}")
    first, second = (statistics.median(t) for t in walls.values())
    print(f"the first run's extra time: {first - second:.1f} s ({pairs} pairs); the second run started a "
          f"calibration probe: {probed_again}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--cost"]:
        cost(int(args[1]) if len(args) > 1 else 3)
    else:
        pairs = int(args[0]) if args and args[0].isdigit() else 3
        gain(pairs, args[1:] if args and args[0].isdigit() else args)
