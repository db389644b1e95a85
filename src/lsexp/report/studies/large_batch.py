"""Loss scaling where it decides the outcome: the gradients of an N-token batch (train.mean_over_tokens)
under float32, float16 without a scale and each scaler (experiment=large_batch on the MLP,
experiment=large_batch_gpt on the GPT-style language model).

Per workload, N and arm (conf/arm/), over the seeds as mean ± std [95% interval] (Student's t, as the
sweep comparison has it):
- the held-out loss (eval_loss) and where its interval lies against float32's at the same N: `above`
  (wholly above: float16 lost), `overlaps` or `below`. A run whose held-out loss is not finite (it
  diverged) counts as above float32 and is named in `note`; the interval is then over the finite seeds;
- eval accuracy, the updates the scaler skipped, and the steps to the scale's first growth (`-` for an
  arm with no growth, `not within the run` where no seed's scale grew);
- per tapped layer, the fraction of its activation gradient that float16 loses at the step's scale
  (telemetry=layers: underflow_fraction + zero_fraction, the mean over the steps that did not overflow,
  then over the seeds). float32's row is the reference: its zeros are the ones the model makes itself,
  and its underflow what float16 would flush.

bfloat16 is an arm (conf/arm/bfloat16: amp O2, no loss scale); where a sweep does not run it, it is probed
per workload, as in experiment=scalers (scalers.bfloat16_note), and shown as a row.
The figure: held-out loss against N per arm, the mean with its 95% band, float32's band across the plot.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from typing import Callable, Dict, List, Optional

import numpy as np

from lsexp.report.studies import StudyRun, finished_cells, log2, loss_cells, over_seeds
from lsexp.report.studies.scalers import arm, bfloat16_note, swept_bfloat16, workload

ARMS = ["float32", "none", "bfloat16", "fixed_drop_256", "fixed_drop_65536", "dynamic",
        "dynamic_hysteresis", "amax_history_margin0"]
REFERENCE = "float32"
# the arms whose scale never grows
NO_GROWTH = {"float32", "none", "bfloat16", "fixed_drop_256", "fixed_drop_65536"}
NOT_GROWN = "not within the run"
COLUMNS = ["workload", "N", "K", "arm", "dtype", "seeds", "eval_loss", "vs_float32", "eval_accuracy",
           "skipped_updates", "steps_to_first_growth", "lost_fraction_by_layer", "note"]


def tokens(run: StudyRun) -> Optional[int]:
    """train.mean_over_tokens, or None for the batch's own count."""
    value = run.param("train.mean_over_tokens", "None")
    return None if value in ("None", "null", "") else int(float(value))


def divisor(run: StudyRun) -> float:
    return float(run.param("train.gradient_divisor", "1"))


def batch_tokens(runs: List[StudyRun]) -> Dict[str, float]:
    """T per workload: N / K of a run with the key (exact), else the batch size times the sequence length
    for a language model."""
    found: Dict[str, float] = {}
    for run in runs:
        if tokens(run) is not None:
            found.setdefault(workload(run), tokens(run) / divisor(run))
    for run in runs:
        if workload(run) not in found:
            per_sample = float(run.param("dataset.seq_len", 1)) if run.param("dataset.task") == "lm" else 1.0
            found[workload(run)] = float(run.param("dataset.batch_size", 1)) * per_sample
    return found


def first_growth(run: StudyRun) -> Optional[int]:
    """The first step whose loss scale is above the step before's."""
    scale = run.history("loss_scale")
    steps = sorted(scale)
    return next((s for p, s in zip(steps, steps[1:]) if scale[s] > scale[p]), None)


