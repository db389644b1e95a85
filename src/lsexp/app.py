"""`python -m lsexp [overrides]`: compose, validate, then config -> device -> training -> tracking."""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from lsexp import families, launchers, paths
from lsexp.config import ConfigError, optimizer_loss_scale, register_configs, validate

log = logging.getLogger("lsexp")
# lsexp's conf/hydra/launcher/ray.yaml (and submitit_*) are checked against the plugin's schema of the
# same name, which Hydra 1.3 does and warns about (mixing the plugin's schema in explicitly fails: its
# plugin scanner loads the plugin's module a second time, a second class of the same name).
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")
register_configs()


def _exit_on_config_error(cfg: DictConfig) -> None:
    try:
        validate(cfg)
        if families.of("model", cfg.model._target_) is None or families.of("dataset", cfg.dataset._target_) is None:
            # A user's own model or data set: what its schema cannot tell, one traced batch does.
            from lsexp.training import trace_shapes

            trace_shapes(cfg)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


def _exit_unless_creatable(key: str, folder: str) -> None:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"lsexp: config error: {key}={folder}: cannot create it ({err.strerror}); "
              f"point {key} at a folder you can write", file=sys.stderr)
        raise SystemExit(2) from None


def _exit_on_unreachable_tracking(cfg: DictConfig) -> None:
    if cfg.tracking.backend == "mlflow":
        from lsexp.tracking import exit_if_unreachable

        exit_if_unreachable(cfg.tracking.uri)


