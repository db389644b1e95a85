"""The loss scalers side by side, at amp O2 with two bursts of injected overflows: MindSpore's dynamic
and fixed managers, DeepSpeed's and Megatron's hysteresis, MindFormers' adaptive window, the amax
history with margins 0 and 2, against float16 without a scale and bfloat16.

Per arm (conf/arm/) and workload (a group: the choices but the seed), over the seeds as mean ± std
[95% interval] (lsexp.report.groups, as the sweep comparison has it):
- the skipped updates, split into the initial back-off (before the scale first grows and before the
  first burst: the descent from the initial scale), the bursts (the injected steps) and the others
  (mostly what the scaler's own growth overflowed);
- the median and 10th percentile of headroom_log2, log2(65504 / max|S*g|) per step, and the means of
  underflow_fraction and zero_fraction, all over the steps that did not overflow (an overflowed step
  has no headroom: its value is NaN). At O2 the gradients are float16, so what underflows is already
  zero: underflow_fraction (non-zero and below 2^-24) stays near 0, and what a scale saves shows as
  fewer zeros;
- the steps after each burst that ran below the scale the burst interrupted (dynamic_window's recovery);
- the final eval accuracy and loss;
- the time per training step against the `dynamic` run of the same workload and seed: the inverse ratio
  of their steps per second over the epochs after the first (engines.steady_speed, from summary.json's
  epoch_seconds: the first epoch holds the compilation, and evaluation is not in them);
- in `note`, a run that diverged or collapsed, and that `none` ran without the bursts.

bfloat16 is not swept, since a job that preflight refuses ends a basic sweep: its row per workload
probes that workload's run config (its config.yaml, with amp.dtype=bfloat16) as preflight does, and
shows the refusal, or that it runs, in `note`. `none` (float16) runs without the bursts: an injected
non-finite gradient that no scaler skips ends the run.
"""

from __future__ import annotations

import csv
import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from lsexp.report.studies import StudyRun, by_group, log2, over_seeds
from lsexp.report.studies.dynamic_window import bursts, injected_steps, recovery
from lsexp.report.studies.engines import steady_speed

# the arms in the table's order; an arm the sweep adds goes after them
ARMS = ["dynamic", "dynamic_hysteresis", "megatron", "adaptive_window", "amax_history_margin0",
        "amax_history_margin2", "fixed_drop_128", "fixed_drop_65536", "none"]
COLUMNS = ["workload", "arm", "dtype", "seeds", "skipped_initial_backoff", "skipped_bursts", "skipped_other",
           "headroom_log2_median", "headroom_log2_p10", "mean_underflow_fraction", "mean_zero_fraction",
           "recovery_burst1", "recovery_burst2", "eval_accuracy", "eval_loss", "step_time_vs_dynamic", "note"]
NOT_RECOVERED = "not within the run"


def _override(run: StudyRun, key: str) -> Optional[str]:
    for token in run.tags.get("lsexp.overrides", run.label).split():
        if token.startswith(f"{key}="):
            return token.split("=", 1)[1]
    return None


def arm(run: StudyRun) -> str:
    """The run's conf/arm option; its strategy when the sweep did not name one."""
    return _override(run, "arm") or run.strategy


def workload(run: StudyRun) -> str:
    return _override(run, "workload") or run.tags.get("lsexp.model", "-")


def _history_csv(run: StudyRun) -> List[Dict[str, str]]:
    path = run.artifact("history.csv")
    if path is None:
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def descent_end(run: StudyRun) -> float:
    """The first step whose scale is above the step before's (the first growth), or the first burst's
    first step if that comes sooner: until then the scale has only come down from its initial value."""
    scale = run.history("loss_scale")
    steps = sorted(scale)
    grown = next((s for p, s in zip(steps, steps[1:]) if scale[s] > scale[p]), math.inf)
    return min(grown, min(injected_steps(run), default=math.inf))


def skipped_split(run: StudyRun) -> Tuple[int, int, int]:
    """(initial back-off, bursts, other): the updates the run skipped, from history.csv's running count,
    before descent_end, at the injected steps, and elsewhere (mostly after the scaler's own growth)."""
    injected, end = set(injected_steps(run)), descent_end(run)
    split, before = [0, 0, 0], 0
    for row in _history_csv(run):
        step, count = int(row["step"]), int(row["skipped_steps"])
        if count > before:
            split[0 if step < end else 1 if step in injected else 2] += count - before
        before = count
    return split[0], split[1], split[2]