def layer_means(run: StudyRun, value_of: Callable[[Dict[str, str]], float]) -> Dict[str, float]:
    """Per tapped layer, the mean of value_of(its row of telemetry/layers.csv) over the steps that did not
    overflow, where that value is finite; empty for a run without the table."""
    path = run.artifact("telemetry/layers.csv")
    if path is None:
        return {}
    values: Dict[str, List[float]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["overflow"] in ("1", "True"):
                continue
            value = value_of(row)
            if math.isfinite(value):
                values[row["layer"]].append(value)
    return {layer: float(np.mean(v)) for layer, v in values.items()}


def lost_by_layer(run: StudyRun) -> Dict[str, float]:
    """Per tapped layer, the mean over the steps that did not overflow of underflow + zero fraction."""
    return layer_means(run, lambda row: float(row["underflow_fraction"]) + float(row["zero_fraction"]))


def n_label(n: Optional[int], t: float) -> str:
    value = t if n is None else n
    power = log2(value)
    name = f"2^{power:g}" if power == int(power) else f"{value:g}"
    return f"T = {name}" if n is None else name


def _layers_cell(runs: List[StudyRun]) -> str:
    per_seed = [lost_by_layer(r) for r in runs]
    layers = list(dict.fromkeys(name for seed in per_seed for name in seed))
    return "; ".join(f"{name} {np.mean([s[name] for s in per_seed if name in s]):.3f}" for name in layers)


def _growth_cell(name: str, runs: List[StudyRun]) -> str:
    if name in NO_GROWTH:
        return "-"
    grown = [first_growth(r) for r in runs]
    steps = [float(s) for s in grown if s is not None]
    if not steps:
        return NOT_GROWN
    missing = len(grown) - len(steps)
    return over_seeds(steps) + (f"; {missing} of {len(grown)} {NOT_GROWN}" if missing else "")


def _order(key):
    name, n, arm_name = key
    return (name, -1 if n is None else n, ARMS.index(arm_name) if arm_name in ARMS else len(ARMS), arm_name)


def cells(runs: List[StudyRun]) -> Dict[tuple, List[StudyRun]]:
    """The runs that ended by (workload, N, arm), in the table's order, each cell's runs by seed."""
    return finished_cells(runs, lambda r: (workload(r), tokens(r), arm(r)), _order)


def table(runs: List[StudyRun]):
    t = batch_tokens(runs)
    grouped = cells(runs)
    losses = loss_cells(grouped)
    rows = []
    for key, mine in grouped.items():
        name, n, arm_name = key
        cell = losses[key]
        notes = [cell.note] if cell.diverged else []
        notes += [f"seed {r.seed} diverged at step {int(r.metrics['diverged_at_step'])}"
                  for r in mine if "diverged_at_step" in r.metrics]
        rows.append({
            "workload": name,
            "N": n_label(n, t[name]),
            "K": divisor(mine[0]),
            "arm": arm_name,
            "dtype": "float32" if mine[0].param("amp.level") == "O0" else mine[0].param("amp.dtype"),
            "seeds": len(mine),
            "eval_loss": cell.interval.cell(),
            "vs_float32": "" if arm_name == REFERENCE else cell.versus(losses.get((name, n, REFERENCE))),
            "eval_accuracy": over_seeds(r.metrics.get("eval_accuracy", math.nan) for r in mine),
            "skipped_updates": over_seeds(float(r.metrics.get("skipped_steps", 0)) for r in mine),
            "steps_to_first_growth": _growth_cell(arm_name, mine),
            "lost_fraction_by_layer": _layers_cell(mine),
            "note": "; ".join(notes),
            "_n": float(t[name] if n is None else n),
            "_interval": cell.interval,
            "_diverged": len(cell.diverged),
        })
    for name in sorted({workload(r) for r in runs}):
        mine = [r for r in runs if workload(r) == name]
        if swept_bfloat16(mine):
            continue
        position = max(i for i, r in enumerate(rows) if r["workload"] == name) + 1
        rows.insert(position, {"workload": name, "arm": "none", "dtype": "bfloat16", "seeds": 0,
                               "note": bfloat16_note(mine)})
    return rows, COLUMNS


def figure(plt, runs: List[StudyRun], rows):
    rows = [r for r in rows if "_interval" in r]
    names = sorted({r["workload"] for r in rows})
    arms = sorted({r["arm"] for r in rows}, key=lambda a: (ARMS.index(a) if a in ARMS else len(ARMS), a))
    colours = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(arms)}
    fig, axes = plt.subplots(1, len(names), figsize=(max(8, 7 * len(names)), 5.5), squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.24, wspace=0.2)
    for ax, name in zip(axes[0], names):
        mine = [r for r in rows if r["workload"] == name]
        reference = [r["_interval"] for r in mine if r["arm"] == REFERENCE and r["_interval"].n > 1]
        if reference:  # float32's band, the same at every N (its histories are), drawn across the plot
            low, high = min(i.low for i in reference), max(i.high for i in reference)
            ax.axhspan(low, high, color=colours[REFERENCE], alpha=0.25, label=f"{REFERENCE} (95% band)")
        for a in arms:
            points = sorted((r["_n"], r["_interval"], r["_diverged"]) for r in mine if r["arm"] == a)
            if not points or a == REFERENCE:
                continue
            x = [log2(p[0]) for p in points]
            y = [p[1].mean for p in points]
            ax.plot(x, y, marker="o", color=colours[a], label=a, linewidth=1.3)
            ax.fill_between(x, [p[1].low for p in points], [p[1].high for p in points], color=colours[a],
                            alpha=0.15, linewidth=0)
            for xi, p in zip(x, points):
                if p[2]:
                    ax.annotate(f"{p[2]} diverged", (xi, p[1].mean if p[1].n else 0), fontsize=7,
                                color=colours[a])
        ax.set_yscale("log")
        ax.set_xlabel("log2 N: the tokens the loss is a mean over (the leftmost is the batch's own)")
        ax.set_ylabel("held-out loss (eval_loss)")
        ax.set_title(f"{name}: held-out loss against N, mean and 95% interval over seeds", fontsize=9)
    handles = {}
    for ax in axes[0]:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 4),
               fontsize=8)
    fig.suptitle("float16 with and without loss scaling as the batch's tokens grow (amp O2; float32 at O0)",
                 fontsize=11)
    return fig
