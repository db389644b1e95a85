"""MLflow tracking: one run per job, one parent run per Hydra sweep.

Nothing is logged per step (per-step logging costs ~7 ms a step here, ~10% of a LeNet step):
the job keeps its history on the host and hands it, once per epoch, to the tracking worker
(`lsexp.tracking_worker`), a process that owns the job's MLflow run and sends it with
MlflowClient.log_batch. The client API is used instead of mlflow's fluent API, whose
process-global active-run stack would leak from one job into the next under Hydra's basic launcher.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lsexp import device, tracking_worker
from lsexp.config import dataset_name, model_name, run_name, strategy, world_size
from lsexp.store import (TrackingError, check_reachable, client_for, configured_uri, ensure_experiment, log_params,
                         redact, resolve_uri, with_retry)

PARENT_FILE = ".lsexp_parent_run_id"
SWEPT_FILE = ".lsexp_swept_keys"
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def _start_dir() -> str:
    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


def exit_if_unreachable(uri: Optional[str]) -> None:
    """check_reachable for the command line: the one-line error, then exit 2."""
    try:
        check_reachable(configured_uri(uri))
    except TrackingError as err:
        print(f"lsexp: tracking error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


# --- one run -----------------------------------------------------------------------------------
def flat_params(cfg: DictConfig) -> Dict[str, str]:
    """The resolved config as dot keys (no hydra section, no credentials)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("hydra", None)
    out: Dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            out[prefix] = redact(str(node)) if prefix == "tracking.uri" else str(node)

    walk("", container)
    out["world_size"] = str(world_size(cfg))  # the ranks that trained this run (data parallel), else 1
    return out


def run_tags(cfg: DictConfig) -> Dict[str, str]:
    from importlib.metadata import version

    return {
        "lsexp.strategy": strategy(cfg),
        "lsexp.engine": cfg.engine.name,
        "lsexp.amp_level": cfg.amp.level,
        "lsexp.device_target": device.resolve_target(str(cfg.device.device_target)),  # what `auto` becomes
        "lsexp.model": model_name(cfg),
        "lsexp.dataset": dataset_name(cfg),
        "lsexp.mindspore_version": version("mindspore"),
    }


def _config_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML, with tracking.uri's credentials dropped."""
    shown = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    if shown.tracking.get("uri"):
        shown.tracking.uri = redact(shown.tracking.uri)
    return OmegaConf.to_yaml(shown)


class _NoTracker:
    def send_steps(self, history) -> None:
        pass


class _WorkerTracker:
    """The job's side of the tracking worker: sends the history as it grows, waits at the end."""

    def __init__(self, cfg: DictConfig, out_dir: Path):
        self.worker = tracking_worker.claim()
        tags = run_tags(cfg)
        parent = _sweep_parent_run_id()
        name = cfg.tracking.run_name or run_name(cfg)
        if parent:
            tags["mlflow.parentRunId"] = parent
            tags["lsexp.overrides"] = redact(" ".join(HydraConfig.get().overrides.task))
            # The UI's run column cuts long names: a sweep's children are named by what differs.
            name = cfg.tracking.run_name or _swept_choices() or name
        self._send(op="open", uri=cfg.tracking.uri, start_dir=_start_dir(), out_dir=str(out_dir),
                   experiment_name=cfg.tracking.experiment_name, run_name=name, tags=tags, params=flat_params(cfg))
        (out_dir / "config.yaml").write_text(_config_yaml(cfg))  # an artifact: no credentials
        self.sent_rows = self.sent_eval = 0

    def _send(self, **msg: Any) -> None:
        # A worker that died (its error is already on stderr) must not stop the training;
        # `end` reports it once the job's own records are written.
        try:
            self.worker.send(**msg)
        except (BrokenPipeError, ValueError):
            pass

    def send_steps(self, history) -> None:
        rows, evals = history.rows[self.sent_rows:], history.epoch_eval[self.sent_eval:]
        if rows or evals:
            self._send(op="steps", rows=rows, epoch_eval=evals)
            self.sent_rows, self.sent_eval = len(history.rows), len(history.epoch_eval)

    def end(self, status: str, error: Optional[BaseException] = None) -> None:
        message = f"{type(error).__name__}: {error}" if error is not None else None
        self._send(op="finish", status=status, error=message)
        try:
            self.worker.messages.close()
        except BrokenPipeError:
            pass
        # A single run hands its run over: the supervisor waits for the worker while this process
        # tears down. A sweep's job waits, so the next job and the sweep's comparison find it closed.
        if self.worker.supervised and not _in_sweep():
            return
        if self.worker.wait() != 0:  # the worker has said why
            raise SystemExit(1)


