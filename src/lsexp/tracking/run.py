"""MLflow tracking of one job: its run, opened, fed and ended through the tracking worker.

Nothing is logged per step (per-step logging costs ~7 ms a step here, ~10% of a LeNet step):
the job keeps its history on the host and hands it, once per epoch, to the tracking worker
(`lsexp.tracking.worker`), a process that owns the job's MLflow run and sends it with
MlflowClient.log_batch. The client API is used instead of mlflow's fluent API, whose
process-global active-run stack would leak from one job into the next under Hydra's basic launcher.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lsexp import device
from lsexp.config.errors import Refused
from lsexp.config.facts import dataset_name, model_name, run_name, world_size
from lsexp.config.overrides import overrides_dict
from lsexp.optimizers import divisor_params
from lsexp.tracking import protocol, resume
from lsexp.tracking import worker as tracking_worker
from lsexp.tracking.store import check_reachable, configured_uri
from lsexp.tracking.uri import TrackingError, redact

PARENT_FILE = ".lsexp_parent_run_id"  # in the sweep directory: the parent run the jobs' runs belong to
SWEPT_FILE = ".lsexp_swept_keys"  # and the keys the sweep varies, which name its jobs' runs
SEED_KEY = "train.seed"  # the one swept key that does not set a run's group


def start_dir() -> str:
    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


def refuse_if_unreachable(uri: Optional[str]) -> None:
    """check_reachable for the command line: a store that cannot be used is a refusal of one line."""
    try:
        check_reachable(configured_uri(uri))
    except TrackingError as err:
        raise Refused(f"lsexp: tracking error: {err}") from None


# --- one run -----------------------------------------------------------------------------------
def flat_params(cfg: DictConfig, decided=None) -> Dict[str, str]:
    """The resolved config as dot keys (no hydra section, no credentials), with the values decided at
    run time (lsexp.device.decided) in the keys they fill."""
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
    if decided is not None:
        out.update({key: str(value) for key, value in decided.params().items()})
    out["world_size"] = str(world_size(cfg))  # the ranks that trained this run (data parallel), else 1
    out.update(divisor_params(cfg))  # train.mean_over_tokens' correction of the optimizer
    return out


def run_tags(cfg: DictConfig, strategy: str) -> Dict[str, str]:
    from importlib.metadata import version

    return {
        "lsexp.strategy": strategy,
        "lsexp.engine": cfg.engine.name,
        "lsexp.amp_level": cfg.amp.level,
        "lsexp.device_target": device.resolve_target(str(cfg.device.device_target)),  # what `auto` becomes
        "lsexp.model": model_name(cfg),
        "lsexp.dataset": dataset_name(cfg),
        "lsexp.mindspore_version": version("mindspore"),
        "lsexp.seed": str(cfg.train.seed),
    }


def _config_yaml(cfg: DictConfig, decided=None) -> str:
    """The resolved config as YAML, with the values decided at run time, and tracking.uri's credentials
    dropped."""
    shown = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for key, value in (decided.params() if decided is not None else {}).items():
        OmegaConf.update(shown, key, value, force_add=True)
    if shown.tracking.get("uri"):
        shown.tracking.uri = redact(shown.tracking.uri)
    return OmegaConf.to_yaml(shown)


class _NoTracker:
    def send_steps(self, history) -> None:
        pass


class _WorkerTracker:
    """The job's side of the tracking worker: sends the history as it grows, waits at the end."""

    def __init__(self, cfg: DictConfig, out_dir: Path, strategy: str, decided):
        self.worker = tracking_worker.claim()
        tags = run_tags(cfg, strategy)
        parent = _sweep_parent_run_id()
        name = cfg.tracking.run_name or run_name(cfg, strategy)
        params = flat_params(cfg, decided)
        if parent:
            tags["mlflow.parentRunId"] = parent
            tags["lsexp.overrides"] = redact(" ".join(HydraConfig.get().overrides.task))
            # what sweep.resume finds the job's run by, and knows its config by
            tags[resume.JOB_TAG] = str(HydraConfig.get().job.num)
            tags[resume.FINGERPRINT_TAG] = resume.fingerprint(params)
            # Seeds of one setting share a group, which the report and the UI's "Group by" aggregate.
            tags["lsexp.group"] = sweep_group()
            # The UI's run column cuts long names: a sweep's children are named by what differs.
            name = cfg.tracking.run_name or _swept_choices() or name
        self._send(protocol.Open(uri=cfg.tracking.uri, start_dir=start_dir(), out_dir=str(out_dir),
                                 experiment_name=cfg.tracking.experiment_name, run_name=name, tags=tags,
                                 params=params))
        (out_dir / "config.yaml").write_text(_config_yaml(cfg, decided))  # an artifact: no credentials
        self.sent_rows = self.sent_eval = 0

    def _send(self, message: protocol.Message) -> None:
        # A worker that died (its error is already on stderr) must not stop the training;
        # `end` reports it once the job's own records are written.
        try:
            self.worker.send(message)
        except (BrokenPipeError, ValueError):
            pass

    def send_steps(self, history) -> None:
        rows, evals = history.rows[self.sent_rows:], history.epoch_eval[self.sent_eval:]
        if rows or evals:
            self._send(protocol.Steps(rows=rows, epoch_eval=evals))
            self.sent_rows, self.sent_eval = len(history.rows), len(history.epoch_eval)

    def end(self, status: str, error: Optional[BaseException] = None) -> None:
        message = f"{type(error).__name__}: {error}" if error is not None else None
        self._send(protocol.Finish(status=status, error=message))
        try:
            self.worker.messages.close()
        except BrokenPipeError:
            pass
        # A single run hands its run over: the supervisor waits for the worker while this process
        # tears down. A sweep's job waits, so the next job and the sweep's comparison find it closed.
        if self.worker.supervised and not in_sweep():
            return
        if self.worker.wait() != 0:  # the worker has said why
            raise Refused(exit_code=1)


