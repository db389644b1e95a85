"""No loss scaling against dynamic and fixed scaling in float16 (amp O3), with gradient telemetry.

In float16 a gradient that flushes to zero is recorded as zero, so what no scaling loses shows as
extra zeros. At step 1 every run has the same weights and the same batch (same seed), so the
step-1 zero fraction of `none` minus that of the scaled runs with the same other choices is the
share of gradient elements that no scaling lost, measured, not estimated. Each group of seeds (the
choices but the seed) then has a row of each column's mean ± std [95% interval] over its seeds.
"""

from __future__ import annotations

from typing import Dict, List

from lsexp.figures import smoothed
from lsexp.report.groups import Interval
from lsexp.report.studies import StudyRun, by_group, over_seeds
from lsexp.strategies.none_schema import NoScaling

COLUMNS = ["choices", "eval_accuracy", "final_loss", "skipped_steps", "step1_zero_fraction",
           "mean_zero_fraction", "lost_at_step1"]


def table(runs: List[StudyRun]):
    rows = []
    for run in runs:
        zero = run.history("zero_fraction")
        rows.append({"choices": run.label, "setting": run.label_without("loss_scale"),
                     "panel": run.label_without("loss_scale", "train.seed"), "strategy": run.strategy,
                     "eval_accuracy": run.metrics.get("eval_accuracy", float("nan")),
                     "final_loss": run.metrics.get("final_loss", float("nan")),
                     "skipped_steps": int(run.metrics.get("skipped_steps", 0)),
                     "step1_overflow": bool(run.history("overflow").get(1)),
                     "step1_zero_fraction": zero.get(1, float("nan")),
                     "mean_zero_fraction": sum(zero.values()) / len(zero) if zero else float("nan")})
    # The reference is a scaled run whose step 1 did not overflow (dynamic's 2^24 usually does).
    scaled: Dict[str, float] = {}
    for row in rows:
        if (
            row["strategy"] != NoScaling.name
            and not row["step1_overflow"]
            and row["step1_zero_fraction"] == row["step1_zero_fraction"]
        ):
            scaled[row["setting"]] = min(scaled.get(row["setting"], 1.0), row["step1_zero_fraction"])
    for row in rows:
        row["lost_at_step1"] = (
            row["step1_zero_fraction"] - scaled[row["setting"]]
            if row["strategy"] == NoScaling.name and row["setting"] in scaled
            else ""
        )
    return rows + _over_seeds(runs, rows), COLUMNS


def _over_seeds(runs: List[StudyRun], rows) -> List[dict]:
    """Per group (the choices but the seed) of two seeds or more, each column over its seeds."""
    row_of = {run.run_id: row for run, row in zip(runs, rows)}
    out = []
    for group, mine in by_group(runs).items():
        if len(mine) < 2:
            continue
        first = row_of[mine[0].run_id]
        out.append({"choices": f"{len(mine)} seeds: {group}", "panel": first["panel"],
                    "strategy": first["strategy"], "over_seeds": True,
                    **{key: over_seeds(row_of[r.run_id][key] for r in mine) for key in COLUMNS[1:]}})
    return out


def figure(plt, runs: List[StudyRun], rows):
    panels = list(dict.fromkeys(r["panel"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    colors = {s: f"C{i}" for i, s in enumerate(strategies)}
    fig, axes = plt.subplots(3, len(panels), figsize=(5 * len(panels), 9.5), squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.99, top=0.92, bottom=0.06, hspace=0.3, wspace=0.22)
    per_run = [r for r in rows if not r.get("over_seeds")]
    for col, panel in enumerate(panels):
        ax_zero, ax_loss, ax_acc = axes[0][col], axes[1][col], axes[2][col]
        for run, row in zip(runs, per_run):
            if row["panel"] != panel:
                continue
            zero, loss = run.history("zero_fraction"), run.history("loss")
            steps = sorted(zero)
            ax_zero.plot(
                steps, [zero[s] for s in steps], linewidth=0.8, color=colors[row["strategy"]], alpha=0.7
            )
            steps = sorted(loss)
            ax_loss.plot(
                steps,
                smoothed([loss[s] for s in steps], max(5, len(steps) // 10)),
                linewidth=1,
                color=colors[row["strategy"]],
                alpha=0.7,
            )
        for i, strategy in enumerate(strategies):
            accs = [r["eval_accuracy"] for r in per_run if r["panel"] == panel and r["strategy"] == strategy]
            if accs:
                iv = Interval.of(accs)
                error = [[iv.mean - iv.low], [iv.high - iv.mean]] if iv.n > 1 else None
                ax_acc.bar(i, iv.mean, yerr=error, capsize=4, color=colors[strategy], alpha=0.5)
                ax_acc.plot([i] * len(accs), accs, "o", color=colors[strategy])
        ax_acc.set_xticks(range(len(strategies)), strategies)
        ax_zero.set_title(panel, fontsize=9)
        ax_loss.set_xlabel("step")
    for strategy, color in colors.items():
        axes[0][0].plot([], [], color=color, label=strategy)
    axes[0][0].legend(fontsize=8, loc="best")
    axes[0][0].set_ylabel("zero fraction of gradient elements")
    axes[1][0].set_ylabel("loss (moving average)")
    axes[2][0].set_ylabel("final eval accuracy\n(dot: a seed; bar: mean, 95% interval)")
    fig.suptitle("float16 (amp O3): what no loss scaling loses, and what it costs")
    return fig
