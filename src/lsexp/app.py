"""`python -m lsexp [overrides]`: compose, check (lsexp.preflight), decide, then track and train."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from lsexp import preflight
from lsexp.config import hydra_errors, paths
from lsexp.config.errors import ConfigError, Halt, Refused
from lsexp.config.facts import shrinking_tokens
from lsexp.config.registry import register_configs
from lsexp.scaleout import launchers

log = logging.getLogger("lsexp")
_STARTED = time.time()  # what Hydra writes for this run is newer
# MindSpore writes a failed (or Ctrl-C'd) graph compile's analyze_fail.ir under $MS_OM_PATH/rank_N/om,
# the working directory by default: the user's folder. A job puts it in its own folder instead, unless
# the user chose a place.
_USER_OM_PATH = os.environ.get("MS_OM_PATH")
# lsexp's conf/hydra/launcher/ray.yaml (and submitit_*) are checked against the plugin's schema of the
# same name, which Hydra 1.3 does and warns about (mixing the plugin's schema in explicitly fails: its
# plugin scanner loads the plugin's module a second time, a second class of the same name).
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")
register_configs()


def _terminate_as_interrupt(signum, frame):
    # The first one only: a second Ctrl-C, or a kill of the whole process group (which the
    # supervisor also passes on), must not cut short the writing of the history and the run.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def run(cfg: DictConfig) -> dict:
    """One experiment: the composed config in, its summary out. The config is left as composed; what is
    decided at run time is a Decided beside it."""
    from lsexp.device.decided import decide

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    single = _single_run()
    try:
        checked = preflight.check(cfg, validated=single)  # on_run_start validated a single run
    except ConfigError as err:
        if single:
            _leave_nothing(out_dir)
        _exit(err)
    if cfg.amp.level == "O0":
        log.warning("amp.level=O0 computes in float32, so no gradient overflows and the loss-scale "
                    "strategies behave alike; use amp=O2 or amp=O3 to see them differ")
    if cfg.train.get("mean_over_tokens") is not None and shrinking_tokens(cfg) is None:
        log.warning("train.mean_over_tokens=%s with model.scaling=unit: unit scaling's cross-entropy takes "
                    "the batch's mean going forward only, so its gradients do not shrink with the batch; the "
                    "run's gradients are those of any batch size (docs/unit_scaling.md)",
                    cfg.train.mean_over_tokens)
    os.environ["MS_OM_PATH"] = _USER_OM_PATH or str(out_dir)
    # SIGTERM (a scheduler, `kill`) should end the run like Ctrl-C: history written, run marked KILLED.
    try:
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt), signal.getsignal(signal.SIGINT)
    except ValueError:  # not the main thread (some launchers); Ctrl-C handling still applies
        previous = None
    interrupted = False
    try:
        with decide(cfg, checked.strategy.optimizer_loss_scale, _parallel_jobs()) as decided:
            summary = _track_and_train(cfg, checked, decided, out_dir)
    except Refused as err:
        _exit(err)
    except KeyboardInterrupt:  # the history is written and the MLflow run ended by now
        interrupted = True
        # MindSpore turns Ctrl-C into SIGTERM, so the two cannot be told apart here.
        print(f"lsexp: interrupted; the history so far is in {out_dir}", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        # The handlers are the job's: a process that outlives it (a Ray worker, whose handler is its
        # own) stops its own way. A process that the interrupt ends keeps ignoring a second signal,
        # which the default handler would turn into a death by SIGTERM instead of exit 130.
        if previous is not None and not (interrupted and previous[0] in (signal.SIG_DFL, None)):
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
    _report(summary, out_dir)
    return summary


def _single_run() -> bool:
    return str(HydraConfig.get().mode) == "RunMode.RUN"


def _leave_nothing(out_dir: Path) -> None:
    """A single run refused by a probe of its network: Hydra has made its folder, with its .hydra/ and the
    job's log. What this run made goes: the .hydra/ it wrote (a copy an earlier run left is overwritten
    by then), the log while nothing is in it (an earlier run's keeps its lines), and the folders above it,
    up to the working directory, that held only it."""
    hydra = HydraConfig.get()
    log = out_dir / f"{hydra.job.name}.log"
    if log.is_file() and log.stat().st_size == 0:
        log.unlink()
    own = out_dir / hydra.output_subdir if hydra.output_subdir else None
    if own is not None and own.is_dir() and all(f.stat().st_mtime >= _STARTED for f in own.iterdir()):
        shutil.rmtree(own)
    top = Path(hydra.runtime.cwd).resolve()
    folder = out_dir.resolve()
    while folder != top and top in folder.parents and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


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


def _track_and_train(cfg: DictConfig, checked, decided, out_dir: Path) -> dict:
    from lsexp.scaleout import msrun
    from lsexp.tracking.run import resumed_job, tracker
    from lsexp.training import job
    from lsexp.training.history import History

    done = resumed_job(cfg, decided, out_dir)
    if done is not None:
        return done
    with tracker(cfg, out_dir, checked.strategy.name, decided) as run:
        if msrun.data_parallel(cfg):  # the ranks configure the device and train; this job tracks
            return _launch_ranks(cfg, decided, out_dir, run)
        history = History(on_epoch=run.send_steps)
        try:
            return job.run(cfg, checked, decided, out_dir, history)
        finally:
            run.send_steps(history)


def _launch_ranks(cfg: DictConfig, decided, out_dir: Path, run) -> dict:
    from lsexp.scaleout import msrun
    from lsexp.training.history import History, read_history

    history = History()
    try:
        return msrun.launch(cfg, decided, out_dir)
    except msrun.RankFailure as err:
        raise Refused(f"lsexp: parallel=data: {err}", exit_code=1) from None
    finally:  # whatever rank 0 trained, also when the run was stopped or a rank died
        if (out_dir / "history.csv").exists():
            history.rows = read_history(out_dir / "history.csv")
            summary = out_dir / "summary.json"
            if summary.exists():
                import json

                history.epoch_eval = json.loads(summary.read_text()).get("epoch_eval", [])
        run.send_steps(history)


def train_here(cfg: DictConfig, out_dir: Path, history=None) -> dict:
    """Train a composed config in this process, untracked, outside Hydra's run (a notebook, a test, a
    benchmark): the same checks, decisions and training as `python -m lsexp`, into out_dir."""
    from lsexp.device.decided import decide
    from lsexp.training import job
    from lsexp.training.history import History

    checked = preflight.check(cfg)
    with decide(cfg, checked.strategy.optimizer_loss_scale, 1) as decided:
        return job.run(cfg, checked, decided, out_dir, history or History())


def _report(summary: dict, out_dir: Path) -> None:
    if summary.get("resumed_from_store"):
        log.info("%s: finished in run %s with the same config (sweep.resume); not trained again",
                 summary["run_name"], summary["run_id"])
        return
    if summary["diverged"]:
        state = f"DIVERGED at step {summary['diverged_at_step']}"
    elif summary.get("collapsed"):
        state = f"COLLAPSED at step {summary['collapsed_at_step']}"
        print(
            f"lsexp: loss scale collapsed: at its floor {summary['collapse_floor']:g} the gradients "
            f"overflowed {summary['collapse_patience']} steps in a row (to step "
            f"{summary['collapsed_at_step']}), so the overflow is not the scale's doing; look for inf/nan "
            f"in the forward pass or a too-high optimizer.learning_rate, or try amp.dtype=bfloat16",
            file=sys.stderr,
        )
    else:
        state = f"final loss {summary['final_loss']:.4f}"
    accuracy = f", eval accuracy {summary['eval_accuracy']:.3f}" if "eval_accuracy" in summary else ""
    first = summary.get("first_nonfinite")
    if first:
        accuracy += (f", first inf/NaN in {first['layer']} ({first['pass']}) at step {first['step']}"
                     if first.get("layer") else f", first inf/NaN at step {first['step']} in no tapped layer")
    log.info(
        "%s: %d steps, %s, final scale %g, %d overflow(s), %d skipped update(s)%s, %.1f steps/s -> %s",
        summary["run_name"],
        summary["steps"],
        state,
        summary["final_loss_scale"],
        len(summary["overflow_steps"]),
        summary["skipped_steps"],
        accuracy,
        summary["steps_per_second"] or 0,
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
def _hydra_main(cfg: DictConfig) -> float:
    hydra_errors.job_begins()
    return objective(cfg, run(cfg))


def main() -> None:
    """`python -m lsexp [overrides]`: a config Hydra cannot compose, or one lsexp refuses before the run,
    is its lines on stderr and exit 2."""
    try:
        with hydra_errors.reported_in_one_line(sys.argv[1:]):
            _hydra_main()
    except Halt as halt:
        _exit(halt.refused)
    except Refused as err:
        _exit(err)


def _exit(err: Refused) -> NoReturn:
    if str(err):
        print(err, file=sys.stderr)
    raise SystemExit(err.exit_code) from None
