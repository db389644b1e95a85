"""A sweep's runs side by side, read from the MLflow store: comparison.png, .csv and .md."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from lsexp.figures import Curve, axes, draw, pyplot, write_table
from lsexp.report.groups import (
    METRICS,
    TELEMETRY_METRICS,
    group_runs,
    grouped_rows,
    paired_rows,
    pairing,
)
from lsexp.tracking.resume import JOB_TAG, child_runs

TABLE_COLUMNS = ("run", "choices", "status", "steps", "skipped_steps", "overflow_count", "final_loss",
                 "final_loss_scale", "eval_loss", "diverged", "collapsed")
# With telemetry=grads: the means over the run's steps of what float16 loses or breaks.
TELEMETRY_COLUMNS = ("mean_underflow_fraction", "mean_overflow_fraction", "mean_zero_fraction")


# --- sweeps ------------------------------------------------------------------------------------
def _history(client, run_id: str, key: str) -> Dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def labels(children) -> List[str]:
    """Each child labelled by the overrides that differ across the sweep."""
    tokens = [set(c.data.tags.get("lsexp.overrides", "").split()) for c in children]
    common = set.intersection(*tokens) if tokens else set()
    return [" ".join(sorted(own - common)) or child.info.run_name for child, own in zip(children, tokens)]


def sweep_children(client, parent_run_id: str):
    """The sweep's current runs (a resumed sweep's superseded runs stay in the store, but their reruns
    speak for the jobs), in job order: a resumed sweep's reruns start after the jobs that had finished."""
    kept = child_runs(client, parent_run_id)
    return sorted(kept, key=lambda r: int(r.data.tags.get(JOB_TAG, len(kept))))


def sweep_report(client, parent_run_id: str, out: Path, baseline: Optional[str] = None):
    """Write comparison.png, comparison.csv and comparison.md for a sweep; returns its child runs.

    Runs that differ only in train.seed (the same `lsexp.group` tag) are one group: the table then has
    a row per group with each metric's mean, spread and interval (comparison_runs.* keeps the runs), the
    figure a mean loss per group, and with a baseline (a group, or some of a group's choices)
    comparison_paired.* holds every group's difference from its baseline group, seed by seed."""
    children = sweep_children(client, parent_run_id)
    names = labels(children)
    group_names = [c.data.tags.get("lsexp.group") or label for c, label in zip(children, names)]
    seeds = [c.data.tags.get("lsexp.seed", "") for c in children]
    grouped = len(set(group_names)) < len(children)
    if baseline is not None and not pairing(list(dict.fromkeys(group_names)), baseline):
        raise LookupError(f"baseline {baseline!r} pairs no group of this sweep with another; name one of "
                          "its groups, or some of their choices: "
                          + ", ".join(repr(g) for g in dict.fromkeys(group_names)))
    out.mkdir(parents=True, exist_ok=True)
    telemetry = any("underflow_fraction" in c.data.metrics for c in children)
    # telemetry=layers: each layer's means over its run (layer.<name>.<statistic>), in the runs' order
    layer_means = tuple(dict.fromkeys(k for c in children for k in c.data.metrics if k.startswith("layer.")))
    columns = TABLE_COLUMNS + (TELEMETRY_COLUMNS if telemetry else ()) + layer_means
    plt = pyplot()
    fig, ax_loss, ax_scale, *ax_under = axes(
        plt, f"sweep {client.get_run(parent_run_id).info.run_name}", telemetry
    )
    rows, curves, raw = [], [], []  # raw: the metrics unrounded, for the groups' statistics
    for child, label in zip(children, names):
        loss, scale, overflow = (
            _history(client, child.info.run_id, k) for k in ("loss", "loss_scale", "overflow")
        )
        steps = sorted(loss)
        curves.append((steps, loss, scale))
        if steps and not grouped:
            draw(
                ax_loss,
                ax_scale,
                Curve(
                    steps,
                    [loss[s] for s in steps],
                    [scale.get(s, float("nan")) for s in steps],
                    [overflow.get(s, 0) for s in steps],
                ),
                label=label,
                smooth=True,
            )
        m = child.data.metrics
        rows.append(_row(child, label, steps))
        raw.append({k: m.get(k) for k in METRICS + layer_means})
        rows[-1].update({k: num(m.get(k)) for k in layer_means})
        if telemetry:
            underflow = _telemetry_means(client, child.info.run_id, rows[-1], raw[-1])
            if underflow and not grouped:
                ax_under[0].plot(
                    sorted(underflow), [underflow[s] for s in sorted(underflow)], linewidth=1, label=label
                )
    groups = group_runs(raw, group_names, seeds)
    if grouped:
        _draw_groups(ax_loss, ax_scale, groups, group_names, curves)
    if children:
        ax_loss.legend(loc="best", fontsize=8)
    fig.savefig(out / "comparison.png", dpi=100)
    plt.close(fig)
    metrics = METRICS + (TELEMETRY_METRICS if telemetry else ()) + layer_means
    if grouped:
        for row, name, seed in zip(rows, group_names, seeds):
            row.update(group=name, seed=seed)
        write_table(out / "comparison_runs", rows, ("run", "group", "seed") + columns[2:])
        table = grouped_rows(groups, metrics)
        write_table(out / "comparison", table, [k for k in table[0] if k not in metrics],
                    md_columns=("group", "n", "seeds") + metrics)
    else:
        write_table(out / "comparison", rows, columns)
    if baseline is not None:
        _write_paired(out, groups, baseline, metrics)
    return children


