"""Drawing primitives and tables that every figure of lsexp shares: a run's loss and loss scale, a
sweep's side by side, a study's, the gradient histograms. A leaf: it imports only matplotlib (lazily)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def power_of_two(value: float, _pos=None) -> str:
    """2²⁴ rather than matplotlib's mathtext $2^{24}$, which costs ~30 ms a figure to lay out:
    the job waits for its run's figure."""
    exponent = math.log2(value) if value > 0 else math.nan
    return "2" + str(int(exponent)).translate(_SUPERSCRIPT) if exponent.is_integer() else f"{value:g}"


def axes(plt, title: str, telemetry: bool = False):
    fig, axes = plt.subplots(3 if telemetry else 2, 1, sharex=True, figsize=(9, 8 if telemetry else 6))
    ax_loss, ax_scale = axes[0], axes[1]
    # fixed margins: constrained_layout costs more than the rest of the figure together
    fig.subplots_adjust(left=0.09, right=0.98, top=0.94, bottom=0.08, hspace=0.08)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title)
    # log2, so a fixed 128 and a dynamic 2^24 are both readable on one axis
    ax_scale.set_yscale("log", base=2)
    ax_scale.yaxis.set_major_formatter(power_of_two)
    ax_scale.set_ylabel("loss scale (log2)")
    axes[-1].set_xlabel("step")
    if telemetry:
        axes[2].set_ylabel("underflow fraction")
        return fig, ax_loss, ax_scale, axes[2]
    return fig, ax_loss, ax_scale


def smoothed(values: Sequence[float], span: int) -> List[float]:
    """An exponential moving average over about `span` steps, so overlapping noisy losses separate."""
    alpha, out, level = 2 / (span + 1), [], None
    for v in values:
        level = v if level is None or not math.isfinite(level) else level + alpha * (v - level)
        out.append(level)
    return out


class Curve(NamedTuple):
    """A run's steps, and at each its loss, loss scale and overflow flag."""

    steps: Sequence[int]
    loss: Sequence[float]
    scale: Sequence[float]
    overflow: Sequence[int]


def draw(ax_loss, ax_scale, curve: Curve, label=None, color=None, smooth=False):
    steps, loss, scale, overflow = curve
    if smooth and len(loss) > 20:  # the raw loss faint behind its moving average
        raw, = ax_loss.plot(steps, loss, color=color, linewidth=0.5, alpha=0.25)
        (line,) = ax_loss.plot(
            steps, smoothed(loss, max(5, len(loss) // 10)), label=label, color=raw.get_color(), linewidth=1.2
        )
    else:
        (line,) = ax_loss.plot(steps, loss, label=label, color=color, linewidth=1)
    ax_scale.plot(steps, scale, label=label, color=line.get_color(), linewidth=1, drawstyle="steps-post")
    marks = [i for i, flag in enumerate(overflow) if flag]
    if marks:
        ax_scale.plot(
            [steps[i] for i in marks],
            [scale[i] for i in marks],
            "x",
            color=line.get_color(),
            markersize=5,
            label=None if label else "overflow",
        )


class RunFigure:
    """One run's loss and loss scale over steps. Laid out and drawn empty when made, which also
    loads matplotlib and its fonts, so that `save`, once the run's steps are in, has only the
    lines to add: ~45 ms instead of ~65 ms, and the job waits for it."""

    def __init__(self, title: str):
        self._plt = pyplot()
        self.fig, self.ax_loss, self.ax_scale = axes(self._plt, title)
        self.fig.canvas.draw()

    def save(self, rows: Sequence[Dict], path: Path) -> None:
        """Draw the rows, write the PNG and close the figure (so once per figure)."""
        draw(
            self.ax_loss,
            self.ax_scale,
            Curve(
                [r["step"] for r in rows],
                [r["loss"] for r in rows],
                [r["loss_scale"] for r in rows],
                [r["overflow"] for r in rows],
            ),
        )
        if any(r["overflow"] for r in rows):
            self.ax_scale.legend(loc="best", fontsize=8)
        self.fig.savefig(path, dpi=100)
        self._plt.close(self.fig)


def write_table(stem: Path, rows: Sequence[Dict], columns: Sequence[str], cell=str,
                md_columns: Sequence[str] = ()) -> None:
    """<stem>.csv with every value of `columns`, and <stem>.md, a Markdown table of `md_columns` (by
    default the same) as cell() shows them."""
    with open(f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shown = list(md_columns or columns)
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in shown) + " |" for r in rows]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
