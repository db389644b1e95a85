"""A Hydra sweep in MLflow: the parent run, opened before any job and closed with the comparison of its
jobs (and its study) once they have ended, so that no run is left RUNNING."""

from __future__ import annotations

import atexit
import re
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lsexp.config.overrides import overrides_dict
from lsexp.report import studies
from lsexp.report.sweep import labels, sweep_report
from lsexp.tracking import worker as tracking_worker
from lsexp.tracking.run import PARENT_FILE, SEED_KEY, SWEPT_FILE, start_dir
from lsexp.tracking.store import client_for, ensure_experiment, log_params, resolve_uri, with_retry
from lsexp.tracking.uri import redact

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def swept_keys(config: DictConfig) -> Dict[str, str]:
    """The keys the sweep varies, with their sweep values: a value list (a,b), a range or a choice. The
    jobs name themselves by them, and every one but train.seed sets a job's group."""
    return {k: v for k, v in sweep_params(config).items() if "," in v or re.match(r"^\w+\(", v)}


def sweep_params(config: DictConfig) -> Dict[str, str]:
    """What the sweep varies: command-line overrides plus an experiment's hydra.sweeper.params."""
    params = overrides_dict(config.hydra.overrides.task)
    swept = OmegaConf.select(config, "hydra.sweeper.params") or {}
    params.update({str(k): str(v) for k, v in swept.items()})
    return params


class SweepCallback(Callback):
    """Opens the parent MLflow run before the launcher starts any job, and closes it with the
    comparison figure and table once every job has ended. The parent is also closed (KILLED)
    if the sweep dies, so no run is left RUNNING."""

    def __init__(self) -> None:
        self.baseline: Optional[str] = None  # sweep.baseline
        self.client = None
        self.run_id: Optional[str] = None
        self.study: Optional[str] = None
        self.uri = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # An early worker serves the first job only when the jobs run in this process and track.
        if (
            config.tracking.backend != "mlflow"
            or OmegaConf.select(config, "hydra.launcher._target_") != BASIC_LAUNCHER
        ):
            tracking_worker.discard()
        if config.tracking.backend != "mlflow":
            return
        # The store was checked by preflight.ValidateOnRunStart, which runs first, before the sweep
        # directory exists.
        self.uri = resolve_uri(config.tracking.uri, start_dir())
        # Created here, once, before any job: parallel jobs then find the schema and the
        # experiment in place instead of racing to migrate or create them.
        self.client = client_for(self.uri)
        experiment_id = ensure_experiment(self.client, config.tracking.experiment_name, self.uri)
        name = config.tracking.run_name or f"sweep-{Path(config.hydra.sweep.dir).name}"
        run = with_retry(
            self.client.create_run,
            experiment_id,
            run_name=name,
            tags={"lsexp.sweep": "true", "lsexp.sweep_dir": str(Path(config.hydra.sweep.dir).resolve())},
        )
        self.run_id = run.info.run_id
        self.study = config.get("study")
        self.baseline = config.sweep.baseline
        if self.study:  # so that `lsexp report` redraws the study too
            with_retry(self.client.set_tag, self.run_id, "lsexp.study", self.study)
        log_params(self.client, self.run_id, {k: redact(v) for k, v in sweep_params(config).items()})
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(self.run_id)
        (sweep_dir / SWEPT_FILE).write_text(" ".join(swept_keys(config)))
        # Hydra skips on_multirun_end when a job raises or the sweep is interrupted.
        atexit.register(self._close, sweep_dir, True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close(Path(config.hydra.sweep.dir), interrupted=False)

    def _tag_best_trial(self, sweep_dir: Path, run_id: str, children) -> None:
        """A search sweeper (optuna) leaves its best parameters in optimization_results.yaml: tag the
        trial that had them, and log them on the parent."""
        results = sweep_dir / "optimization_results.yaml"
        if not results.exists():
            return
        best = {str(k): str(v) for k, v in (OmegaConf.load(results).get("best_params") or {}).items()}
        for child in children:
            mine = overrides_dict(child.data.tags.get("lsexp.overrides", "").split())
            if best and all(mine.get(k) == v for k, v in best.items()):
                with_retry(self.client.set_tag, child.info.run_id, "lsexp.best_trial", "true")
                with_retry(self.client.set_tag, run_id, "lsexp.best_run_id", child.info.run_id)
                break
        log_params(self.client, run_id, {f"best.{k}": v for k, v in best.items()})
        value = OmegaConf.load(results).get("best_value")
        if value is not None:
            with_retry(self.client.log_metric, run_id, "best_value", float(value))

    def _close(self, sweep_dir: Path, interrupted: bool) -> None:
        """Attach the comparison of whatever children exist, then end the parent: FINISHED when every
        child finished, FAILED when one failed, KILLED when the sweep was cut short otherwise."""
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        status = "KILLED" if interrupted else "FINISHED"
        try:
            out = sweep_dir / "comparison"
            children = sweep_report(self.client, run_id, out, self.baseline)
            for path in sorted(out.iterdir()):
                with_retry(self.client.log_artifact, run_id, str(path))
            if self.study and children:
                for path in studies.write(
                    self.study, self.client, children, labels(children), sweep_dir / "study"
                ):
                    with_retry(self.client.log_artifact, run_id, str(path), "study")
            if any(c.info.status == "FAILED" for c in children):
                status = "FAILED"
            self._tag_best_trial(sweep_dir, run_id, children)
        except Exception as err:
            status = "FAILED"
            with_retry(self.client.set_tag, run_id, "lsexp.error", f"comparison failed: {err}"[:5000])
            if not interrupted:
                raise
        finally:
            with_retry(self.client.set_terminated, run_id, status)


def baseline_problem(config: DictConfig) -> Optional[str]:
    """A baseline group the sweep cannot produce: its keys must be the swept keys but train.seed, in the
    order typed, each with one of its swept values."""
    baseline = OmegaConf.select(config, "sweep.baseline")
    if baseline is None:
        return None
    swept = {k: v for k, v in swept_keys(config).items() if k != SEED_KEY}
    if not swept:
        return (f"sweep.baseline={baseline!r}: this sweep varies only the seed, so "
                "it has one group and nothing to compare it with; drop the baseline")
    given = overrides_dict([t for t in str(baseline).split() if "=" in t])
    fix = " ".join(f"{k}={v.split(',')[0]}" for k, v in swept.items())
    if list(given) != list(swept) or any("," in v and given[k] not in v.split(",") for k, v in swept.items()):
        return (f"sweep.baseline={baseline!r} is not a group of this sweep; "
                f"name one as its runs' lsexp.group tag does, e.g. '{fix}'")
    return None
