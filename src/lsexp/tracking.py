"""MLflow tracking: one run per job, one parent run per Hydra sweep.

Nothing is logged per step (per-step logging costs ~7 ms a step here, ~10% of a LeNet step):
the job keeps its history on the host and hands it, once per epoch, to a worker process that
owns the job's MLflow run and sends it with MlflowClient.log_batch. The client API is used
instead of mlflow's fluent API, whose process-global active-run stack would leak from one job
into the next under Hydra's basic launcher.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lsexp.config import dataset_name, model_name, redact, run_name, strategy

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # without it MLflow 3's UI opens on its GenAI page
PARENT_FILE = ".lsexp_parent_run_id"
MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call
MAX_PARAMS_PER_BATCH = 100


class TrackingError(Exception):
    """The tracking store cannot be used; str() is the one-line message for the user."""


# --- store ------------------------------------------------------------------------------------
def resolve_uri(uri: Optional[str], start_dir: Optional[str] = None) -> str:
    """The configured URI or MLflow's default, with a relative SQLite path made absolute against
    the directory the command was started from (jobs of a sweep may run elsewhere)."""
    if not uri:
        import mlflow

        uri = mlflow.get_tracking_uri()
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(start_dir or _start_dir(), uri[len(prefix):]).resolve())
    return uri


def _start_dir() -> str:
    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


def configured_uri(uri: Optional[str]) -> str:
    """The URI a run will use, as far as it is known without importing mlflow (MLflow's own
    precedence: the argument, then $MLFLOW_TRACKING_URI, then its default store)."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


