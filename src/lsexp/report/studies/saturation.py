"""Ascend's saturation mode against inf/NaN, per loss-scale strategy (experiment=saturation).

Per case (natural overflows only, or with injected ones too), strategy (conf/arm/) and overflow arm
(conf/overflow/: infnan; saturation with the status flag; saturation with the values-only check), over
the seeds as mean ± std [95% interval] (Student's t, as the sweep comparison has it):
- skipped updates;
- undetected overflows: steps whose emulated status flag was raised and whose update was applied
  all the same (float_status 1, overflow 0), the silent failure;
- the loss's deviation from the infnan run of the same seed, strategy and case: the mean over the steps
  of |loss - loss_infnan|, and the largest;
- the held-out loss (eval_loss) and where its interval lies against infnan's: `above`, `overlaps` or
  `below`. A run whose held-out loss is not finite counts as above and is named in `note`.
The figure: the held-out loss per strategy and arm with its 95% interval, one panel per case.
"""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from lsexp.report.studies import StudyRun, finished_cells, loss_cells, over_seeds
from lsexp.report.studies.scalers import arm

MODES = ["infnan", "saturation", "saturation_values"]
COLUMNS = ["case", "strategy", "overflow", "seeds", "skipped_updates", "undetected_overflows",
           "loss_deviation_mean", "loss_deviation_max", "eval_loss", "vs_infnan", "note"]


def mode(run: StudyRun) -> str:
    if run.param("device.overflow_mode", "infnan") != "saturation":
        return "infnan"
    return "saturation" if run.param("device.status_check", "True") == "True" else "saturation_values"


def case(run: StudyRun) -> str:
    steps = run.param("inject.overflow_steps", "[]")
    return "natural" if steps in ("[]", "", None) else f"injected at {steps}"


def undetected(run: StudyRun) -> int:
    status, overflow = run.history("float_status"), run.history("overflow")
    return sum(1 for step, flag in status.items() if flag > 0 and overflow.get(step, 0) == 0)


def deviation(run: StudyRun, reference: StudyRun) -> tuple:
    """(mean, max) over the steps both ran of |loss - the reference's loss|; a non-finite loss counts
    as an infinite deviation."""
    mine, theirs = run.history("loss"), reference.history("loss")
    gaps = [abs(mine[s] - theirs[s]) if math.isfinite(mine[s]) else math.inf for s in mine if s in theirs]
    if not gaps:
        return math.nan, math.nan
    return float(np.mean(gaps)), float(np.max(gaps))


def cells(runs: List[StudyRun]) -> Dict[tuple, List[StudyRun]]:
    order = {m: i for i, m in enumerate(MODES)}
    return finished_cells(runs, lambda r: (case(r), arm(r), mode(r)),
                          lambda k: (k[0] != "natural", k[0], k[1], order.get(k[2], 9)))


def table(runs: List[StudyRun]):
    grouped = cells(runs)
    reference = {(case(r), arm(r), r.seed): r for r in runs if mode(r) == "infnan"}
    losses = loss_cells(grouped)
    rows = []
    for key, mine in grouped.items():
        name, strategy, overflow = key
        cell = losses[key]
        gaps = [deviation(r, reference[(name, strategy, r.seed)]) for r in mine
                if (name, strategy, r.seed) in reference]
        rows.append({
            "case": name,
            "strategy": strategy,
            "overflow": overflow,
            "seeds": len(mine),
            "skipped_updates": over_seeds(float(r.metrics.get("skipped_steps", 0)) for r in mine),
            "undetected_overflows": "" if overflow == "infnan" else over_seeds(undetected(r) for r in mine),
            "loss_deviation_mean": "" if overflow == "infnan" else over_seeds(g[0] for g in gaps),
            "loss_deviation_max": "" if overflow == "infnan" else over_seeds(g[1] for g in gaps),
            "eval_loss": cell.interval.cell(),
            "vs_infnan": "" if overflow == "infnan" else cell.versus(losses.get((name, strategy, "infnan"))),
            "note": cell.note,
            "_interval": cell.interval,
        })
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(max(8, 7 * len(cases)), 5), squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.86, bottom=0.25, wspace=0.25)
    colours = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(MODES)}
    for ax, name in zip(axes[0], cases):
        mine = [r for r in rows if r["case"] == name]
        for i, r in enumerate(mine):
            iv = r["_interval"]
            if iv.n > 0 and math.isfinite(iv.mean):
                bar = [[iv.mean - iv.low], [iv.high - iv.mean]] if iv.n > 1 else None
                ax.errorbar([i], [iv.mean], yerr=bar, fmt="o", color=colours.get(r["overflow"], "k"),
                            capsize=4)
        ax.set_xticks(range(len(mine)), [f"{r['strategy']}\n{r['overflow']}" for r in mine], rotation=60,
                      fontsize=7)
        ax.set_ylabel("held-out loss (eval_loss)")
        ax.set_title(f"{name}: mean and 95% interval over seeds", fontsize=9)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=m) for m, c in colours.items()]
    fig.legend(handles=handles, loc="upper right", fontsize=8)
    fig.suptitle("Ascend's saturation mode (emulated): with its status flag and with a values-only check, "
                 "against inf/NaN", fontsize=11)
    return fig