@contextlib.contextmanager
def tracker(cfg: DictConfig, out_dir: Path, strategy: str, decided) -> Iterator[Any]:
    """A tracker for one job. Its MLflow run always ends: FINISHED, KILLED on Ctrl-C / SIGTERM
    (or if this process dies), FAILED with the error recorded on anything else."""
    if cfg.tracking.backend == "none":
        tracking_worker.discard()
        yield _NoTracker()
        return
    run = _WorkerTracker(cfg, out_dir, strategy, decided)
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
def resumed_job(cfg: DictConfig, decided, out_dir: Path) -> Optional[dict]:
    """With sweep.resume, a job whose run finished under the same config: its summary from the store,
    and nothing to train. None when the job trains (see lsexp.tracking.resume)."""
    parent = _sweep_parent_run_id()
    if not (cfg.sweep.resume and parent and cfg.tracking.backend == "mlflow"):
        return None
    from lsexp.tracking.store import client_for, resolve_uri

    client = client_for(resolve_uri(cfg.tracking.uri, start_dir()))
    label = " ".join(HydraConfig.get().overrides.task)
    return resume.decide(client, parent, HydraConfig.get().job.num, flat_params(cfg, decided), label, out_dir)


def in_sweep() -> bool:
    return HydraConfig.initialized() and str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def _sweep_parent_run_id() -> Optional[str]:
    if not in_sweep():
        return None
    path = Path(HydraConfig.get().sweep.dir) / PARENT_FILE
    return path.read_text().strip() if path.exists() else None


def _swept_choices() -> str:
    """This job's values of the keys its sweep varies, short enough for the UI's run column, which
    shows ~15 characters: a group's option alone (`O2 dynamic`), a key's last part with its value
    (`dynamic scale_window=20`)."""
    path = Path(HydraConfig.get().sweep.dir) / SWEPT_FILE
    swept = path.read_text().split() if path.exists() else []
    mine = overrides_dict(HydraConfig.get().overrides.task)
    return " ".join(mine[key] if "." not in key else f"{key.rsplit('.', 1)[1]}={mine[key]}"
                    for key in swept if key in mine)


def sweep_group() -> str:
    """This job's swept choices without the seed, in the order typed (`loss_scale=dynamic amp=O2`): the
    jobs that differ only in train.seed share it. A sweep of seeds alone is one group, `all`."""
    path = Path(HydraConfig.get().sweep.dir) / SWEPT_FILE
    swept = path.read_text().split() if path.exists() else []
    mine = overrides_dict(HydraConfig.get().overrides.task)
    return " ".join(f"{key}={mine[key]}" for key in swept if key in mine and key != SEED_KEY) or "all"