def check_reachable(uri: str) -> None:
    """Fail fast, in one line, instead of MLflow's minutes of HTTP retries."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as reply:
            reply.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"tracking.uri={redact(uri)}: cannot reach the MLflow server ({reason}); start it "
            f"(mlflow server --host 127.0.0.1 --port 5000), fix the URI, or use tracking=none"
        ) from None


def exit_if_unreachable(uri: Optional[str]) -> None:
    """check_reachable for the command line: the one-line error, then exit 2."""
    try:
        check_reachable(configured_uri(uri))
    except TrackingError as err:
        print(f"lsexp: tracking error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def with_retry(fn, *args, **kwargs):
    """Call an MLflow client method, waiting out SQLite's 'database is locked' when parallel
    jobs write to one file."""
    for attempt in range(12):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # MlflowException or sqlalchemy OperationalError, depending on the path
            if "locked" not in str(err).lower() or attempt == 11:
                raise
            time.sleep(min(0.05 * 2**attempt, 2.0) * (1 + random.random()))


def client_for(uri: str):
    from mlflow.tracking import MlflowClient

    for attempt in range(5):
        try:
            return with_retry(MlflowClient, tracking_uri=uri)
        except Exception as err:  # another process is creating the same new SQLite store
            if "already exists" not in str(err).lower() or attempt == 4:
                raise
            time.sleep(0.5)


def ensure_experiment(client, name: str, uri: str) -> str:
    experiment = with_retry(client.get_experiment_by_name, name)
    if experiment is not None:
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # made elsewhere: open it on the runs table too
            with_retry(client.set_experiment_tag, experiment.experiment_id, EXPERIMENT_KIND_TAG,
                       "custom_model_development")
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        # Keep artifacts next to the database file rather than in whatever directory ran first.
        location = (Path(uri[len("sqlite:///"):]).parent / "mlruns").resolve().as_uri()
    try:
        return with_retry(client.create_experiment, name, artifact_location=location,
                          tags={EXPERIMENT_KIND_TAG: "custom_model_development"})
    except Exception as err:
        if "already exists" not in str(err).lower():  # another job created it first
            raise
        return with_retry(client.get_experiment_by_name, name).experiment_id


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
    return out


def run_tags(cfg: DictConfig, target: str) -> Dict[str, str]:
    from importlib.metadata import version

    return {
        "lsexp.strategy": strategy(cfg),
        "lsexp.amp_level": cfg.amp.level,
        "lsexp.device_target": target,
        "lsexp.model": model_name(cfg),
        "lsexp.dataset": dataset_name(cfg),
        "lsexp.mindspore_version": version("mindspore"),
    }


class MlflowRun:
    """One job's MLflow run. It lives in the tracking worker process (see `tracker`)."""

    def __init__(self, uri: str, start_dir: str, experiment_name: str, run_name: str, tags: Dict[str, str],
                 params: Dict[str, str]):
        from mlflow.entities import Param

        uri = resolve_uri(uri, start_dir)
        self.client = client_for(uri)
        experiment_id = ensure_experiment(self.client, experiment_name, uri)
        self.run_name = run_name
        self.run_id = with_retry(self.client.create_run, experiment_id, tags=tags, run_name=run_name).info.run_id
        params_ = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(params_), MAX_PARAMS_PER_BATCH):
            with_retry(self.client.log_batch, self.run_id, params=params_[i:i + MAX_PARAMS_PER_BATCH])
        self.rows: List[dict] = []

    def log_steps(self, rows: List[dict], epoch_accuracy: List[dict]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(row[key]), now, row["step"])
                   for row in rows for key in ("loss", "loss_scale", "overflow")]
        metrics += [Metric("eval_accuracy", e["eval_accuracy"], now, e["step"]) for e in epoch_accuracy]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            with_retry(self.client.log_batch, self.run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])
        self.rows += rows

    def finish(self, out_dir: Path, status: str, error: Optional[str]) -> None:
        """Summary metrics, tags and artifacts from what the job left in out_dir; then end the run."""
        from mlflow.entities import Metric, RunTag

        try:
            summary = _read_json(out_dir / "summary.json")
            now, step = int(time.time() * 1000), summary.get("steps", 0)
            metrics = [Metric(key, float(summary[key]), now, step)
                       for key in ("skipped_steps", "final_loss", "final_loss_scale", "steps_per_second",
                                   "diverged_at_step") if summary.get(key) is not None]
            if "overflow_steps" in summary:
                metrics.append(Metric("overflow_count", float(len(summary["overflow_steps"])), now, step))
            tags = [RunTag("lsexp.diverged", str(bool(summary.get("diverged"))).lower())]
            if summary.get("device_target"):
                tags.append(RunTag("lsexp.device_target", summary["device_target"]))
            if error:
                tags += [RunTag("lsexp.error", error[:5000]), RunTag("mlflow.note.content", f"Run failed: {error[:5000]}")]
            with_retry(self.client.log_batch, self.run_id, metrics=metrics, tags=tags)
            if self.rows:
                from lsexp.report import plot_run

                plot_run(self.rows, self.run_name, out_dir / "loss_scale.png")
            for name in ("config.yaml", "history.csv", "summary.json", "loss_scale.png"):
                if (out_dir / name).exists():
                    with_retry(self.client.log_artifact, self.run_id, str(out_dir / name))
        finally:
            with_retry(self.client.set_terminated, self.run_id, status)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _worker() -> int:
    """`python -m lsexp.tracking`: serve one job's MLflow run from JSON lines on stdin.

    The job's process hands MLflow to this process so that importing mlflow, opening the store
    and drawing the figure overlap with MindSpore's import and graph compilation on the other
    core instead of adding to the run's wall time. It also means the run is ended (KILLED) even
    when the job's process dies without a word: stdin then closes."""
    os.nice(5)  # let training win when both want a core
    run: Optional[MlflowRun] = None
    out_dir: Optional[Path] = None
    # What the run ends as if the job's process goes away without saying: stdin just closes.
    status, error, code = "KILLED", "the lsexp process ended without closing its run", 0
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            if msg["op"] == "open":
                out_dir = Path(msg.pop("out_dir"))
                run = MlflowRun(**{k: v for k, v in msg.items() if k != "op"})
                from lsexp.report import plot_run

                # Load matplotlib and its fonts now, while the job trains, rather than after it.
                plot_run([{"step": 1, "loss": 1.0, "loss_scale": 1.0, "overflow": 1}], "", io.BytesIO())
            elif msg["op"] == "steps":
                run.log_steps(msg["rows"], msg["epoch_accuracy"])
            elif msg["op"] == "finish":
                status, error = msg["status"], msg.get("error")
                break
    except Exception as err:
        status, error, code = "FAILED", _one_line(err), 1
        print(f"lsexp: tracking error: {error}", file=sys.stderr)
    if run is not None:
        try:
            run.finish(out_dir, status, error)
        except Exception as err:
            print(f"lsexp: tracking error: {_one_line(err)}", file=sys.stderr)
            code = 1
    return code


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


class _NoTracker:
    def send_steps(self, history) -> None:
        pass


