"""How much of each workload's gradient float16 would flush to zero, and how much a loss scale saves.

Every run trains in float32 (amp O0, no scaling) with gradient histograms at chosen steps, so the
gradients are the true ones. A gradient g is lost at scale S when 0 < |g*S| < 2^-24, float16's
smallest subnormal. The histograms have one bin per power of two, so the fraction lost at
S = 2^k is the exact count of elements with log2|g| < -24-k, over all elements (zeros included,
as telemetry's underflow_fraction counts them).
"""

from __future__ import annotations

import csv
from typing import List

from lsexp.report.studies import StudyRun

EXPONENTS = list(range(0, 25, 4))  # S = 2^0, 2^4, ..., 2^24
SMALLEST = -24  # log2 of float16's smallest subnormal


def _histograms(run: StudyRun):
    """{step: (bins' lower edges, counts, zero count)} from the run's grad_hist_step<k>.csv artifacts."""
    out = {}
    for step in sorted(int(s) for s in _hist_steps(run)):
        path = run.artifact(f"telemetry/grad_hist_step{step}.csv")
        if path is None:
            continue
        edges, counts, zero = [], [], 0
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["log2_abs_grad_from"] == "zero":
                    zero = int(row["count"])
                else:
                    edges.append(int(row["log2_abs_grad_from"]))
                    counts.append(int(row["count"]))
        out[step] = (edges, counts, zero)
    return out


def _hist_steps(run: StudyRun) -> List[str]:
    value = run.param("telemetry.histogram_steps", "[]")
    return [s.strip() for s in value.strip("[]").split(",") if s.strip()]


def lost_fraction(edges, counts, zero, exponent: int) -> float:
    total = sum(counts) + zero
    lost = sum(c for e, c in zip(edges, counts) if e + 1 <= SMALLEST - exponent)
    return lost / total if total else float("nan")


def table(runs: List[StudyRun]):
    columns = ["workload", "step", "elements", "zero_fraction"] + [f"lost_at_2^{k}" for k in EXPONENTS]
    rows = []
    for run in runs:
        for step, (edges, counts, zero) in _histograms(run).items():
            total = sum(counts) + zero
            row = {"workload": run.label, "step": step, "elements": total, "zero_fraction": zero / total}
            row.update({f"lost_at_2^{k}": lost_fraction(edges, counts, zero, k) for k in EXPONENTS})
            row["_hist"] = (edges, counts, total)
            rows.append(row)
    return rows, columns


def figure(plt, runs: List[StudyRun], rows):
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads) + 1, figsize=(4.2 * (len(workloads) + 1), 4), squeeze=False)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.86, bottom=0.14, wspace=0.3)
    ax_lost = axes[0][-1]
    for ax, workload in zip(axes[0], workloads):
        for row in (r for r in rows if r["workload"] == workload):
            edges, counts, total = row["_hist"]
            ax.step(
                [e + 0.5 for e in edges],
                [c / total for c in counts],
                where="mid",
                label=f"step {row['step']}",
            )
            ax_lost.plot(
                EXPONENTS,
                [max(row[f"lost_at_2^{k}"], 1e-9) for k in EXPONENTS],
                marker="o",
                label=f"{workload}, step {row['step']}",
            )
        ax.axvline(SMALLEST, color="tab:red", linestyle=":", linewidth=1, label="2⁻²⁴")
        ax.set_yscale("log")
        ax.set_xlim(-60, 5)
        ax.set_title(workload, fontsize=9)
        ax.set_xlabel("log2 |gradient| (float32)")
        ax.set_ylabel("fraction of elements")
        ax.legend(fontsize=7, loc="upper left")
    ax_lost.axhline(0.05, color="gray", linestyle="--", linewidth=1, label="~5%: the paper's speech model")
    ax_lost.set_yscale("log")
    ax_lost.set_ylim(1e-9, 1)  # a fraction of 0 is drawn at the bottom edge
    ax_lost.set_xlabel("log2 S (loss scale)")
    ax_lost.set_ylabel("fraction lost in float16 (|g·S| < 2⁻²⁴)")
    ax_lost.set_title("what a loss scale S saves", fontsize=9)
    ax_lost.legend(fontsize=6, loc="lower left")
    fig.suptitle("Gradient exponents in float32 training, and the share float16 would flush to zero")
    return fig
