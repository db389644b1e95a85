"""Gradient telemetry at chosen steps: the per-layer breakdown and log2|g| histograms.

The per-step statistics are computed inside the compiled step (loss_scaling._grad_telemetry). At
`telemetry.histogram_steps` lsexp also fetches the step's gradients to the host, before the step
runs, from a separate compiled gradient of the same loss network, inputs and scale, and writes:

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

from lsexp.engines import FP16_MAX, FP16_TINY

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
    def __init__(self, loss_net, weights, out_dir: Path):
        from mindspore import nn, ops

        class _Grads(nn.Cell):
            def __init__(self, network, params):
                super().__init__()
                self.network, self.params = network, params
                self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

            def construct(self, x, y, sens):
                return self.grad(self.network, self.params)(x, y, sens)

        self.grads = _Grads(loss_net, weights)
        self.names = [w.name for w in weights]
        # BatchNorm's moving statistics: the probe's forward must leave them as the step finds them.
        self.buffers = [p for p in loss_net.get_parameters() if not p.requires_grad]
        self.out_dir = out_dir
        self.layers_csv = out_dir / "grad_layers.csv"

    def capture(self, step: int, x, y, scale: float) -> List[np.ndarray]:
        import mindspore as ms

        saved = [b.asnumpy().copy() for b in self.buffers]
        grads = [g.asnumpy() for g in self.grads(x, y, ms.Tensor(scale, ms.float32))]
        for buffer, value in zip(self.buffers, saved):
            buffer.set_data(ms.Tensor(value))
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
        _plot_histogram(f"{stem}.png", hist, step, scale, len(magnitude))


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
