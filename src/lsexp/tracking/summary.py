"""What the tracking worker makes of a finished job's folder: the run's summary metrics and tags from
summary.json, and its artifacts, the telemetry's among them.

Like the worker, which imports it first thing, it imports nothing of Hydra, MindSpore or numpy; mlflow
only when a run finishes, by when the worker has it loaded.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Optional

from lsexp.tracking.store import with_retry

ARTIFACTS = ("config.yaml", "history.csv", "summary.json", "loss_scale.png", "casts.csv")
SUMMARY_METRICS = ("skipped_steps", "final_loss", "final_loss_scale", "steps_per_second", "reference_loss",
                   "diverged_at_step", "collapsed_at_step", "clipped_steps")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def metrics(summary: dict) -> list:
    """The run's summary metrics, at its last step."""
    from mlflow.entities import Metric

    now, step = int(time.time() * 1000), summary.get("steps", 0)
    found = [Metric(key, float(summary[key]), now, step) for key in SUMMARY_METRICS
             if summary.get(key) is not None]
    if "overflow_steps" in summary:
        found.append(Metric("overflow_count", float(len(summary["overflow_steps"])), now, step))
    casts = summary.get("casts")
    if casts:  # amp.level=auto or a cast list: operators by the type they computed in (casts.csv)
        found += [Metric(f"casts.{dtype}_ops", float(n), now, step)
                  for dtype, n in casts["ops_by_dtype"].items()]
    for layer, means in (summary.get("layers") or {}).items():  # telemetry=layers: per-layer means
        found += [Metric(f"layer.{layer}.{key}", float(value), now, step)
                  for key, value in (means or {}).items() if math.isfinite(value)]
    return found


def tags(summary: dict, error: Optional[str]) -> list:
    """How the run ended (diverged, collapsed, the job's error) and what amp kept in float32."""
    from mlflow.entities import RunTag

    found = [
        RunTag("lsexp.diverged", str(bool(summary.get("diverged"))).lower()),
        RunTag("lsexp.collapsed", str(bool(summary.get("collapsed"))).lower()),
    ]
    casts = summary.get("casts")
    if casts:  # the cells a cast list or the level kept in float32, for the runs table
        found.append(RunTag("lsexp.float32_cells", ",".join(casts["float32_cells"])[:5000]))
    if error:
        found += [
            RunTag("lsexp.error", error[:5000]),
            RunTag("mlflow.note.content", f"Run failed: {error[:5000]}"),
        ]
    return found


def log_artifacts(client, run_id: str, out_dir: Path) -> None:
    """The job's records and the run's figure, those that exist."""
    for name in ARTIFACTS:
        if (out_dir / name).exists():
            with_retry(client.log_artifact, run_id, str(out_dir / name))


def tag_first_nonfinite(client, run_id: str, summary: dict) -> None:
    """Where the first inf or NaN appeared (layer/pass@step), if the job found one."""
    first = summary.get("first_nonfinite")
    if first:
        where = f"{first['layer']}/{first['pass']}" if first.get("layer") else first["pass"]
        with_retry(client.set_tag, run_id, "lsexp.first_nonfinite", f"{where}@{first['step']}")


def log_telemetry(client, run_id: str, out_dir: Path) -> None:
    """The telemetry's files under telemetry/, the histograms' PNGs drawn first."""
    for path in sorted(out_dir.glob("grad_hist_step*.csv")):  # drawn here, beside the job's teardown
        if not path.with_suffix(".png").exists():
            from lsexp.training.telemetry import draw_histogram

            draw_histogram(path)
    # telemetry=layers' table and heat map (loss_scale=per_layer's scales' too), and a precision recipe's
    # counts per quantised tensor
    layers = (sorted(out_dir.glob("layers.*")) + sorted(out_dir.glob("layer_scales.png"))
              + sorted(out_dir.glob("precision.csv")))
    # telemetry's histograms and per-parameter breakdown, and the per-layer table
    for path in sorted(out_dir.glob("grad_*")) + layers:
        with_retry(client.log_artifact, run_id, str(path), "telemetry")