def _write_paired(out: Path, groups, baseline: str, metrics) -> None:
    """comparison_paired.*: every group's difference from its baseline group, seed by seed; no files
    where no group has one."""
    table = paired_rows(groups, baseline, metrics)
    if table:
        write_table(out / "comparison_paired", table, [k for k in table[0] if k not in metrics],
                    md_columns=("group", "baseline", "n_pairs", "seeds") + metrics)


def _row(child, label: str, steps: List[int]) -> Dict:
    """The table's row of a run, but for the layers' and telemetry's means."""
    m = child.data.metrics
    return {
        "run": child.info.run_name,
        "choices": label,
        "status": child.info.status,
        "steps": max(steps) if steps else 0,
        "skipped_steps": num(m.get("skipped_steps")),
        "overflow_count": num(m.get("overflow_count")),
        "final_loss": num(m.get("final_loss")),
        "final_loss_scale": num(m.get("final_loss_scale")),
        "eval_accuracy": num(m.get("eval_accuracy")),
        "eval_loss": num(m.get("eval_loss")),
        "diverged": child.data.tags.get("lsexp.diverged", ""),
        "collapsed": child.data.tags.get("lsexp.collapsed", ""),
    }


def _telemetry_means(client, run_id: str, row: Dict, raw: Dict) -> Dict[int, float]:
    """With telemetry=grads: each fraction's mean over the run into its row (rounded) and raw; returns
    the underflow fraction by step, which the figure's third panel draws."""
    underflow = {}
    for key in ("underflow_fraction", "overflow_fraction", "zero_fraction"):
        series = _history(client, run_id, key)
        raw[f"mean_{key}"] = sum(series.values()) / len(series) if series else None
        row[f"mean_{key}"] = num(raw[f"mean_{key}"]) if series else ""
        if key == "underflow_fraction":
            underflow = series
    return underflow


def _draw_groups(ax_loss, ax_scale, groups, group_names, curves) -> None:
    """Each group's mean loss over its seeds with the min-max band around it, and every seed's scale
    thin in the group's colour."""
    import numpy as np

    by_group = {g.name: [c for c, name in zip(curves, group_names) if name == g.name] for g in groups}
    for group in groups:
        mine = [c for c in by_group[group.name] if c[0]]
        if not mine:
            continue
        steps = sorted(set.intersection(*(set(c[0]) for c in mine)))
        losses = np.array([[c[1][s] for s in steps] for c in mine], dtype=float)
        (line,) = ax_loss.plot(steps, np.nanmean(losses, axis=0), linewidth=1.2,
                               label=f"{group.name} (mean of {len(mine)})")
        ax_loss.fill_between(steps, np.nanmin(losses, axis=0), np.nanmax(losses, axis=0),
                             color=line.get_color(), alpha=0.2, linewidth=0)
        for seed_steps, _, scale in mine:
            ax_scale.plot(seed_steps, [scale.get(s, float("nan")) for s in seed_steps], linewidth=0.6,
                          color=line.get_color(), drawstyle="steps-post")
    ax_loss.fill_between([], [], [], color="grey", alpha=0.2, label="band: min to max over seeds")


def num(value):
    if value is None:
        return ""
    return int(value) if float(value).is_integer() else round(value, 6)
