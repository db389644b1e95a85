"""Loss scaling under a Transformer's recipe (AdamW, warm-up then cosine decay, clipping to a global
norm of 1): what a skipped update does to the schedule under lr_schedule.on_skip=hold and advance, and
what clipping sees.

Per setting (workload, strategy, on_skip: a group, the choices but the seed), over the seeds as
mean ± std [95% interval] (lsexp.report.groups, as the sweep comparison has it): the skipped updates;
the drift, how many steps the schedule stands behind the step count at the end, measured from the lr
column against the same seed's `none` run, whose schedule saw every step; the share of steps clipped;
the what-if, the share of steps whose *scaled* gradients (global_norm x loss_scale) exceed the clip
norm, which is what clipping before unscaling would have clipped; the final eval loss and accuracy.
`none`'s hold and advance are one run, so they are checked to be equal and shown once.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

from lsexp.report.studies import StudyRun, by_group, over_seeds

COLUMNS = ["workload", "strategy", "on_skip", "seeds", "skipped_updates", "schedule_drift_steps",
           "clipped_fraction", "clipped_if_scaled_fraction", "eval_loss", "eval_accuracy"]


def _workload(run: StudyRun) -> str:
    """The swept workload, or the data set's name when the sweep has one."""
    for token in run.label.split():
        if token.startswith("workload="):
            return token.split("=", 1)[1]
    return run.param("dataset._target_", "-").rsplit(".", 1)[-1]


def drift(run: StudyRun, reference: StudyRun) -> float:
    """Steps the run's schedule stands behind its step count at the last step: the last step's lr is
    the reference's (no step skipped) at step s, so the schedule is at s where the step count is at
    the end; searched after the warm-up's peak, where the cosine decay is one-to-one."""
    lr, ref = run.history("lr"), reference.history("lr")
    if not lr or not ref:
        return math.nan
    last = max(lr)
    peak = max(ref, key=ref.get)
    candidates = [s for s in ref if s >= peak]
    if lr[last] > ref[peak] * (1 + 1e-6):  # still warming up: search the warm-up instead
        candidates = [s for s in ref if s <= peak]
    s = min(candidates, key=lambda s: abs(ref[s] - lr[last]))
    return float(last - s)


def _scaled_clips(run: StudyRun, clip: float) -> float:
    norm, scale = run.history("global_norm"), run.history("loss_scale")
    steps = [s for s in norm if math.isfinite(norm[s])]
    return sum(norm[s] * scale[s] > clip for s in steps) / len(steps) if steps else math.nan


def _on_skip(run: StudyRun) -> str:
    return run.param("lr_schedule.on_skip", "hold")


def table(runs: List[StudyRun]):
    reference: Dict[Tuple[str, str], StudyRun] = {}
    for run in runs:
        if run.strategy == "none" and _on_skip(run) == "hold":
            reference[(_workload(run), run.seed)] = run
    groups = list(by_group(runs).values())
    # none skips nothing, so its advance must be its hold: checked, then shown once
    none_same = {}
    for advance in [g for g in groups if g[0].strategy == "none" and _on_skip(g[0]) == "advance"]:
        workload = _workload(advance[0])
        hold = next((g for g in groups if g[0].strategy == "none" and _on_skip(g[0]) == "hold"
                     and _workload(g[0]) == workload), [])
        groups.remove(advance)
        none_same[workload] = len(advance) == len(hold) and all(
            a.series("loss") == b.series("loss") and a.series("lr") == b.series("lr")
            for a, b in zip(advance, hold))
    rows = []
    for mine in sorted(groups, key=lambda g: (_workload(g[0]), g[0].strategy, _on_skip(g[0]))):
        workload, strategy = _workload(mine[0]), mine[0].strategy
        clip = float(mine[0].param("optimizer.clip_grad_norm", "nan"))
        rows.append({
            "workload": workload,
            "strategy": strategy,
            "on_skip": _on_skip(mine[0]) if strategy != "none" else
            ("hold = advance" if none_same.get(workload) else "hold (advance differs)"),
            "seeds": len(mine),
            "skipped_updates": over_seeds(r.metrics.get("skipped_steps", math.nan) for r in mine),
            "schedule_drift_steps": over_seeds(
                drift(r, reference[(workload, r.seed)]) if (workload, r.seed) in reference else math.nan
                for r in mine),
            "clipped_fraction": over_seeds(_mean(r.history("clipped").values()) for r in mine),
            "clipped_if_scaled_fraction": over_seeds(_scaled_clips(r, clip) for r in mine),
            "eval_loss": over_seeds(r.metrics.get("eval_loss", math.nan) for r in mine),
            "eval_accuracy": over_seeds(r.metrics.get("eval_accuracy", math.nan) for r in mine),
            "_runs": mine,
        })
    return rows, COLUMNS


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def figure(plt, runs: List[StudyRun], rows):
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(2, len(workloads), figsize=(max(9, 6 * len(workloads)), 7), squeeze=False)
    fig.subplots_adjust(left=0.11, right=0.98, top=0.89, bottom=0.08, hspace=0.25, wspace=0.25)
    for col, workload in enumerate(workloads):
        ax_lr, ax_loss = axes[0][col], axes[1][col]
        for row in (r for r in rows if r["workload"] == workload):
            run = row["_runs"][0]  # the first seed's curves
            label = f"{row['strategy']} {row['on_skip']}"
            lr = run.history("lr")
            steps = sorted(lr)
            style = dict(linestyle="--" if row["on_skip"] == "advance" else "-", linewidth=1)
            ax_lr.plot(steps, [lr[s] for s in steps], label=label, **style)
            loss = run.history("loss")
            ax_loss.plot(sorted(loss), [loss[s] for s in sorted(loss)], label=label, **style)
        ax_lr.set_title(f"{workload} (each setting's first seed)", fontsize=9)
        ax_lr.set_ylabel("learning rate used")
        ax_loss.set_ylabel("training loss")
        ax_loss.set_xlabel("step")
        ax_lr.legend(fontsize=7, loc="upper right")
    fig.suptitle("AdamW, warm-up + cosine, clip 1.0, amp O2:\na skipped update holds (solid) or advances "
                 "(dashed) the schedule", fontsize=10)
    return fig
