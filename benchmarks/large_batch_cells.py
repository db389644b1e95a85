"""A large_batch-style sweep's cells from its job folders, per N (train.mean_over_tokens) and arm: the
held-out loss's mean and 95% interval over the seeds; per layer, the mean underflow and zero fractions
over the steps that did not overflow (telemetry=layers); under loss_scale=per_layer each layer's mean
scale. A job named by its loss_scale overrides instead of an arm is labelled <loss_scale>@<init_scale>:

    python benchmarks/large_batch_cells.py SWEEP_DIR

docs/per_layer.md quotes it."""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from lsexp.report.groups import Interval


def job(folder: Path) -> tuple:
    """((N, arm), (eval_loss, {layer: (underflow, zero, scale or None)}))"""
    keys = dict(p.split("=", 1) for p in folder.name.split("-", 1)[1].split(","))
    arm = keys.get("arm") or f"{keys.get('loss_scale', '')}@{keys.get('loss_scale.init_scale', '')}"
    summary = json.loads((folder / "summary.json").read_text())
    by_layer = defaultdict(lambda: ([], [], []))
    with open(folder / "layers.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["overflow"] == "0":
                under, zero, scale = by_layer[row["layer"]]
                under.append(float(row["underflow_fraction"]))
                zero.append(float(row["zero_fraction"]))
                if "layer_scale" in row:
                    scale.append(float(row["layer_scale"]))
    layers = {name: (np.mean(u), np.mean(z), np.mean(s) if s else None)
              for name, (u, z, s) in by_layer.items()}
    return (keys["train.mean_over_tokens"], arm), (summary["eval_loss"], layers)


def main(root: Path) -> None:
    cells = defaultdict(list)
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and "-" in p.name):
        key, values = job(folder)
        cells[key].append(values)
    for (n, arm), runs in sorted(cells.items()):
        names = sorted(runs[0][1])
        parts = [f"N={n}", f"{arm:16s}", f"seeds={len(runs)}",
                 f"eval_loss {Interval.of([loss for loss, _ in runs]).cell()}"]
        for name in names:
            under, zero, scale = (np.mean([layers[name][i] for _, layers in runs]) if runs[0][1][name][i]
                                  is not None else None for i in range(3))
            parts.append(f"{name}: under {under:.4f} zero {zero:.4f}" + ("" if scale is None
                                                                        else f" scale {scale:.3g}"))
        print("  ".join(parts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
