"""Gradient telemetry at chosen steps: the per-layer breakdown and log2|g| histograms.

The per-step statistics are computed inside the compiled step (engines.body.StepBody._grad_telemetry). At
`telemetry.histogram_steps` lsexp also reads the step's gradients on the host, after the step, from the
flattened copy the step keeps of them (lsexp_grad_snapshot), and writes:

- grad_layers.csv: per parameter, the element count, how many are zero, would flush to zero in
  float16 (non-zero, |g*S| < 2^-24), would overflow it (|g*S| > 65504, or non-finite), the
  unscaled norm, and the largest |g*S| (amax);
- grad_hist_step<k>.csv / .png: the histogram of log2|g| (unscaled, non-zero finite elements),
  with float16's limits marked as Micikevicius et al. 2018 do in Fig. 2b: 2^-24 (the smallest
  subnormal), 2^-24/S (the smallest gradient that survives at scale S) and 65504/S (the largest).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import List

import numpy as np

from lsexp.formats.spec import FP16_MAX, FP16_TINY
from lsexp.taps import EXIT_STATS, RECORD

LAYER_COLUMNS = ("step", "loss_scale", "parameter", "elements", "zero", "underflow", "overflow", "norm",
                 "amax")
BINS = np.arange(-80, 33)  # log2|g| from 2^-80 to 2^32, one bin per power of two


def counts(scaled: np.ndarray, scale: float) -> dict:
    """The telemetry of one gradient array as backprop computed it (scaled by `scale`)."""
    magnitude = np.abs(scaled.astype(np.float32))
    return {"elements": magnitude.size, "zero": int((magnitude == 0).sum()),
            "underflow": int(((magnitude > 0) & (magnitude < FP16_TINY)).sum()),
            "overflow": int((~(magnitude <= FP16_MAX)).sum()),
            "norm": float(np.sqrt((magnitude.astype(np.float64) ** 2).sum()) / scale),
            "amax": float(magnitude.max()) if magnitude.size else 0.0}


class GradientProbe:
    """At telemetry.histogram_steps, after the step: its gradients, as the step kept them (the step cell's
    lsexp_grad_snapshot, flattened in the order of its weights), split back into the parameters."""

    def __init__(self, step_cell, out_dir: Path, draw: bool = True):
        self.draw = draw  # False: the tracking worker draws the PNGs, beside the job (draw_histogram)
        self.snapshot = step_cell.grad_snapshot
        self.names = [w.name for w in step_cell.weights]
        self.shapes = [tuple(w.shape) for w in step_cell.weights]
        self.out_dir = out_dir
        self.layers_csv = out_dir / "grad_layers.csv"

    def capture(self, step: int, scale: float) -> List[np.ndarray]:
        flat = self.snapshot.asnumpy()
        sizes = [int(np.prod(shape)) for shape in self.shapes]
        parts = np.split(flat, np.cumsum(sizes)[:-1])
        grads = [part.reshape(shape) for part, shape in zip(parts, self.shapes)]
        self._write_layers(step, scale, grads)
        self._write_histogram(step, scale, grads)
        return grads

    def _write_layers(self, step: int, scale: float, grads: List[np.ndarray]) -> None:
        new = not self.layers_csv.exists()
        with open(self.layers_csv, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=LAYER_COLUMNS)
            if new:
                writer.writeheader()
            for name, grad in zip(self.names, grads):
                writer.writerow({"step": step, "loss_scale": scale, "parameter": name, **counts(grad, scale)})

    def _write_histogram(self, step: int, scale: float, grads: List[np.ndarray]) -> None:
        magnitude = np.abs(np.concatenate([g.reshape(-1).astype(np.float64) for g in grads])) / scale
        finite = magnitude[np.isfinite(magnitude) & (magnitude > 0)]
        hist, _ = np.histogram(np.log2(finite), bins=BINS)
        stem = self.out_dir / f"grad_hist_step{step}"
        with open(f"{stem}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["log2_abs_grad_from", "log2_abs_grad_to", "count"])
            writer.writerows(zip(BINS[:-1], BINS[1:], hist))
            writer.writerow(["zero", "", int((magnitude == 0).sum())])
        if self.draw:
            _plot_histogram(f"{stem}.png", hist, step, scale, len(magnitude))


def draw_histogram(csv_path: Path) -> None:
    """grad_hist_step<k>.png from its CSV and the step's rows of grad_layers.csv beside it (the scale, and
    the element count, non-finite ones included)."""
    step = int(csv_path.stem.removeprefix("grad_hist_step"))
    with open(csv_path, newline="") as f:
        hist = np.array([int(row["count"]) for row in csv.DictReader(f)
                         if row["log2_abs_grad_from"] != "zero"])
    with open(csv_path.parent / "grad_layers.csv", newline="") as f:
        mine = [row for row in csv.DictReader(f) if int(row["step"]) == step]
    _plot_histogram(str(csv_path.with_suffix(".png")), hist, step, float(mine[0]["loss_scale"]),
                    sum(int(row["elements"]) for row in mine))


def _plot_histogram(path: str, hist: np.ndarray, step: int, scale: float, total: int) -> None:
    from lsexp.figures import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.9, bottom=0.14)
    ax.bar(BINS[:-1] + 0.5, hist / max(total, 1), width=1.0, color="tab:blue")
    shift = math.log2(scale)
    for x, label, style in (
        (-24, "2⁻²⁴ (float16's smallest)", ":"),
        (-24 - shift, "2⁻²⁴/S: lost below", "--"),
        (math.log2(FP16_MAX) - shift, "65504/S: overflows above", "-"),
    ):
        ax.axvline(x, color="tab:red", linestyle=style, linewidth=1, label=label)
    if hist.any():  # every element may have overflowed, leaving nothing finite to count
        ax.set_yscale("log")
    ax.set_xlabel("log2 |gradient| (unscaled)")
    ax.set_ylabel("fraction of elements")
    ax.set_title(f"gradients at step {step}, loss scale S = {scale:g}")
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# layers.csv: per step and tapped layer, lsexp.taps.EXIT_STATS as the step reports them. grad_amax is of
# the activation gradient as the backward pass has it, scaled by loss_scale: as float16 at that scale sees
# it.
LAYER_TABLE_COLUMNS = ("step", "layer", "loss_scale", "overflow") + EXIT_STATS
_GRAD, _UNDER, _ZERO, _OVER = (EXIT_STATS.index(k) for k in
                               ("grad_amax", "underflow_fraction", "zero_fraction", "overflow_fraction"))
# the worst layer of each step, as history columns and MLflow metrics
WORST_LAYER = ("layer_underflow_fraction_max", "layer_zero_fraction_max", "layer_overflow_fraction_max",
               "layer_grad_amax_min_log2")


class LayerTable:
    """telemetry=layers: every step's per-layer statistics, kept on the host, written as layers.csv and
    drawn as layers.png when the run ends. With records (loss_scale=per_layer) each layer's RECORD
    follows its statistics: the layer's own scale and the scale its gradient then carries, drawn as
    layer_scales.png."""

    def __init__(self, names: List[str], stats: bool = True, records: bool = False):
        self.names = names
        self.width = len(EXIT_STATS) if stats else 0
        self.records = RECORD if records else ()
        self.steps: List[tuple] = []  # (step, scale, overflow, (layers, width + records) array)

    def add(self, step: int, scale: float, overflow: float, values) -> dict:
        values = np.asarray(values, dtype=np.float64)
        n = len(self.names)
        stats = values[:n * self.width].reshape(n, self.width)
        if self.records:
            stats = np.hstack([stats, values[n * self.width:].reshape(n, len(self.records))])
        self.steps.append((step, scale, int(overflow), stats))
        if not self.width:  # the scales alone (loss_scale=per_layer without telemetry.layers)
            return {}
        with np.errstate(divide="ignore", invalid="ignore"):
            amax_min = np.log2(stats[:, _GRAD].min()) if np.isfinite(stats[:, _GRAD]).all() else math.nan
        return dict(zip(WORST_LAYER, (float(stats[:, _UNDER].max()), float(stats[:, _ZERO].max()),
                                      float(stats[:, _OVER].max()), float(amax_min))))

    def means(self) -> dict:
        """Per layer, over the steps that did not overflow: the mean fractions and the mean log2 of the
        activation gradient's amax (unscaled), which the sweep comparison and `lsexp report` show."""
        clean = [(scale, stats) for _, scale, overflow, stats in self.steps if not overflow]
        out = {}
        if not self.width:
            return out
        for i, name in enumerate(self.names):
            if not clean:
                out[name] = None
                continue
            with np.errstate(divide="ignore"):
                log2 = [math.log2(stats[i, _GRAD] / scale) if stats[i, _GRAD] > 0 else -math.inf
                        for scale, stats in clean]
            out[name] = {
                "grad_amax_log2": float(np.mean(log2)),
                "underflow_fraction": float(np.mean([stats[i, _UNDER] for _, stats in clean])),
                "zero_fraction": float(np.mean([stats[i, _ZERO] for _, stats in clean])),
            }
        return out

    def write(self, out_dir: Path) -> None:
        with open(out_dir / "layers.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow((LAYER_TABLE_COLUMNS if self.width else LAYER_TABLE_COLUMNS[:4]) + self.records)
            for step, scale, overflow, stats in self.steps:
                for name, row in zip(self.names, stats):
                    writer.writerow([step, name, scale, overflow, *row.tolist()])
        if self.steps and self.width:
            _plot_layers(out_dir / "layers.png", self.names, self.steps)
        if self.steps and self.records:
            _plot_layer_scales(out_dir / "layer_scales.png", self.names, self.steps, self.width)


def _plot_layer_scales(path: Path, names: List[str], steps: List[tuple], at: int) -> None:
    """loss_scale=per_layer: a heat map of log2 of each layer's own scale, layers x steps, overflowed
    steps marked above it."""
    from lsexp.figures import pyplot

    plt = pyplot()
    step_ids = np.array([s for s, _, _, _ in steps])
    log2 = np.log2(np.stack([stats[:, at] for _, _, _, stats in steps], axis=1))
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.32 * len(names)))
    extent = (step_ids[0] - 0.5, step_ids[-1] + 0.5, len(names) - 0.5, -0.5)
    image = ax.imshow(log2, aspect="auto", cmap="magma", extent=extent, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="log2 of the layer's own scale")
    over = [s for s, _, overflow, _ in steps if overflow]
    if over:
        ax.plot(over, [-0.5] * len(over), "v", color="red", clip_on=False, label="overflow (skipped)")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("step")
    ax.set_title("loss_scale=per_layer: each layer's scale")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _plot_layers(path: Path, names: List[str], steps: List[tuple]) -> None:
    """A heat map of log2 of each layer's activation-gradient amax (unscaled), layers x steps; a cell whose
    whole gradient float16 flushes at the step's scale (amax below 2^-24/S) is dotted, the overflowed
    steps are marked above the map, and a strip below draws the flush limit log2(2^-24/S)."""
    from lsexp.figures import pyplot

    plt = pyplot()
    step_ids = np.array([s for s, _, _, _ in steps])
    scales = np.array([scale for _, scale, _, _ in steps], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        amax = np.stack([stats[:, _GRAD] for _, _, _, stats in steps], axis=1) / scales  # (layers, steps)
        log2 = np.log2(np.where(np.isfinite(amax) & (amax > 0), amax, np.nan))
        limit = np.log2(FP16_TINY / scales)
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(10, 2.2 + 0.32 * len(names)), sharex=True,
                                    gridspec_kw={"height_ratios": [max(len(names), 2), 1.5]})
    extent = (step_ids[0] - 0.5, step_ids[-1] + 0.5, len(names) - 0.5, -0.5)
    image = ax.imshow(log2, aspect="auto", cmap="viridis", extent=extent, interpolation="nearest")
    fig.colorbar(image, ax=[ax, strip], label="log2 amax of the activation gradient (unscaled)")
    flushed = np.argwhere(amax < FP16_TINY / scales)
    if len(flushed):
        ax.scatter(step_ids[flushed[:, 1]], flushed[:, 0], s=6, c="white", marker=".",
                   label="below float16's flush limit")
    over = step_ids[[bool(o) for _, _, o, _ in steps]]
    if len(over):
        ax.scatter(over, np.full(len(over), -0.5), marker="v", c="tab:red", s=18, clip_on=False,
                   label="overflowed step")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.set_ylabel("layer (execution order)")
    ax.set_title("activation gradients per layer")
    if len(flushed) or len(over):
        ax.legend(loc="lower right", fontsize=7)
    strip.plot(step_ids, limit, color="tab:red", linewidth=1, label="float16's flush limit log2(2⁻²⁴/S)")
    finite = np.where(np.isfinite(log2), log2, np.inf).min(axis=0)
    strip.plot(step_ids, np.where(np.isfinite(finite), finite, np.nan), color="tab:blue", linewidth=1,
               label="smallest layer amax")
    strip.set_xlabel("step")
    strip.set_ylabel("log2")
    strip.legend(loc="upper right", fontsize=7)
    fig.savefig(path, dpi=100)
    plt.close(fig)