@contextlib.contextmanager
def tracker(cfg: DictConfig, out_dir: Path) -> Iterator[Any]:
    """A tracker for one job. Its MLflow run always ends: FINISHED, KILLED on Ctrl-C / SIGTERM
    (or if this process dies), FAILED with the error recorded on anything else."""
    if cfg.tracking.backend == "none":
        tracking_worker.discard()
        yield _NoTracker()
        return
    run = _WorkerTracker(cfg, out_dir)
    try:
        yield run
    except KeyboardInterrupt:
        run.end("KILLED")
        raise
    except SystemExit as exit_:
        run.end("FAILED" if exit_.code else "FINISHED", exit_ if exit_.code else None)
        raise
    except BaseException as err:
        run.end("FAILED", err)
        raise
    else:
        run.end("FINISHED")


# --- sweeps -----------------------------------------------------------------------------------
def _in_sweep() -> bool:
    return HydraConfig.initialized() and str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def _sweep_parent_run_id() -> Optional[str]:
    if not _in_sweep():
        return None
    path = Path(HydraConfig.get().sweep.dir) / PARENT_FILE
    return path.read_text().strip() if path.exists() else None


def overrides_dict(overrides) -> Dict[str, str]:
    """Hydra overrides (`+a.b=1`, `amp=O2`) as key -> value, the add/delete prefixes dropped."""
    return dict(o.lstrip("+~").partition("=")[::2] for o in overrides)


def _swept_choices() -> str:
    """This job's values of the keys its sweep varies, short enough for the UI's run column, which
    shows ~15 characters: a group's option alone (`O2 dynamic`), a key's last part with its value
    (`dynamic scale_window=20`)."""
    path = Path(HydraConfig.get().sweep.dir) / SWEPT_FILE
    swept = path.read_text().split() if path.exists() else []
    mine = overrides_dict(HydraConfig.get().overrides.task)
    return " ".join(mine[key] if "." not in key else f"{key.rsplit('.', 1)[1]}={mine[key]}"
                    for key in swept if key in mine)


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
        self.client = None
        self.run_id: Optional[str] = None
        self.study: Optional[str] = None
        self.uri = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # An early worker serves the first job only when the jobs run in this process and track.
        if config.tracking.backend != "mlflow" or OmegaConf.select(config, "hydra.launcher._target_") != BASIC_LAUNCHER:
            tracking_worker.discard()
        if config.tracking.backend != "mlflow":
            return
        # The store was checked by app.ValidateOnRunStart, which runs first, before the sweep directory exists.
        self.uri = resolve_uri(config.tracking.uri, _start_dir())
        # Created here, once, before any job: parallel jobs then find the schema and the
        # experiment in place instead of racing to migrate or create them.
        self.client = client_for(self.uri)
        experiment_id = ensure_experiment(self.client, config.tracking.experiment_name, self.uri)
        name = config.tracking.run_name or f"sweep-{Path(config.hydra.sweep.dir).name}"
        run = with_retry(self.client.create_run, experiment_id, run_name=name,
                         tags={"lsexp.sweep": "true", "lsexp.sweep_dir": str(Path(config.hydra.sweep.dir).resolve())})
        self.run_id = run.info.run_id
        self.study = config.get("study")
        if self.study:  # so that `lsexp report` redraws the study too
            with_retry(self.client.set_tag, self.run_id, "lsexp.study", self.study)
        log_params(self.client, self.run_id, {k: redact(v) for k, v in sweep_params(config).items()})
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(self.run_id)
        # A value list (a,b), a range or a choice is what the sweep varies; the jobs name themselves by it.
        swept = [k for k, v in sweep_params(config).items() if "," in v or re.match(r"^\w+\(", v)]
        (sweep_dir / SWEPT_FILE).write_text(" ".join(swept))
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
        from lsexp.report import sweep_report

        status = "KILLED" if interrupted else "FINISHED"
        try:
            out = sweep_dir / "comparison"
            children = sweep_report(self.client, run_id, out)
            for path in sorted(out.iterdir()):
                with_retry(self.client.log_artifact, run_id, str(path))
            if self.study and children:
                from lsexp import studies
                from lsexp.report import _labels

                for path in studies.write(self.study, self.client, children, _labels(children), sweep_dir / "study"):
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

