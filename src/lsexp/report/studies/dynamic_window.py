"""The dynamic scalers' two knobs, scale_window and scale_factor, from an initial scale of 2^24:
MindSpore's DynamicLossScaleManager, which backs off at every overflow, against dynamic_hysteresis,
which backs off at the second (DeepSpeed's hysteresis 2) and never grows past 2^24.

Per run: the updates skipped while the scale backs off from 2^24 at the start, the overflows that
the scaler's own growth causes afterwards, the steps spent at each scale, and for every burst of
injected overflows (inject.overflow_steps) the scale before it and how many steps after it the
scale took to get back there.
"""

from __future__ import annotations

from collections import Counter
from typing import List, Tuple

from lsexp.report.studies import StudyRun, log2

COLUMNS = [
    "strategy",
    "scale_window",
    "scale_factor",
    "initial_backoff_skipped",
    "later_overflows",
    "steps_at_each_scale",
    "recovery_after_bursts",
    "final_loss_scale",
    "eval_accuracy",
]


def bursts(steps: List[int]) -> List[Tuple[int, int]]:
    """Consecutive injected steps as (first, last)."""
    out: List[Tuple[int, int]] = []
    for s in sorted(steps):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def injected_steps(run: StudyRun) -> List[int]:
    value = run.param("inject.overflow_steps", "[]")
    return [int(s) for s in value.strip("[]").split(",") if s.strip()]


def recovery(scale: dict, first: int, last: int):
    """The steps after the burst that ran below the scale the burst interrupted (for a burst of b
    overflows and factor f that is about b*scale_window, when nothing else overflows); None when
    the scale is not back within the run."""
    before = scale.get(first - 1)
    if before is None:
        return None
    for step in sorted(s for s in scale if s > last):
        if scale[step] >= before:
            return step - last - 1
    return None


def table(runs: List[StudyRun]):
    rows = []
    for run in runs:
        scale, overflow = run.history("loss_scale"), run.history("overflow")
        steps = sorted(scale)
        injected = set(injected_steps(run))
        backoff = 0
        for s in steps:
            if not overflow.get(s):
                break
            backoff += 1
        later = sum(1 for s in steps[backoff:] if overflow.get(s) and s not in injected)
        at_scale = Counter(int(log2(scale[s])) for s in steps)
        recoveries = []
        for first, last in bursts(sorted(injected)):
            n = recovery(scale, first, last)
            before = scale.get(first - 1)
            recoveries.append(
                f"{first}-{last} from 2^{int(log2(before))}: "
                + (f"{n} steps below" if n is not None else "not within the run")
                if before
                else f"{first}-{last}: -"
            )
        rows.append(
            {
                "strategy": run.strategy,
                "scale_window": int(run.param("loss_scale.scale_window")),
                "scale_factor": int(run.param("loss_scale.scale_factor")),
                "initial_backoff_skipped": backoff,
                "later_overflows": later,
                "steps_at_each_scale": " ".join(f"2^{k}:{n}" for k, n in sorted(at_scale.items())),
                "recovery_after_bursts": "; ".join(recoveries),
                "final_loss_scale": run.metrics.get("final_loss_scale", float("nan")),
                "eval_accuracy": run.metrics.get("eval_accuracy", float("nan")),
                "_run": run,
            }
        )
    rows.sort(key=lambda r: (r["strategy"], r["scale_factor"], r["scale_window"]))
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    panels = sorted({(r["strategy"], r["scale_factor"]) for r in rows})
    fig, axes = plt.subplots(
        len(panels), 1, sharex=True, sharey=True, figsize=(10, 3.2 * len(panels)), squeeze=False
    )
    fig.subplots_adjust(
        left=0.08, right=0.98, top=1 - 0.25 / len(panels), bottom=0.3 / len(panels), hspace=0.15
    )
    for ax, (strategy, factor) in zip(axes[:, 0], panels):
        for row in (r for r in rows if (r["strategy"], r["scale_factor"]) == (strategy, factor)):
            scale = row["_run"].history("loss_scale")
            steps = sorted(scale)
            ax.plot(
                steps,
                [log2(scale[s]) for s in steps],
                drawstyle="steps-post",
                linewidth=1.2,
                label=f"scale_window {row['scale_window']}",
            )
            for first, last in bursts(injected_steps(row["_run"])):
                ax.axvspan(first - 0.5, last + 0.5, color="tab:red", alpha=0.25)
        ax.set_ylabel(f"log2 scale\n{strategy}, factor {factor}", fontsize=8)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1][0].set_xlabel("step (red: injected overflow bursts)")
    fig.suptitle("Dynamic loss scaling from 2²⁴, without and with hysteresis: back-off, growth and recovery")
    return fig
