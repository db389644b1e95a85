"""Eight-bit training emulated bit for bit beside float16 and float32 (experiment=eight_bit on the MLP,
experiment=eight_bit_gpt on the GPT-style language model).

Per workload and arm (conf/arm/), over the seeds as mean ± std [95% interval] (Student's t, as the sweep
comparison has it):
- the held-out loss (eval_loss) and where its interval lies against float32's and against float16's
  (the `dynamic` arm, which every recipe runs on top of): `above`, `overlaps` or `below`. A run whose
  held-out loss is not finite counts as above and is named in `note`;
- eval accuracy and the updates the loss scale skipped;
- where the recipe loses values (telemetry/precision.csv): the quantised tensors with the largest mean
  saturated fraction and the largest mean flushed fraction, over the steps and then the seeds;
- the step's time against the float16 arm's of the same seed (engines.steady_speed: epochs after the
  first). The sweep's jobs share the machine with whatever else runs, so it is a rough ratio; the
  benchmark (benchmarks/precision_cost.py) measures it properly.

bfloat16 is an arm (conf/arm/bfloat16: amp O2, no loss scale); where a sweep does not run it, it is probed
per workload at the float16 arm's amp level (O2), as in experiment=scalers (scalers.bfloat16_note), and
shown as a row.
The figure: the held-out loss per arm with its 95% interval, float32's band across the plot.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from typing import Dict, List

import numpy as np

from lsexp.report.studies import StudyRun, finished_cells, loss_cells, over_seeds
from lsexp.report.studies.engines import steady_speed
from lsexp.report.studies.scalers import arm, bfloat16_note, swept_bfloat16, workload

ARMS = ["float32", "dynamic", "bfloat16", "fp8_delayed", "fp8_current", "mxfp8", "hif8_current"]
REFERENCE, FLOAT16 = "float32", "dynamic"
COLUMNS = ["workload", "arm", "dtype", "precision", "seeds", "eval_loss", "vs_float32", "vs_float16",
           "eval_accuracy", "skipped_updates", "most_saturated", "most_flushed", "step_time_vs_float16",
           "note"]
SHOWN = 3  # tensors named per column


def losses_by_tensor(run: StudyRun) -> Dict[str, tuple]:
    """Per quantised tensor, the mean over the run's steps that did not overflow of (saturated,
    flushed) fractions."""
    path = run.artifact("telemetry/precision.csv")
    if path is None:
        return {}
    values: Dict[str, list] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("overflow") == "1":
                continue
            values[row["tensor"]].append((float(row["saturated_fraction"]), float(row["flushed_fraction"])))
    return {name: tuple(np.mean(v, axis=0)) for name, v in values.items()}


def _worst(runs: List[StudyRun], which: int) -> str:
    per_seed = [losses_by_tensor(r) for r in runs]
    names = {name for seed in per_seed for name in seed}
    means = {name: float(np.mean([s[name][which] for s in per_seed if name in s])) for name in names}
    top = sorted(means.items(), key=lambda kv: -kv[1])[:SHOWN]
    return "; ".join(f"{name} {value:.2e}" for name, value in top if value > 0) or ("0" if means else "")


def cells(runs: List[StudyRun]) -> Dict[tuple, List[StudyRun]]:
    order = {a: i for i, a in enumerate(ARMS)}
    return finished_cells(runs, lambda r: (workload(r), arm(r)),
                          lambda k: (k[0], order.get(k[1], len(ARMS)), k[1]))


def table(runs: List[StudyRun]):
    grouped = cells(runs)
    losses = loss_cells(grouped)
    speed = {(workload(r), r.seed, arm(r)): steady_speed(r) for r in runs}
    rows = []
    for key, mine in grouped.items():
        name, arm_name = key
        cell = losses[key]
        ratios = []
        for r in mine:
            base, own = speed.get((name, r.seed, FLOAT16)), speed.get((name, r.seed, arm_name))
            ratios.append(base / own if base and own else math.nan)
        notes = [cell.note] if cell.diverged else []
        rows.append({
            "workload": name,
            "arm": arm_name,
            "dtype": "float32" if mine[0].param("amp.level") == "O0" else mine[0].param("amp.dtype"),
            "precision": mine[0].param("precision.recipe", "none"),
            "seeds": len(mine),
            "eval_loss": cell.interval.cell(),
            "vs_float32": "" if arm_name == REFERENCE else cell.versus(losses.get((name, REFERENCE))),
            "vs_float16": ("" if arm_name in (REFERENCE, FLOAT16)
                           else cell.versus(losses.get((name, FLOAT16)))),
            "eval_accuracy": over_seeds(r.metrics.get("eval_accuracy", math.nan) for r in mine),
            "skipped_updates": over_seeds(float(r.metrics.get("skipped_steps", 0)) for r in mine),
            "most_saturated": _worst(mine, 0),
            "most_flushed": _worst(mine, 1),
            "step_time_vs_float16": "" if arm_name in (REFERENCE, FLOAT16) else over_seeds(ratios),
            "note": "; ".join(notes),
            "_interval": cell.interval,
        })
    for name in sorted({workload(r) for r in runs}):
        if swept_bfloat16([r for r in runs if workload(r) == name]):
            continue
        position = max(i for i, r in enumerate(rows) if r["workload"] == name) + 1
        rows.insert(position, {"workload": name, "arm": "-", "dtype": "bfloat16", "seeds": 0,
                               # probed from the float16 arm's config (amp O2), which the recipes run on
                               "note": bfloat16_note([r for r in runs if workload(r) == name
                                                      and arm(r) == FLOAT16] or
                                                     [r for r in runs if workload(r) == name])})
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    rows = [r for r in rows if "_interval" in r]
    names = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(max(8, 7 * len(names)), 5), squeeze=False)
    fig.subplots_adjust(left=0.1, right=0.98, top=0.86, bottom=0.22, wspace=0.25)
    for ax, name in zip(axes[0], names):
        mine = [r for r in rows if r["workload"] == name]
        reference = [r["_interval"] for r in mine if r["arm"] == REFERENCE and r["_interval"].n > 1]
        if reference:
            ax.axhspan(reference[0].low, reference[0].high, color="grey", alpha=0.25,
                       label="float32 (95% interval)")
        for i, r in enumerate(mine):
            iv = r["_interval"]
            if iv.n == 0:
                continue
            ax.errorbar([i], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]] if iv.n > 1 else None,
                        fmt="o", color=plt.get_cmap("tab10")(i % 10), capsize=4)
        ax.set_xticks(range(len(mine)), [r["arm"] for r in mine], rotation=30, fontsize=8)
        ax.set_ylabel("held-out loss (eval_loss)")
        ax.set_title(f"{name}: mean and 95% interval over seeds", fontsize=9)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Eight-bit recipes (emulated) on top of float16 with loss_scale=dynamic, against float32",
                 fontsize=11)
    return fig