class ValidateOnRunStart(Callback):
    """Checks a single run (config, tracking store) before Hydra creates its output directory,
    and a sweep's tracking store before its sweep directory, so a rejected command leaves nothing
    behind. Multirun jobs are checked by `run` itself."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_config_error(config)
        _exit_on_unreachable_tracking(config)
        _exit_unless_creatable("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problem = launchers.problem(config)
        if problem:
            print(f"lsexp: config error: {problem}", file=sys.stderr)
            raise SystemExit(2)
        _exit_on_unreachable_tracking(config)
        _exit_unless_creatable("hydra.sweep.dir", config.hydra.sweep.dir)
        _calibrate_before_the_jobs(config)


def _calibrate_before_the_jobs(config: DictConfig) -> None:
    """device.onednn_max_cpu_isa=auto is measured here, once, while no job runs beside it; the jobs
    then read the cached decision. A config the jobs will refuse is not worth waiting for."""
    try:
        validate(config)
    except ConfigError:
        return
    from lsexp.device import onednn_isa

    onednn_isa(config.device)


def _terminate_as_interrupt(signum, frame):
    # The first one only: a second Ctrl-C, or a kill of the whole process group (which the
    # supervisor also passes on), must not cut short the writing of the history and the run.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def run(cfg: DictConfig) -> dict:
    """One experiment: the validated config in, its summary out."""
    _exit_on_config_error(cfg)
    from lsexp.device import cpu_share, onednn_isa, threads_for

    jobs = _parallel_jobs()
    with open_dict(cfg):  # record what the optimizer really divides by, not "null"
        cfg.optimizer.loss_scale = optimizer_loss_scale(cfg)
        cfg.device.threads_num = threads_for(cfg.device.threads_num, jobs)
        # the cap `auto` stands for on this machine, so that runs say what they ran with (and
        # data-parallel ranks take it as given)
        cfg.device.onednn_max_cpu_isa = onednn_isa(cfg.device)
    with cpu_share(cfg.device.affinity_cpu_list, jobs) as cpus:
        with open_dict(cfg):
            cfg.device.affinity_cpu_list = cpus
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    if cfg.amp.level == "O0":
        log.warning("amp.level=O0 computes in float32, so no gradient overflows and the loss-scale "
                    "strategies behave alike; use amp=O2 or amp=O3 to see them differ")

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    # SIGTERM (a scheduler, `kill`) should end the run like Ctrl-C: history written, run marked KILLED.
    try:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    except ValueError:  # not the main thread (some launchers); Ctrl-C handling still applies
        pass
    try:
        summary = _track_and_train(cfg, out_dir)
    except KeyboardInterrupt:  # the history is written and the MLflow run ended by now
        # MindSpore turns Ctrl-C into SIGTERM, so the two cannot be told apart here.
        print(f"lsexp: interrupted; the history so far is in {out_dir}", file=sys.stderr)
        raise SystemExit(130) from None
    _report(summary, out_dir)
    return summary


def _parallel_jobs() -> int:
    """How many of this sweep's jobs run at once on this machine: joblib's n_jobs; for Ray and
    Slurm, as many as the CPUs each job reserves allow; 1 otherwise."""
    if not HydraConfig.initialized() or str(HydraConfig.get().mode) != "RunMode.MULTIRUN":
        return 1
    n_jobs = HydraConfig.get().launcher.get("n_jobs")
    if n_jobs is None:
        reserved = launchers.threads_per_job(HydraConfig.get().launcher)
        return max(1, (os.cpu_count() or 1) // reserved) if reserved else 1
    return (os.cpu_count() or 1) if n_jobs < 0 else int(n_jobs)


def _track_and_train(cfg: DictConfig, out_dir: Path) -> dict:
    from lsexp import device, parallel, tracking, training

    with tracking.tracker(cfg, out_dir) as tracker:
        if parallel.data_parallel(cfg):  # the ranks configure the device and train; this job tracks
            return _launch_ranks(cfg, out_dir, tracker)
        try:
            target = device.configure(cfg.device, cfg.train.mode)
        except ConfigError as err:
            print(err, file=sys.stderr)
            raise SystemExit(2) from None
        except (RuntimeError, ValueError) as err:
            print(f"lsexp: config error: device.device_target={cfg.device.device_target}: "
                  f"MindSpore cannot use it ({str(err).splitlines()[0]}); use device=cpu", file=sys.stderr)
            raise SystemExit(2) from None
        history = training.History(on_epoch=tracker.send_steps)
        try:
            summary = training.train(cfg, out_dir, history, target)
        except ConfigError as err:
            print(err, file=sys.stderr)
            raise SystemExit(2) from None
        finally:
            tracker.send_steps(history)
    return summary


def _launch_ranks(cfg: DictConfig, out_dir: Path, tracker) -> dict:
    from lsexp import parallel, training

    history = training.History()
    try:
        return parallel.launch(cfg, out_dir)
    except parallel.RankFailure as err:
        raise SystemExit(f"lsexp: parallel=data: {err}") from None
    finally:  # whatever rank 0 trained, also when the run was stopped or a rank died
        if (out_dir / "history.csv").exists():
            history.rows = training.read_history(out_dir / "history.csv")
            summary = out_dir / "summary.json"
            if summary.exists():
                import json

                history.epoch_eval = json.loads(summary.read_text()).get("epoch_eval", [])
        tracker.send_steps(history)


def _report(summary: dict, out_dir: Path) -> None:
    if summary["diverged"]:
        state = f"DIVERGED at step {summary['diverged_at_step']}"
    elif summary.get("collapsed"):
        state = f"COLLAPSED at step {summary['collapsed_at_step']}"
        print(f"lsexp: loss scale collapsed: at its floor {summary['collapse_floor']:g} the gradients overflowed "
              f"{summary['collapse_patience']} steps in a row (to step {summary['collapsed_at_step']}), so the "
              f"overflow is not the scale's doing; look for inf/nan in the forward pass or a too-high "
              f"optimizer.learning_rate, or try amp.dtype=bfloat16", file=sys.stderr)
    else:
        state = f"final loss {summary['final_loss']:.4f}"
    accuracy = f", eval accuracy {summary['eval_accuracy']:.3f}" if "eval_accuracy" in summary else ""
    log.info(
        "%s: %d steps, %s, final scale %g, %d overflow(s), %d skipped update(s)%s, %.1f steps/s -> %s",
        summary["run_name"], summary["steps"], state, summary["final_loss_scale"],
        len(summary["overflow_steps"]), summary["skipped_steps"], accuracy, summary["steps_per_second"] or 0,
        out_dir,
    )


def objective(cfg: DictConfig, summary: dict) -> float:
    """What a search sweeper optimises: train.objective, with a diverged or collapsed run (or one without a
    held-out split to score) as the worst value."""
    failed = summary["diverged"] or summary.get("collapsed", False)
    if cfg.train.objective == "eval_accuracy":
        return float(summary["eval_accuracy"]) if not failed and "eval_accuracy" in summary else 0.0
    loss = summary["final_loss"]
    return float(loss) if not failed and loss is not None else sys.float_info.max


@hydra.main(config_path=str(paths.conf_dir()), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return objective(cfg, run(cfg))
