"""Studies: sweeps under experiments/ whose result is a table and a figure of their own.

An experiment names its study (`study: scale_sweep`); when the sweep ends, `lsexp.report.studies.<study>`
turns the sweep's child runs, read back from the MLflow store, into `<study>.csv`, `<study>.md`
and `<study>.png`. Reading the store, not the job folders, is what lets `lsexp report` redraw a
study and lets it work under any launcher. A new study is its experiment YAML plus its module here.
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from lsexp.report.groups import Interval


def problems(cfg) -> List[str]:
    """study: a study lsexp has, or null."""
    if cfg.study is not None and cfg.study not in available():
        return [f"study={cfg.study}: no such study; use one of {', '.join(available())} or null"]
    return []


def available() -> List[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


@dataclass
class StudyRun:
    """One child run of the sweep, as the store has it."""

    client: object
    run_id: str
    label: str  # the sweep's choices that differ, e.g. "amp=O2 loss_scale.loss_scale=256"
    status: str
    params: Dict[str, str]
    metrics: Dict[str, float]  # the latest value of each metric
    tags: Dict[str, str]
    downloads: Path  # a folder that lives as long as the study's report
    _histories: Dict[str, Dict[int, float]] = field(default_factory=dict)

    @property
    def strategy(self) -> str:
        return self.tags.get("lsexp.strategy", "")

    @property
    def group(self) -> str:
        """The sweep's choices but train.seed: its `lsexp.group` tag, or in a store from before the tag
        its differing choices but the seed."""
        return self.tags.get("lsexp.group") or self.label_without("train.seed")

    @property
    def seed(self) -> str:
        return self.tags.get("lsexp.seed") or self.param("train.seed", "")

    def label_without(self, *prefixes: str) -> str:
        """The run's differing choices except those starting with a prefix: the runs a study groups."""
        return " ".join(t for t in self.label.split() if not t.startswith(prefixes)) or "all"

    def history(self, key: str) -> Dict[int, float]:
        if key not in self._histories:
            self._histories[key] = {m.step: m.value for m in self.client.get_metric_history(self.run_id, key)}
        return self._histories[key]

    def series(self, key: str) -> List[float]:
        values = self.history(key)
        return [values[s] for s in sorted(values)]

    def artifact(self, path: str) -> Optional[Path]:
        """A logged file, downloaded; None when the run has none at that path."""
        try:
            return Path(self.client.download_artifacts(self.run_id, path, str(self.downloads)))
        except Exception:  # MLflow raises its own kinds for a missing artifact, store by store
            return None

    def param(self, key: str, default=None):
        return self.params.get(key, default)


def study_runs(client, children, labels: Sequence[str], downloads: Path) -> List[StudyRun]:
    """The sweep's child runs (MLflow's Run objects) as a study reads them."""
    return [StudyRun(client, c.info.run_id, label, c.info.status, dict(c.data.params), dict(c.data.metrics),
                     dict(c.data.tags), downloads) for c, label in zip(children, labels)]


def by_group(runs: Iterable[StudyRun]) -> Dict[str, List[StudyRun]]:
    """The runs by group (StudyRun.group), groups in the order of their first run, runs by seed."""
    groups: Dict[str, List[StudyRun]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    return {name: sorted(mine, key=_seed_order) for name, mine in groups.items()}


def over_seeds(values: Iterable[float]) -> str:
    """A group's per-seed values as the sweep comparison shows them: mean ± std [95% interval], or the
    value alone for one seed."""
    return Interval.of(list(values)).cell()


def side(mine: Interval, reference: Interval, diverged: int = 0) -> str:
    """Where a group's 95% interval lies against a reference's: `above` (wholly), `overlaps` or `below`;
    `above` for a group whose every seed diverged (`diverged` of them, none left to average), and empty
    where either has fewer than two seeds."""
    if mine.n == 0:
        return "above" if diverged else ""
    if reference.n < 2 or mine.n < 2:
        return ""
    if mine.low > reference.high:
        return "above"
    if mine.high < reference.low:
        return "below"
    return "overlaps"


def _seed_order(run: StudyRun):
    return (0, int(run.seed)) if str(run.seed).lstrip("-").isdigit() else (1, str(run.seed))


def eval_loss(run: StudyRun) -> float:
    """The run's held-out loss, NaN for a run that did not finish."""
    value = run.metrics.get("eval_loss", math.nan)
    return value if run.status == "FINISHED" else math.nan


@dataclass
class LossCell:
    """A table cell's held-out losses over its seeds: their interval and the seeds whose loss is not
    finite."""

    interval: Interval
    diverged: List[str]

    @property
    def note(self) -> str:
        return f"seed {', '.join(map(str, self.diverged))}: held-out loss not finite" if self.diverged else ""

    def versus(self, reference: Optional["LossCell"]) -> str:
        """Where this cell's interval lies against the reference cell's (side)."""
        return side(self.interval, reference.interval if reference else Interval.of([]), len(self.diverged))


def loss_cells(grouped: Dict[tuple, List[StudyRun]]) -> Dict[tuple, LossCell]:
    """Each cell of finished_cells' groups as its held-out losses."""
    out = {}
    for key, mine in grouped.items():
        values = [eval_loss(r) for r in mine]
        diverged = [r.seed for r, v in zip(mine, values) if not math.isfinite(v)]
        out[key] = LossCell(Interval.of(values), diverged)
    return out


def finished_cells(runs: Iterable[StudyRun], key: Callable[[StudyRun], tuple],
                   order: Callable[[tuple], tuple]) -> Dict[tuple, List[StudyRun]]:
    """The runs that ended, grouped by key(run): the groups sorted by order(key), each group's runs by
    seed. A run RUNNING or SCHEDULED belongs to a sweep still under way and is not a result yet."""
    found: Dict[tuple, List[StudyRun]] = defaultdict(list)
    for run in runs:
        if run.status not in ("RUNNING", "SCHEDULED"):
            found[key(run)].append(run)
    return {k: sorted(found[k], key=_seed_order) for k in sorted(found, key=order)}


def write(study: str, client, children, labels: Sequence[str], out: Path) -> List[Path]:
    """Run the study's report over the sweep's children; returns the files written."""
    module = importlib.import_module(f"{__name__}.{study}")
    # a progress bar per downloaded histogram would bury the sweep's own log lines
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from lsexp.figures import pyplot, write_table

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lsexp-study-") as downloads:
        runs = study_runs(client, children, labels, Path(downloads))
        rows, columns = module.table(runs)
        write_table(out / study, rows, columns, cell=_cell)
        plt = pyplot()
        fig = module.figure(plt, runs, rows)
        fig.savefig(out / f"{study}.png", dpi=100)
        plt.close(fig)
    return [out / f"{study}.{ext}" for ext in ("csv", "md", "png")]


def _cell(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}" if value != 0 else "0"
    return str(value)


def log2(value: float) -> float:
    return math.log2(value) if value > 0 else math.nan
