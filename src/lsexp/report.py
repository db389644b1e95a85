"""Figures and tables: one run's loss and loss scale, and a sweep's runs side by side.

`lsexp report NAME_OR_RUN_ID` redraws a sweep's comparison from the MLflow store alone.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Sequence

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
TABLE_COLUMNS = ("run", "choices", "status", "steps", "skipped_steps", "overflow_count", "final_loss",
                 "final_loss_scale", "diverged", "collapsed")
# With telemetry=grads: the means over the run's steps of what float16 loses or breaks.
TELEMETRY_COLUMNS = ("mean_underflow_fraction", "mean_overflow_fraction", "mean_zero_fraction")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _power_of_two(value: float, _pos=None) -> str:
    """2²⁴ rather than matplotlib's mathtext $2^{24}$, which costs ~30 ms a figure to lay out:
    the job waits for its run's figure."""
    exponent = math.log2(value) if value > 0 else math.nan
    return "2" + str(int(exponent)).translate(_SUPERSCRIPT) if exponent.is_integer() else f"{value:g}"


def _axes(plt, title: str, telemetry: bool = False):
    fig, axes = plt.subplots(3 if telemetry else 2, 1, sharex=True, figsize=(9, 8 if telemetry else 6))
    ax_loss, ax_scale = axes[0], axes[1]
    # fixed margins: constrained_layout costs more than the rest of the figure together
    fig.subplots_adjust(left=0.09, right=0.98, top=0.94, bottom=0.08, hspace=0.08)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title)
    # log2, so a fixed 128 and a dynamic 2^24 are both readable on one axis
    ax_scale.set_yscale("log", base=2)
    ax_scale.yaxis.set_major_formatter(_power_of_two)
    ax_scale.set_ylabel("loss scale (log2)")
    axes[-1].set_xlabel("step")
    if telemetry:
        axes[2].set_ylabel("underflow fraction")
        return fig, ax_loss, ax_scale, axes[2]
    return fig, ax_loss, ax_scale


def _smoothed(values: Sequence[float], span: int) -> List[float]:
    """An exponential moving average over about `span` steps, so overlapping noisy losses separate."""
    alpha, out, level = 2 / (span + 1), [], None
    for v in values:
        level = v if level is None or not math.isfinite(level) else level + alpha * (v - level)
        out.append(level)
    return out


