"""Is one global loss scale still needed? The large_batch setups (train.mean_over_tokens = N) under
float32, float16 without a scale, the global scalers, a scale per layer (loss_scale=per_layer), unit
scaling (model.scaling=unit) with and without a scale, and bfloat16 (experiment=one_scale_or_many).

Per workload, N and arm (conf/arm/), over the seeds, as large_batch has them: the held-out loss, mean ±
std [95% interval], and where its interval lies against float32's at the same N; the updates skipped;
per tapped layer the fraction of its activation gradient float16 loses (underflow + zero fraction,
float32's row the reference); under per_layer each layer's mean scale; and each arm's time per step over
dynamic's at the same N (from the runs' steps_per_second, the mean over the seeds).
"""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from lsexp.report.studies import StudyRun, finished_cells, loss_cells, over_seeds
from lsexp.report.studies.large_batch import (
    batch_tokens,
    divisor,
    layer_means,
    lost_by_layer,
    n_label,
    tokens,
)
from lsexp.report.studies.scalers import arm, workload

ARMS = ["float32", "none", "dynamic", "dynamic_hysteresis", "per_layer", "per_layer_4096", "unit_none",
        "unit_dynamic", "bfloat16"]
REFERENCE = "float32"
COST_REFERENCE = "dynamic"
COLUMNS = ["workload", "N", "arm", "dtype", "seeds", "eval_loss", "vs_float32", "skipped_updates",
           "lost_fraction_by_layer", "layer_scales", "time_per_step_vs_dynamic"]


def layer_scales(run: StudyRun) -> Dict[str, float]:
    """Per layer, the mean of its own scale over the steps that did not overflow (loss_scale=per_layer's
    layers.csv); empty for another strategy."""
    return layer_means(run, lambda row: float(row.get("layer_scale") or "nan"))


def _by_layer(per_seed: List[Dict[str, float]], digits: int) -> str:
    layers = list(dict.fromkeys(name for seed in per_seed for name in seed))
    return "; ".join(f"{name} {np.mean([s[name] for s in per_seed if name in s]):.{digits}g}"
                     for name in layers)


def _order(key):
    name, n, arm_name = key
    return (name, -1 if n is None else n, ARMS.index(arm_name) if arm_name in ARMS else len(ARMS), arm_name)


def _seconds_per_step(runs: List[StudyRun]) -> float:
    speeds = [r.metrics.get("steps_per_second", math.nan) for r in runs]
    speeds = [s for s in speeds if math.isfinite(s) and s > 0]
    return 1.0 / float(np.mean(speeds)) if speeds else math.nan


def table(runs: List[StudyRun]):
    t = batch_tokens(runs)
    grouped = finished_cells(runs, lambda r: (workload(r), tokens(r), arm(r)), _order)
    losses = loss_cells(grouped)
    rows = []
    for key, mine in grouped.items():
        name, n, arm_name = key
        cell = losses[key]
        cost = grouped.get((name, n, COST_REFERENCE))
        ratio = _seconds_per_step(mine) / _seconds_per_step(cost) if cost else math.nan
        rows.append({
            "workload": name,
            "N": n_label(n, t[name]),
            "arm": arm_name,
            "dtype": "float32" if mine[0].param("amp.level") == "O0" else mine[0].param("amp.dtype"),
            "seeds": len(mine),
            "eval_loss": cell.interval.cell(),
            "vs_float32": "" if arm_name == REFERENCE else cell.versus(losses.get((name, n, REFERENCE))),
            "skipped_updates": over_seeds(float(r.metrics.get("skipped_steps", 0)) for r in mine),
            "lost_fraction_by_layer": _by_layer([lost_by_layer(r) for r in mine], 3),
            "layer_scales": _by_layer([layer_scales(r) for r in mine], 3),
            "time_per_step_vs_dynamic": "" if not math.isfinite(ratio) else f"{ratio:.2f}x",
            "_n": float(t[name] if n is None else n),
            "_interval": cell.interval,
            "_divisor": divisor(mine[0]),
        })
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    """Per workload and N, each arm's held-out loss with its 95% interval, float32's band behind them."""
    rows = [r for r in rows if "_interval" in r]
    panels = sorted({(r["workload"], r["_n"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8, 5 * len(panels)), 5), squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.86, bottom=0.3, wspace=0.3)
    for ax, (name, n) in zip(axes[0], panels):
        mine = [r for r in rows if r["workload"] == name and r["_n"] == n]
        for r in mine:
            if r["arm"] == REFERENCE and r["_interval"].n > 1:
                ax.axhspan(r["_interval"].low, r["_interval"].high, color="grey", alpha=0.25,
                           label="float32 (95%)")
        arms = [r for r in mine if r["arm"] != REFERENCE]
        for i, r in enumerate(arms):
            iv = r["_interval"]
            if iv.n == 0:
                continue
            low, high = (iv.low, iv.high) if iv.n > 1 else (iv.mean, iv.mean)
            ax.errorbar([i], [iv.mean], yerr=[[iv.mean - low], [high - iv.mean]], fmt="o", capsize=3)
        ax.set_xticks(range(len(arms)), [r["arm"] for r in arms], rotation=60, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("held-out loss (eval_loss)")
        ax.set_title(f"{name}, N = {mine[0]['N']}", fontsize=9)
    fig.suptitle("One global loss scale or many: held-out loss per arm, mean and 95% interval", fontsize=11)
    return fig
