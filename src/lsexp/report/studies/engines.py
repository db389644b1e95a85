"""engine=cell against engine=functional, strategy by strategy.

Each strategy runs once under each engine with the same seed, data and injected overflows. The table
pairs the two runs: whether the overflow flags and the scale columns are identical, the largest
difference between their losses, and each engine's speed: steps per second of training after the
first epoch (which holds the compilation), from the runs' own epoch_seconds, measured in the same
sweep, the two engines' jobs one right after the other.
"""

from __future__ import annotations

import csv
import json
from typing import Dict, List, Optional

from lsexp.report.studies import StudyRun, log2

COLUMNS = ["strategy", "steps", "same_overflows", "same_scales", "max_loss_difference", "skipped_steps",
           "final_loss_scale", "eval_accuracy", "cell_steps_per_second", "functional_steps_per_second",
           "functional_speed_ratio"]


def _engine(run: StudyRun) -> str:
    return run.param("engine.name", "cell")


def steady_speed(run: StudyRun) -> Optional[float]:
    """Steps per second over the epochs after the first; None for a run of one epoch."""
    summary, history = run.artifact("summary.json"), run.artifact("history.csv")
    if summary is None or history is None:
        return None
    seconds = json.loads(summary.read_text()).get("epoch_seconds", [])[1:]
    with open(history, newline="") as f:
        steps = sum(1 for row in csv.DictReader(f) if int(row["epoch"]) >= 2)
    return steps / sum(seconds) if seconds and sum(seconds) > 0 else None


def table(runs: List[StudyRun]):
    pairs: Dict[str, Dict[str, StudyRun]] = {}
    for run in runs:
        pairs.setdefault(run.label_without("engine"), {})[_engine(run)] = run
    rows = []
    for setting, pair in pairs.items():
        cell, functional = pair.get("cell"), pair.get("functional")
        if cell is None or functional is None:
            continue
        a, b = cell.history("loss"), functional.history("loss")
        common = sorted(set(a) & set(b))
        row = {"strategy": cell.strategy, "setting": setting, "steps": len(common),
               "same_overflows": cell.series("overflow") == functional.series("overflow"),
               "same_scales": cell.series("loss_scale") == functional.series("loss_scale"),
               "max_loss_difference": max((abs(a[s] - b[s]) for s in common), default=float("nan")),
               "skipped_steps": int(cell.metrics.get("skipped_steps", 0)),
               "final_loss_scale": cell.metrics.get("final_loss_scale", float("nan")),
               "eval_accuracy": cell.metrics.get("eval_accuracy", float("nan")),
               "cell_steps_per_second": steady_speed(cell) or float("nan"),
               "functional_steps_per_second": steady_speed(functional) or float("nan"),
               "_pair": (cell, functional)}
        row["functional_speed_ratio"] = row["functional_steps_per_second"] / row["cell_steps_per_second"]
        rows.append(row)
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    fig, axes = plt.subplots(2, len(rows), figsize=(3.6 * max(len(rows), 1), 6), squeeze=False, sharex=True)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.87, bottom=0.09, hspace=0.12, wspace=0.3)
    for col, row in enumerate(rows):
        ax_loss, ax_scale = axes[0][col], axes[1][col]
        for run, style in zip(
            row["_pair"], (dict(linewidth=2.5, alpha=0.4), dict(linewidth=1, linestyle="--"))
        ):
            loss, scale = run.history("loss"), run.history("loss_scale")
            steps = sorted(loss)
            ax_loss.plot(steps, [loss[s] for s in steps], label=_engine(run), **style)
            ax_scale.plot(steps, [log2(scale[s]) for s in steps], drawstyle="steps-post", **style)
        ax_loss.set_title(
            f"{row['strategy']}\nidentical: {row['same_scales'] and row['same_overflows']}", fontsize=9
        )
        ax_scale.set_xlabel("step")
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_ylabel("log2 loss scale")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("engine=cell (solid) against engine=functional (dashed): the same steps")
    return fig