def _draw(ax_loss, ax_scale, steps, loss, scale, overflow, label=None, color=None, smooth=False):
    if smooth and len(loss) > 20:  # the raw loss faint behind its moving average
        raw, = ax_loss.plot(steps, loss, color=color, linewidth=0.5, alpha=0.25)
        line, = ax_loss.plot(steps, _smoothed(loss, max(5, len(loss) // 10)), label=label, color=raw.get_color(),
                             linewidth=1.2)
    else:
        line, = ax_loss.plot(steps, loss, label=label, color=color, linewidth=1)
    ax_scale.plot(steps, scale, label=label, color=line.get_color(), linewidth=1, drawstyle="steps-post")
    marks = [i for i, flag in enumerate(overflow) if flag]
    if marks:
        ax_scale.plot([steps[i] for i in marks], [scale[i] for i in marks], "x", color=line.get_color(),
                      markersize=5, label=None if label else "overflow")


class RunFigure:
    """One run's loss and loss scale over steps. Laid out and drawn empty when made, which also
    loads matplotlib and its fonts, so that `save`, once the run's steps are in, has only the
    lines to add: ~45 ms instead of ~65 ms, and the job waits for it."""

    def __init__(self, title: str):
        self._plt = _pyplot()
        self.fig, self.ax_loss, self.ax_scale = _axes(self._plt, title)
        self.fig.canvas.draw()

    def save(self, rows: Sequence[Dict], path: Path) -> None:
        """Draw the rows, write the PNG and close the figure (so once per figure)."""
        _draw(self.ax_loss, self.ax_scale, [r["step"] for r in rows], [r["loss"] for r in rows],
              [r["loss_scale"] for r in rows], [r["overflow"] for r in rows])
        if any(r["overflow"] for r in rows):
            self.ax_scale.legend(loc="best", fontsize=8)
        self.fig.savefig(path, dpi=100)
        self._plt.close(self.fig)


# --- sweeps ------------------------------------------------------------------------------------
def _history(client, run_id: str, key: str) -> Dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _labels(children) -> List[str]:
    """Each child labelled by the overrides that differ across the sweep."""
    tokens = [set(c.data.tags.get("lsexp.overrides", "").split()) for c in children]
    common = set.intersection(*tokens) if tokens else set()
    labels = []
    for child, own in zip(children, tokens):
        differing = sorted(own - common)
        labels.append(" ".join(differing) or child.info.run_name)
    return labels


def sweep_children(client, parent_run_id: str):
    from mlflow.entities import ViewType

    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              run_view_type=ViewType.ALL, order_by=["attributes.start_time ASC"])


def sweep_report(client, parent_run_id: str, out: Path):
    """Write comparison.png, comparison.csv and comparison.md for a sweep; returns its child runs."""
    children = sweep_children(client, parent_run_id)
    out.mkdir(parents=True, exist_ok=True)
    labels = _labels(children)
    telemetry = any("underflow_fraction" in c.data.metrics for c in children)
    columns = TABLE_COLUMNS + (TELEMETRY_COLUMNS if telemetry else ())
    plt = _pyplot()
    fig, ax_loss, ax_scale, *ax_under = _axes(plt, f"sweep {client.get_run(parent_run_id).info.run_name}", telemetry)
    rows = []
    for child, label in zip(children, labels):
        loss, scale, overflow = (_history(client, child.info.run_id, k) for k in ("loss", "loss_scale", "overflow"))
        steps = sorted(loss)
        if steps:
            _draw(ax_loss, ax_scale, steps, [loss[s] for s in steps], [scale.get(s, float("nan")) for s in steps],
                  [overflow.get(s, 0) for s in steps], label=label, smooth=True)
        m = child.data.metrics
        rows.append({
            "run": child.info.run_name, "choices": label, "status": child.info.status,
            "steps": max(steps) if steps else 0,
            "skipped_steps": _num(m.get("skipped_steps")), "overflow_count": _num(m.get("overflow_count")),
            "final_loss": _num(m.get("final_loss")), "final_loss_scale": _num(m.get("final_loss_scale")),
            "diverged": child.data.tags.get("lsexp.diverged", ""),
            "collapsed": child.data.tags.get("lsexp.collapsed", ""),
        })
        if telemetry:
            for key in ("underflow_fraction", "overflow_fraction", "zero_fraction"):
                series = _history(client, child.info.run_id, key)
                rows[-1][f"mean_{key}"] = _num(sum(series.values()) / len(series)) if series else ""
                if key == "underflow_fraction" and series:
                    ax_under[0].plot(sorted(series), [series[s] for s in sorted(series)], linewidth=1, label=label)
    if children:
        ax_loss.legend(loc="best", fontsize=8)
    fig.savefig(out / "comparison.png", dpi=100)
    plt.close(fig)
    write_table(out / "comparison", rows, columns)
    return children


def write_table(stem: Path, rows: Sequence[Dict], columns: Sequence[str], cell=str) -> None:
    """<stem>.csv with every value, and <stem>.md, a Markdown table of `columns` as cell() shows them."""
    with open(f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")


def _num(value):
    if value is None:
        return ""
    return int(value) if float(value).is_integer() else round(value, 6)


def _latest_sweep(client, experiment_name: str) -> str:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise LookupError(f"no experiment named {experiment_name!r} in this store")
    parents = client.search_runs([experiment.experiment_id], "tags.`lsexp.sweep` = 'true'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        raise LookupError(f"experiment {experiment_name!r} has no sweep; run one with python -m lsexp -m ...")
    return parents[0].info.run_id


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(
        prog="lsexp report",
        description="Redraw a sweep's comparison figure and table from the MLflow store, without re-running it.")
    parser.add_argument("sweep", help="a sweep's parent run id, or an experiment name (its latest sweep)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: MLflow's own, sqlite:///mlflow.db here)")
    parser.add_argument("--out", default=None, help="folder for the figure and tables (default: reports/<run id>)")
    args = parser.parse_args(list(argv))

    from lsexp.store import TrackingError, check_reachable, client_for, redact, resolve_uri, scrub

    uri = resolve_uri(args.tracking_uri)
    try:
        check_reachable(uri, "--tracking-uri")
        client = client_for(uri)
        run_id = args.sweep if re.fullmatch(r"[0-9a-f]{32}", args.sweep) else _latest_sweep(client, args.sweep)
        out = Path(args.out or Path("reports") / run_id)
        children = sweep_report(client, run_id, out)
        study = client.get_run(run_id).data.tags.get("lsexp.study")
        if study and children:
            from lsexp import studies

            studies.write(study, client, children, _labels(children), out)
    except (TrackingError, LookupError) as err:
        print(f"lsexp report: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # e.g. an unknown run id: MLflow's RESOURCE_DOES_NOT_EXIST
        print(f"lsexp report: {args.sweep} in {redact(uri)}: {scrub(str(err).splitlines()[0], uri)}", file=sys.stderr)
        return 2
    print(f"{len(children)} runs of sweep {run_id} -> {out}/comparison.png, comparison.csv, comparison.md")
    print((out / "comparison.md").read_text(), end="")
    if study and children:
        print(f"study {study} -> {out}/{study}.png, {study}.csv, {study}.md")
        print((out / f"{study}.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
