"""Seeds of one setting as one result: a sweep's runs grouped by their `lsexp.group` tag (every swept
choice but train.seed), each summary metric as n, mean, standard deviation and a 95% confidence interval
of the mean (Student's t, n - 1 degrees of freedom), and the paired difference of each group from a
baseline group over the seeds both ran (the whole group, or some of its choices: each group's own)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from lsexp.config.overrides import overrides_dict

# What a run ends with, as the tracking worker logs it; eval_accuracy and eval_loss (the held-out loss, a
# language model's measure) where the run evaluated.
METRICS = ("final_loss", "eval_accuracy", "eval_loss", "skipped_steps", "overflow_count")
TELEMETRY_METRICS = ("mean_underflow_fraction", "mean_overflow_fraction", "mean_zero_fraction")
CONFIDENCE = 0.95


@dataclass
class Interval:
    """n values' mean, sample standard deviation and the 95% interval of the mean; with one value the
    spread and the interval are NaN: one seed says nothing of the next."""

    n: int
    mean: float
    std: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Interval":
        values = [float(v) for v in values if v is not None and v != "" and math.isfinite(float(v))]
        n = len(values)
        if n == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        mean = statistics.fmean(values)
        if n == 1:
            return cls(1, mean, math.nan, math.nan, math.nan)
        from scipy.stats import t  # MindSpore's own dependency; loaded only for a grouped report

        std = statistics.stdev(values)
        half = float(t.ppf((1 + CONFIDENCE) / 2, n - 1)) * std / math.sqrt(n)
        return cls(n, mean, std, mean - half, mean + half)

    def cell(self) -> str:
        """`mean ± std [low, high]` for the Markdown table; the mean alone for one value."""
        if self.n == 0:
            return ""
        if self.n == 1:
            return _short(self.mean)
        if self.std == 0:  # every seed alike: the interval is the point
            return f"{_short(self.mean)} ± 0"
        return f"{_short(self.mean)} ± {_short(self.std)} [{_short(self.low)}, {_short(self.high)}]"


@dataclass
class Group:
    name: str
    rows: List[Dict] = field(default_factory=list)  # the runs' metrics, in run order
    seeds: List[str] = field(default_factory=list)

    def interval(self, metric: str) -> Interval:
        return Interval.of([r.get(metric) for r in self.rows])


def group_runs(rows: Sequence[Dict], group_names: Sequence[str], seeds: Sequence[str]) -> List[Group]:
    """The runs' metrics ({metric: value}) by group, groups in the order their first run started."""
    groups: Dict[str, Group] = {}
    for row, name, seed in zip(rows, group_names, seeds):
        group = groups.setdefault(name, Group(name))
        group.rows.append(row)
        group.seeds.append(seed)
    return list(groups.values())


def grouped_rows(groups: Sequence[Group], metrics: Sequence[str]) -> List[Dict]:
    """One row per group: n, its seeds, and for each metric its mean, std and interval as columns."""
    out = []
    for group in groups:
        row = {"group": group.name, "n": len(group.rows), "seeds": " ".join(group.seeds)}
        for metric in metrics:
            iv = group.interval(metric)
            row.update({metric: iv.cell(), f"{metric}_mean": _num(iv.mean), f"{metric}_std": _num(iv.std),
                        f"{metric}_ci95_low": _num(iv.low), f"{metric}_ci95_high": _num(iv.high)})
        out.append(row)
    return out


def pairing(names: Sequence[str], baseline: str) -> Dict[str, str]:
    """Each group's baseline group, for the groups that have one other than themselves. A baseline that
    is a group's name is every group's; one that names some swept choices (`loss_scale=none`) pairs
    each group with the group that differs from it in those alone, so that a sweep over workloads
    pairs each workload's runs with that workload's baseline. Empty: the baseline makes no pair."""
    if baseline in names:
        return {name: baseline for name in names if name != baseline}
    theirs = overrides_dict(baseline.split())
    out = {}
    for name in names:
        mine = overrides_dict(name.split())
        if theirs and set(theirs) <= set(mine):
            base = " ".join(f"{key}={theirs.get(key, value)}" for key, value in mine.items())
            if base in names and base != name:
                out[name] = base
    return out


def paired_rows(groups: Sequence[Group], baseline: str, metrics: Sequence[str]) -> List[Dict]:
    """For each group that has a baseline group (pairing): over the seeds both ran, the per-seed
    difference from the baseline group (group minus baseline) of each metric, as n, mean, std and
    interval. Pairing by seed takes out what a seed does to every group alike (its initial weights,
    its data order)."""
    by_name = {g.name: g for g in groups}
    out = []
    for name, base_name in pairing(list(by_name), baseline).items():
        group, base = by_name[name], by_name[base_name]
        by_seed = dict(zip(base.seeds, base.rows))
        pairs = [(row, by_seed[seed]) for seed, row in zip(group.seeds, group.rows) if seed in by_seed]
        row = {"group": group.name, "baseline": base.name, "n_pairs": len(pairs),
               "seeds": " ".join(s for s in group.seeds if s in by_seed)}
        for metric in metrics:
            iv = Interval.of([_difference(mine.get(metric), theirs.get(metric)) for mine, theirs in pairs])
            row.update({metric: iv.cell(), f"{metric}_mean": _num(iv.mean),
                        f"{metric}_ci95_low": _num(iv.low), f"{metric}_ci95_high": _num(iv.high)})
        out.append(row)
    return out


def _difference(a, b) -> Optional[float]:
    if a in (None, "") or b in (None, ""):
        return None
    return float(a) - float(b)


def _num(value: float):
    return "" if not math.isfinite(value) else round(value, 6)


def _short(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "nan"
