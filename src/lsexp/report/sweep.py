"""A sweep's runs side by side, read from the MLflow store: comparison.png, .csv and .md."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from lsexp.figures import axes, draw, pyplot, write_table

TABLE_COLUMNS = ("run", "choices", "status", "steps", "skipped_steps", "overflow_count", "final_loss",
                 "final_loss_scale", "diverged", "collapsed")
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
    from mlflow.entities import ViewType

    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              run_view_type=ViewType.ALL, order_by=["attributes.start_time ASC"])


def sweep_report(client, parent_run_id: str, out: Path):
    """Write comparison.png, comparison.csv and comparison.md for a sweep; returns its child runs."""
    children = sweep_children(client, parent_run_id)
    out.mkdir(parents=True, exist_ok=True)
    names = labels(children)
    telemetry = any("underflow_fraction" in c.data.metrics for c in children)
    columns = TABLE_COLUMNS + (TELEMETRY_COLUMNS if telemetry else ())
    plt = pyplot()
    fig, ax_loss, ax_scale, *ax_under = axes(
        plt, f"sweep {client.get_run(parent_run_id).info.run_name}", telemetry
    )
    rows = []
    for child, label in zip(children, names):
        loss, scale, overflow = (
            _history(client, child.info.run_id, k) for k in ("loss", "loss_scale", "overflow")
        )
        steps = sorted(loss)
        if steps:
            draw(
                ax_loss,
                ax_scale,
                steps,
                [loss[s] for s in steps],
                [scale.get(s, float("nan")) for s in steps],
                [overflow.get(s, 0) for s in steps],
                label=label,
                smooth=True,
            )
        m = child.data.metrics
        rows.append(
            {
                "run": child.info.run_name,
                "choices": label,
                "status": child.info.status,
                "steps": max(steps) if steps else 0,
                "skipped_steps": num(m.get("skipped_steps")),
                "overflow_count": num(m.get("overflow_count")),
                "final_loss": num(m.get("final_loss")),
                "final_loss_scale": num(m.get("final_loss_scale")),
                "diverged": child.data.tags.get("lsexp.diverged", ""),
                "collapsed": child.data.tags.get("lsexp.collapsed", ""),
            }
        )
        if telemetry:
            for key in ("underflow_fraction", "overflow_fraction", "zero_fraction"):
                series = _history(client, child.info.run_id, key)
                rows[-1][f"mean_{key}"] = num(sum(series.values()) / len(series)) if series else ""
                if key == "underflow_fraction" and series:
                    ax_under[0].plot(
                        sorted(series), [series[s] for s in sorted(series)], linewidth=1, label=label
                    )
    if children:
        ax_loss.legend(loc="best", fontsize=8)
    fig.savefig(out / "comparison.png", dpi=100)
    plt.close(fig)
    write_table(out / "comparison", rows, columns)
    return children


def num(value):
    if value is None:
        return ""
    return int(value) if float(value).is_integer() else round(value, 6)