class _WorkerTracker:
    """The job's side of the tracking worker: sends the history as it grows, waits at the end."""

    def __init__(self, cfg: DictConfig, out_dir: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "lsexp.tracking"], stdin=subprocess.PIPE,
                                     text=True, start_new_session=True)  # Ctrl-C goes to the job, not here
        self.uri = configured_uri(cfg.tracking.uri)
        self.out_dir = out_dir
        tags = run_tags(cfg, str(cfg.device.device_target))
        parent = _sweep_parent_run_id()
        if parent:
            tags["mlflow.parentRunId"] = parent
            tags["lsexp.overrides"] = " ".join(HydraConfig.get().overrides.task)
        self._send(op="open", uri=cfg.tracking.uri, start_dir=_start_dir(), out_dir=str(out_dir),
                   experiment_name=cfg.tracking.experiment_name, run_name=cfg.tracking.run_name or run_name(cfg),
                   tags=tags, params=flat_params(cfg))
        (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self.sent_rows = self.sent_accuracy = 0

    def _send(self, **msg: Any) -> None:
        # A worker that died (its error is already on stderr) must not stop the training;
        # `end` reports it once the job's own records are written.
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def send_steps(self, history) -> None:
        rows, accuracy = history.rows[self.sent_rows:], history.epoch_accuracy[self.sent_accuracy:]
        if rows or accuracy:
            self._send(op="steps", rows=rows, epoch_accuracy=accuracy)
            self.sent_rows, self.sent_accuracy = len(history.rows), len(history.epoch_accuracy)

    def end(self, status: str, error: Optional[BaseException] = None) -> None:
        message = f"{type(error).__name__}: {error}" if error is not None else None
        self._send(op="finish", status=status, error=message)
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        if self.proc.wait() != 0:
            raise TrackingError(f"tracking.uri={redact(str(self.uri))}: the run was not fully logged to MLflow "
                                f"(see the line above); its records are in {self.out_dir}")


@contextlib.contextmanager
def tracker(cfg: DictConfig, out_dir: Path) -> Iterator[Any]:
    """A tracker for one job. Its MLflow run always ends: FINISHED, KILLED on Ctrl-C / SIGTERM
    (or if this process dies), FAILED with the error recorded on anything else."""
    if cfg.tracking.backend == "none":
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
def _sweep_parent_run_id() -> Optional[str]:
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if str(hc.mode) != "RunMode.MULTIRUN":
        return None
    path = Path(hc.sweep.dir) / PARENT_FILE
    return path.read_text().strip() if path.exists() else None


def sweep_params(config: DictConfig) -> Dict[str, str]:
    """What the sweep varies: command-line overrides plus an experiment's hydra.sweeper.params."""
    params: Dict[str, str] = {}
    for override in config.hydra.overrides.task:
        key, _, value = override.partition("=")
        params[key.lstrip("+~")] = value
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
        self.uri = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.tracking.backend != "mlflow":
            return
        exit_if_unreachable(config.tracking.uri)
        self.uri = resolve_uri(config.tracking.uri)
        from mlflow.entities import Param

        # Created here, once, before any job: parallel jobs then find the schema and the
        # experiment in place instead of racing to migrate or create them.
        self.client = client_for(self.uri)
        experiment_id = ensure_experiment(self.client, config.tracking.experiment_name, self.uri)
        name = config.tracking.run_name or f"sweep-{Path(config.hydra.sweep.dir).name}"
        run = with_retry(self.client.create_run, experiment_id, run_name=name,
                         tags={"lsexp.sweep": "true", "lsexp.sweep_dir": str(Path(config.hydra.sweep.dir).resolve())})
        self.run_id = run.info.run_id
        params = [Param(k, redact(v)) for k, v in sweep_params(config).items()]
        if params:
            with_retry(self.client.log_batch, self.run_id, params=params[:MAX_PARAMS_PER_BATCH])
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(self.run_id)
        # Hydra skips on_multirun_end when a job raises or the sweep is interrupted.
        atexit.register(self._close, sweep_dir, True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close(Path(config.hydra.sweep.dir), interrupted=False)

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
            if any(c.info.status == "FAILED" for c in children):
                status = "FAILED"
        except Exception as err:
            status = "FAILED"
            with_retry(self.client.set_tag, run_id, "lsexp.error", f"comparison failed: {err}"[:5000])
            if not interrupted:
                raise
        finally:
            with_retry(self.client.set_terminated, run_id, status)


if __name__ == "__main__":
    code = _worker()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is committed; skip the interpreter teardown (~0.5 s with mlflow and matplotlib
    # loaded), which the job would otherwise wait for.
    os._exit(code)