def clean_values(run: StudyRun, key: str) -> List[float]:
    """A telemetry column over the steps that did not overflow."""
    overflow, values = run.history("overflow"), run.history(key)
    return [v for s, v in sorted(values.items()) if not overflow.get(s) and math.isfinite(v)]


def _percentile(values: List[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def _mean(values: List[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _recoveries(runs: List[StudyRun]) -> List[str]:
    """Per burst, the steps below the interrupted scale over the seeds."""
    found: Dict[int, List[Optional[int]]] = {}
    for run in runs:
        scale = run.history("loss_scale")
        for i, (first, last) in enumerate(bursts(injected_steps(run))):
            if scale.get(first - 1) is not None:
                found.setdefault(i, []).append(recovery(scale, first, last))
    cells = []
    for i in range(2):
        values = found.get(i, [])
        back = [float(n) for n in values if n is not None]
        missing = len(values) - len(back)
        if not values:
            cells.append("")
        elif not back:
            cells.append(NOT_RECOVERED)
        else:
            lost = f"; {missing} of {len(values)} {NOT_RECOVERED}" if missing else ""
            cells.append(over_seeds(back) + lost)
    return cells


def swept_bfloat16(runs: List[StudyRun]) -> bool:
    """Whether the sweep ran bfloat16 itself (conf/arm/bfloat16): then its rows are its own, not a
    probe's note."""
    return any(r.param("amp.dtype") == "bfloat16" and r.param("amp.level") != "O0" for r in runs)


def bfloat16_note(runs: List[StudyRun]) -> str:
    """What preflight says of this workload in bfloat16: the refusal's line, or that it runs (emulated on
    a CPU at O2 and O3, where preflight probes nothing). Probed from the logged config of the workload's
    `none` run (another arm's when there is none: the probe's one forward and backward pass does not
    involve the scaler), with amp.dtype=bfloat16."""
    from omegaconf import OmegaConf

    from lsexp import amp
    from lsexp.training.probes import bfloat16_refusal

    run = min(runs, key=lambda r: (arm(r) != "none", r.seed))
    path = run.artifact("config.yaml")
    if path is None:
        return "not probed: the run logged no config.yaml"
    cfg = OmegaConf.load(path)
    cfg.amp.dtype = "bfloat16"
    target = cfg.device.device_target
    if amp.emulates(cfg.amp, target):  # as preflight: nothing to probe where lsexp emulates it
        return f"amp.dtype=bfloat16 runs on {target}, emulated (docs/casts.md) (not swept)"
    return bfloat16_refusal(cfg) or f"amp.dtype=bfloat16 runs on {target} (not swept)"


def _note(runs: List[StudyRun]) -> str:
    notes = [f"seed {r.seed} diverged at step {int(r.metrics['diverged_at_step'])}"
             for r in runs if "diverged_at_step" in r.metrics]
    notes += [f"seed {r.seed} collapsed at step {int(r.metrics['collapsed_at_step'])}"
              for r in runs if "collapsed_at_step" in r.metrics]
    if all(r.strategy == "none" and not injected_steps(r) for r in runs):
        notes.insert(0, "no bursts: without a scaler they would end the run")
    return "; ".join(notes)


def _order(mine: List[StudyRun]) -> tuple:
    name = arm(mine[0])
    return (workload(mine[0]), ARMS.index(name) if name in ARMS else len(ARMS), name)


def table(runs: List[StudyRun]):
    speed = {(workload(r), r.seed, arm(r)): steady_speed(r) for r in runs}
    rows = []
    for mine in sorted(by_group(runs).values(), key=_order):
        key = (workload(mine[0]), arm(mine[0]))
        splits = [skipped_split(r) for r in mine]
        headroom = [clean_values(r, "headroom_log2") for r in mine]
        ratios = []
        for r in mine:
            base, own = speed.get((key[0], r.seed, "dynamic")), speed[(key[0], r.seed, arm(r))]
            ratios.append(base / own if base and own else math.nan)
        first, second = _recoveries(mine)
        rows.append({
            "workload": key[0],
            "arm": key[1],
            "dtype": mine[0].param("amp.dtype", "float16"),
            "seeds": len(mine),
            "skipped_initial_backoff": over_seeds([float(s[0]) for s in splits]),
            "skipped_bursts": over_seeds([float(s[1]) for s in splits]),
            "skipped_other": over_seeds([float(s[2]) for s in splits]),
            "headroom_log2_median": over_seeds([_percentile(h, 50) for h in headroom]),
            "headroom_log2_p10": over_seeds([_percentile(h, 10) for h in headroom]),
            "mean_underflow_fraction": over_seeds(_mean(clean_values(r, "underflow_fraction")) for r in mine),
            "mean_zero_fraction": over_seeds([_mean(clean_values(r, "zero_fraction")) for r in mine]),
            "recovery_burst1": first,
            "recovery_burst2": second,
            "eval_accuracy": over_seeds([r.metrics.get("eval_accuracy", math.nan) for r in mine]),
            "eval_loss": over_seeds([r.metrics.get("eval_loss", math.nan) for r in mine]),
            "step_time_vs_dynamic": over_seeds(ratios),
            "note": _note(mine),
            "_runs": mine,
            "_skipped": [sum(s) for s in splits],
            "_headroom": [_percentile(h, 50) for h in headroom],
        })
    for name in sorted({workload(r) for r in runs}):
        position = max(i for i, r in enumerate(rows) if r["workload"] == name) + 1
        rows.insert(position, {
            "workload": name, "arm": "none", "dtype": "bfloat16", "seeds": 0,
            "note": bfloat16_note([r for r in runs if workload(r) == name]),
        })
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    rows = [r for r in rows if r.get("_runs")]
    names = sorted({r["workload"] for r in rows})
    arms = sorted({r["arm"] for r in rows}, key=lambda a: (ARMS.index(a) if a in ARMS else len(ARMS), a))
    colours = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(arms)}
    markers = {a: "osD^v<>ph*"[i % 10] for i, a in enumerate(arms)}
    fig, axes = plt.subplots(2, len(names), figsize=(max(10, 7 * len(names)), 9.5), squeeze=False)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.92, bottom=0.15, hspace=0.32, wspace=0.18)
    for col, name in enumerate(names):
        ax_scale, ax_cost = axes[0][col], axes[1][col]
        mine = [r for r in rows if r["workload"] == name]
        for row in mine:
            colour, run = colours[row["arm"]], row["_runs"][0]
            scale = run.history("loss_scale")
            steps = sorted(scale)
            ax_scale.plot(steps, [log2(scale[s]) for s in steps], drawstyle="steps-post", linewidth=1.2,
                          color=colour, marker=markers[row["arm"]], markevery=[len(steps) - 1],
                          label=row["arm"])
            x, y = row["_headroom"], row["_skipped"]
            ax_cost.errorbar(np.mean(x), np.mean(y), xerr=[[np.mean(x) - min(x)], [max(x) - np.mean(x)]],
                             yerr=[[np.mean(y) - min(y)], [max(y) - np.mean(y)]], fmt=markers[row["arm"]],
                             color=colour, markersize=7, capsize=3, alpha=0.85)
        for first, last in bursts(max((injected_steps(r["_runs"][0]) for r in mine), key=len)):
            ax_scale.axvspan(first - 0.5, last + 0.5, color="tab:red", alpha=0.25)
        seed = min(r["_runs"][0].seed for r in mine)
        ax_scale.set_title(f"{name}: loss scale, seed {seed} (red: injected bursts)", fontsize=9)
        ax_scale.set_ylabel("log2 loss scale")
        ax_scale.set_xlabel("step")
        ax_cost.set_title(f"{name}: headroom against skipped updates (mean and range over seeds)", fontsize=9)
        ax_cost.set_xlabel("median headroom_log2 over the steps without overflow")
        ax_cost.set_ylabel("skipped updates")
        ax_cost.margins(x=0.15, y=0.1)
    handles = {}
    for ax in axes[0]:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend([handles[a] for a in arms if a in handles], [a for a in arms if a in handles],
               loc="lower center", ncol=min(len(handles), 5), fontsize=8, bbox_to_anchor=(0.5, 0.04))
    fig.suptitle("Loss scalers at amp O2, float16, with two bursts of injected overflows", fontsize=11)
    fig.text(0.07, 0.01, "headroom_log2 = log2(65504 / max|S·g|): powers of two below float16's overflow; "
             "the steps that overflowed (NaN) are left out. Each arm's marker ends its scale's line.",
             fontsize=8)
    return fig
