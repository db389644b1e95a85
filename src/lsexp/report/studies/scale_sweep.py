"""A fixed loss scale (fixed_drop) swept from 2^0 to 2^24: the window between too small and too large.

Too small, and float16 flushes gradients to zero (seen as extra zeros, since in float16 a flushed
gradient is a zero); too large, and the scaled gradients overflow, so fixed_drop skips the step.
Per run the table has the held-out accuracy, the share of skipped steps, and the zero fraction at
step 1 (same weights and batch in every run) and over the run.
"""

from __future__ import annotations

from typing import List

from lsexp.report.studies import StudyRun, log2

COLUMNS = ["setting", "log2_scale", "eval_accuracy", "final_loss", "skipped_fraction", "step1_zero_fraction",
           "mean_zero_fraction", "mean_underflow_fraction"]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def table(runs: List[StudyRun]):
    rows = []
    for run in runs:
        zero = run.history("zero_fraction")
        overflow = run.history("overflow")
        rows.append(
            {
                "setting": run.label_without("loss_scale.loss_scale"),
                "log2_scale": log2(float(run.param("loss_scale.loss_scale", "nan"))),
                "eval_accuracy": run.metrics.get("eval_accuracy", float("nan")),
                "final_loss": run.metrics.get("final_loss", float("nan")),
                "skipped_fraction": _mean(overflow.values()),
                "step1_zero_fraction": zero.get(1, float("nan")),
                "mean_zero_fraction": _mean(zero.values()),
                "mean_underflow_fraction": _mean(run.history("underflow_fraction").values()),
            }
        )
    rows.sort(key=lambda r: (r["setting"], r["log2_scale"]))
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    fig, (ax_acc, ax_skip, ax_zero) = plt.subplots(3, 1, sharex=True, figsize=(9, 9))
    fig.subplots_adjust(left=0.1, right=0.98, top=0.94, bottom=0.07, hspace=0.1)
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting]
        x = [r["log2_scale"] for r in mine]
        # settings that coincide (O2 and O3 of a model without BatchNorm) stay visible: O3 dashed
        style = dict(marker="o", linestyle="--" if "O3" in setting else "-")
        (line,) = ax_acc.plot(x, [r["eval_accuracy"] for r in mine], label=setting, **style)
        ax_skip.plot(x, [r["skipped_fraction"] for r in mine], color=line.get_color(), **style)
        ax_zero.plot(x, [r["step1_zero_fraction"] for r in mine], color=line.get_color(), **style)
    ax_acc.set_ylabel("final eval accuracy")
    ax_acc.legend(fontsize=8, loc="best")
    ax_skip.set_ylabel("skipped steps (overflow)")
    ax_zero.set_yscale("symlog", linthresh=1e-5)  # ResNet's 10^-5 beside the MLP's 0.8
    ax_zero.set_ylabel("zero gradients at step 1")
    ax_zero.set_xlabel("log2 of the fixed loss scale S")
    ax_acc.set_title("fixed_drop from 2⁰ to 2²⁴: too small loses gradients, too large skips every step")
    return fig
