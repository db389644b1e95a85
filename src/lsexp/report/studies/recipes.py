"""Loss scaling under a Transformer's recipe (AdamW, warm-up then cosine decay, clipping to a global
norm of 1): what a skipped update does to the schedule under lr_schedule.on_skip=hold and advance, and
what clipping sees.

Per setting (workload, strategy, on_skip), over the seeds: the skipped updates; the drift, how many
steps the schedule stands behind the step count at the end, measured from the lr column against the
same seed's `none` run, whose schedule saw every step; the share of steps clipped; the what-if, the
share of steps whose *scaled* gradients (global_norm x loss_scale) exceed the clip norm, which is what
clipping before unscaling would have clipped; the final eval loss and accuracy. `none`'s hold and
advance are one run, so they are checked to be equal and shown once.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

from lsexp.report.studies import StudyRun

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


def spread(values: List[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return ""
    mean = sum(values) / len(values)
    if len(values) == 1 or max(values) == min(values):
        return f"{mean:.4g}"
    return f"{mean:.4g} ({min(values):.4g}-{max(values):.4g})"


def _scaled_clips(run: StudyRun, clip: float) -> float:
    norm, scale = run.history("global_norm"), run.history("loss_scale")
    steps = [s for s in norm if math.isfinite(norm[s])]
    return sum(norm[s] * scale[s] > clip for s in steps) / len(steps) if steps else math.nan


def table(runs: List[StudyRun]):
    reference: Dict[Tuple[str, str], StudyRun] = {}
    for run in runs:
        if run.strategy == "none" and run.param("lr_schedule.on_skip") == "hold":
            reference[(_workload(run), run.param("train.seed"))] = run
    groups: Dict[Tuple[str, str, str], List[StudyRun]] = {}
    for run in runs:
        key = (_workload(run), run.strategy, run.param("lr_schedule.on_skip", "hold"))
        groups.setdefault(key, []).append(run)
    # none skips nothing, so its advance must be its hold: checked, then shown once
    none_same = {}
    for workload in {w for w, strategy, _ in groups if strategy == "none"}:
        by_seed = lambda rs: sorted(rs, key=lambda r: r.param("train.seed"))  # noqa: E731
        advance = groups.pop((workload, "none", "advance"), [])
        hold = groups.get((workload, "none", "hold"), [])
        none_same[workload] = len(advance) == len(hold) and all(
            a.series("loss") == b.series("loss") and a.series("lr") == b.series("lr")
            for a, b in zip(by_seed(advance), by_seed(hold)))
    rows = []
    for (workload, strategy, on_skip), mine in sorted(groups.items()):
        clip = float(mine[0].param("optimizer.clip_grad_norm", "nan"))
        rows.append({
            "workload": workload,
            "strategy": strategy,
            "on_skip": on_skip if strategy != "none" else
            ("hold = advance" if none_same.get(workload) else "hold (advance differs)"),
            "seeds": len(mine),
            "skipped_updates": spread([r.metrics.get("skipped_steps", math.nan) for r in mine]),
            "schedule_drift_steps": spread([
                drift(r, reference[(workload, r.param("train.seed"))])
                if (workload, r.param("train.seed")) in reference else math.nan for r in mine]),
            "clipped_fraction": spread([_mean(r.history("clipped").values()) for r in mine]),
            "clipped_if_scaled_fraction": spread([_scaled_clips(r, clip) for r in mine]),
            "eval_loss": spread([r.metrics.get("eval_loss", math.nan) for r in mine]),
            "eval_accuracy": spread([r.metrics.get("eval_accuracy", math.nan) for r in mine]),
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
            run = min(row["_runs"], key=lambda r: r.param("train.seed"))  # the first seed's curves
            label = f"{row['strategy']} {row['on_skip']}"
            lr = run.history("lr")
            steps = sorted(lr)
            style = dict(linestyle="--" if row["on_skip"] == "advance" else "-", linewidth=1)
            ax_lr.plot(steps, [lr[s] for s in steps], label=label, **style)
            loss = run.history("loss")
            ax_loss.plot(sorted(loss), [loss[s] for s in sorted(loss)], label=label, **style)
        ax_lr.set_title(f"{workload} (seed 1)", fontsize=9)
        ax_lr.set_ylabel("learning rate used")
        ax_loss.set_ylabel("training loss")
        ax_loss.set_xlabel("step")
        ax_lr.legend(fontsize=7, loc="upper right")
    fig.suptitle("AdamW, warm-up + cosine, clip 1.0, amp O2:\na skipped update holds (solid) or advances "
                 "(dashed) the schedule", fontsize=10)
    return fig
