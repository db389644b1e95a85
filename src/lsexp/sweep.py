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
from lsexp.tracking.resume import child_runs
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
        # a resumed sweep's parent as it was: (status, end time, how many runs it held)
        self.before: Optional[tuple] = None
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
        sweep_dir = Path(config.hydra.sweep.dir)
        self.study = config.get("study")
        self.baseline = config.sweep.baseline
        if config.sweep.resume:  # the same parent again; preflight has checked that the folder names one
            self.run_id = (sweep_dir / PARENT_FILE).read_text().strip()
            parent = self.client.get_run(self.run_id)
            self.before = (parent.info.status, parent.info.end_time, self._runs_under(self.run_id))
            with_retry(self.client.update_run, self.run_id, status="RUNNING")
        else:
            self.run_id = self._open_parent(config, sweep_dir)
        (sweep_dir / SWEPT_FILE).write_text(" ".join(swept_keys(config)))
        # Hydra skips on_multirun_end when a job raises or the sweep is interrupted.
        atexit.register(self._close, sweep_dir, True)

    def _open_parent(self, config: DictConfig, sweep_dir: Path) -> str:
        experiment_id = ensure_experiment(self.client, config.tracking.experiment_name, self.uri)
        name = config.tracking.run_name or f"sweep-{sweep_dir.name}"
        run = with_retry(
            self.client.create_run,
            experiment_id,
            run_name=name,
            tags={"lsexp.sweep": "true", "lsexp.sweep_dir": str(sweep_dir.resolve())},
        )
        if self.study:  # so that `lsexp report` redraws the study too
            with_retry(self.client.set_tag, run.info.run_id, "lsexp.study", self.study)
        log_params(self.client, run.info.run_id, {k: redact(v) for k, v in sweep_params(config).items()})
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(run.info.run_id)
        return run.info.run_id

    def _runs_under(self, run_id: str) -> int:
        return len(child_runs(self.client, run_id, superseded=True))

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
        if interrupted and self.before and self._runs_under(run_id) == self.before[2]:
            # a resume stopped before any job opened a run (a refused job, Ctrl-C): the parent as it was
            with_retry(self.client.set_terminated, run_id, self.before[0], self.before[1])
            return
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
    """A baseline the sweep cannot produce: its keys must be swept keys but train.seed (all of them: one
    group; some: each group's own), each with one of its swept values."""
    baseline = OmegaConf.select(config, "sweep.baseline")
    if baseline is None:
        return None
    swept = {k: v for k, v in swept_keys(config).items() if k != SEED_KEY}
    if not swept:
        return (f"sweep.baseline={baseline!r}: this sweep varies only the seed, so "
                "it has one group and nothing to compare it with; drop the baseline")
    given = overrides_dict([t for t in str(baseline).split() if "=" in t])
    fix = " ".join(f"{k}={v.split(',')[0]}" for k, v in swept.items())
    if not given or not set(given) <= set(swept) or any(
            "," in swept[k] and v not in swept[k].split(",") for k, v in given.items()):
        first, value = next(iter(swept.items()))
        return (f"sweep.baseline={baseline!r} is not a group of this sweep, nor some of its choices; "
                f"name one as its runs' lsexp.group tag does, e.g. '{fix}', or some of its choices, "
                f"e.g. '{first}={value.split(',')[0]}'")
    return None


def resume_problem(config: DictConfig) -> Optional[str]:
    """sweep.resume without a sweep to resume: no store, a search sweeper's in-memory study, or a
    hydra.sweep.dir that holds no lsexp sweep of this store."""
    if not config.sweep.resume:
        return None
    if config.tracking.backend != "mlflow":
        return (f"sweep.resume=true with tracking.backend={config.tracking.backend}: a resumed sweep finds "
                "its finished jobs in the MLflow store; use tracking=mlflow")
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
    if "optuna" in sweeper.lower():
        return ("sweep.resume=true with hydra/sweeper=optuna: Optuna's study lives in the sweep's memory "
                "and ended with it, so it cannot resume; run the search again without sweep.resume")
    parent_file = Path(config.hydra.sweep.dir) / PARENT_FILE
    if not parent_file.is_file():
        return (f"sweep.resume=true: hydra.sweep.dir={config.hydra.sweep.dir} holds no lsexp sweep (no "
                f"{PARENT_FILE}); pass the old sweep's folder, e.g. hydra.sweep.dir=multirun/<day>/<time>")
    client = client_for(resolve_uri(config.tracking.uri, start_dir()))
    run_id = parent_file.read_text().strip()
    try:
        parent = client.get_run(run_id)
    except Exception:  # MLflow's RESOURCE_DOES_NOT_EXIST
        parent = None
    if parent is None or parent.data.tags.get("lsexp.sweep") != "true":
        return (f"sweep.resume=true: the sweep in hydra.sweep.dir={config.hydra.sweep.dir} (parent run "
                f"{run_id}) is not in tracking.uri={redact(resolve_uri(config.tracking.uri, start_dir()))}; "
                "resume with the store it was tracked in")
    return None
