"""What the newer scalers cost per step against MindSpore's DynamicLossScaleManager (loss_scale=dynamic).

    python benchmarks/scalers.py [rounds] [override ...]        (30 rounds by default)
    python benchmarks/scalers.py --control [rounds]             dynamic's step against itself

The three train steps (dynamic, adaptive_window, amax_history) are built as lsexp builds them for the
default run (or with the overrides), in one process, and compiled. Then, round after round, each
runs BLOCK steps on the same batches, in an order that rotates every round, reading its loss every step
as the training loop does, and counts the median step of its block. Interleaving the three this finely,
and taking medians, lets the machine's slow spells, which on a shared 2-core machine move a whole run's
time by a fifth, fall on all three alike or drop out. Prints each one's median milliseconds per step
over the rounds, the ratio of the medians, and the mean of the per-round ratios. A step built first in its
process runs faster than the same step built later (docs/studies.md gives the control), so this runs in
three processes, each building the three in another order, and pools them.

adaptive_window replaces DynamicLossScaleUpdateCell by MindFormers' rule as table lookups; amax_history
adds the amax of the concatenated gradients after the reducer, which is also its overflow check (in place
of amp.all_finite), and its history's update.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from ratios import report

VARIANTS = ("dynamic", "adaptive_window", "amax_history")
BLOCK = 16  # steps per variant per round


def _steps(tmp: Path, stack: contextlib.ExitStack, order, common, strategy=None):
    """Each variant's compiled train step, built in `order`, and the batches they all take; with
    `strategy`, every one of them is that strategy's (the control)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lsexp import device, preflight
    from lsexp.config import paths
    from lsexp.config.registry import register_configs
    from lsexp.device.decided import decide
    from lsexp.training.build import build, load_data
    from lsexp.training.job import Job

    register_configs()
    cells, target, batches = {}, None, None
    for name in order:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(paths.conf_dir()), version_base="1.3"):
            cfg = compose("config", overrides=["tracking=none", "train.progress=false", *common,
                                               f"loss_scale={strategy or name}"])
        checked = preflight.check(cfg)
        decided = stack.enter_context(decide(cfg, checked.strategy.optimizer_loss_scale, 1))
        if target is None:  # the device once per process, as a run configures it
            target = device.configure(cfg.device, cfg.train.mode, decided.threads_num,
                                      decided.onednn_max_cpu_isa)
            data = load_data(cfg)
            batches = list(data.batches(cfg.dataset, 0, 0))
        out = tmp / name
        out.mkdir()
        job = Job(cfg=cfg, plan=checked.plan, strategy=checked.strategy, decided=decided, out_dir=out,
                  target=target)
        _, cell, _ = build(job, last_step=10**6)
        for x, y in batches[:2]:  # compile
            cell(x, y).asnumpy()
        cells[name] = cell
    return cells, batches


def one_order(first: int, rounds: int, *common: str, strategy=None) -> Dict[str, List[float]]:
    """This process's block medians per variant, the steps built starting with VARIANTS[first]."""
    order = VARIANTS[first:] + VARIANTS[:first]
    times = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        cells, batches = _steps(Path(tmp), stack, order, common, strategy)
        for r in range(rounds):
            for name in order[r % 3:] + order[:r % 3]:
                cell, block = cells[name], []
                for i in range(BLOCK):
                    x, y = batches[(r * BLOCK + i) % len(batches)]
                    started = time.perf_counter()
                    cell(x, y).asnumpy()  # the loop's one host sync a step
                    block.append(1000 * (time.perf_counter() - started))
                times[name].append(statistics.median(block))
    return times


def main(rounds: int, *common: str) -> None:
    times = {name: [] for name in VARIANTS}
    for first in range(len(VARIANTS)):
        out = subprocess.run([sys.executable, __file__, "--order", str(first), str(rounds), *common],
                             capture_output=True, text=True, cwd=Path(__file__).parent)
        if out.returncode:
            raise SystemExit(out.stderr)
        for name, values in json.loads(out.stdout.strip().splitlines()[-1]).items():
            times[name] += values
    note = (f"{' '.join(common) or 'the default run'}; {BLOCK}-step blocks interleaved over {rounds} "
            f"rounds in each of {len(VARIANTS)} processes, one per build order")
    for name in ("adaptive_window", "amax_history"):
        report({name: times[name], "dynamic": times["dynamic"]}, f"{name} / dynamic", note)


def control(rounds: int) -> None:
    """dynamic's step built three times in one process, timed as the variants are: what building
    first or later does to the same step."""
    times = one_order(0, rounds, strategy="dynamic")
    built = dict(zip(VARIANTS, ("built first", "built second", "built third")))
    for name in VARIANTS[1:]:
        report({f"dynamic {built[name]}": times[name], "dynamic built first": times[VARIANTS[0]]},
               f"the same step {built[name]} / first", f"one process, {rounds} rounds")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--control"]:
        control(int(sys.argv[2]) if len(sys.argv) > 2 else 30)
    elif sys.argv[1:2] == ["--order"]:
        print(json.dumps(one_order(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 30, *sys.argv[2:])
