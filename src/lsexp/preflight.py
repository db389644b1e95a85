"""Preflight: the order in which a config's checks run, and the Hydra callback that runs them before
anything is written. Each package checks the keys it defines (`problems(cfg)`); validation gathers
every problem into one ConfigError, one line each, naming key, value and fix, and imports nothing
heavy. The probes of the network itself (lsexp.training.probes) follow, once the config passed.

A single run's config is validated in on_run_start, before Hydra creates its output directory, and its
network probed when the run starts (lsexp.app); a sweep's jobs are checked when they start.
"""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lsexp import amp, datasets, device, optimizers, schedules, strategies, taps
from lsexp.config import hydra_errors
from lsexp.config.errors import ConfigError, halting
from lsexp.config.facts import known_num_train
from lsexp.precision import keys as precision_keys
from lsexp.report import studies
from lsexp.scaleout import launchers, msrun
from lsexp.strategies import Strategy
from lsexp.tracking import uri
from lsexp.training import keys as train_keys
from lsexp.training.job import Checked
from lsexp.training.plan import plan_of


def validate(cfg: DictConfig) -> Strategy:
    """The run's strategy, or ConfigError naming every problem in cfg, in the order each group's keys
    are checked; imports nothing heavy."""
    p: List[str] = []
    try:
        strategy: Optional[Strategy] = strategies.resolve(cfg)
    except ConfigError as err:
        strategy, p = None, list(err.problems)
    plan = plan_of(cfg)
    p += amp.problems(cfg)
    if strategy is not None:
        p += strategy.problems(cfg)
    p += optimizers.loss_scale_problems(cfg)
    p += msrun.problems(cfg)
    p += taps.problems(cfg, plan)
    p += studies.problems(cfg)
    p += optimizers.problems(cfg)
    p += schedules.problems(cfg)
    p += datasets.problems(cfg)
    p += optimizers.token_problems(cfg)
    p += train_keys.problems(cfg)
    num_train = known_num_train(cfg) if not p else None
    if num_train is not None:  # the step count needs a sane dataset and train section
        p += train_keys.step_problems(cfg, plan, num_train)
    p += uri.problems(cfg)
    p += precision_keys.problems(cfg)
    p += device.problems(cfg)
    if p:
        raise ConfigError(p)
    return strategy


def check(cfg: DictConfig, validated: bool = False) -> Checked:
    """validate (unless on_run_start has), then the probes of the network the config needs
    (lsexp.training.probes): a checked run's strategy, plan, and what the probes built for the step."""
    from lsexp.training.probes import probe

    strategy = strategies.resolve(cfg) if validated else validate(cfg)
    plan = plan_of(cfg)
    return Checked(strategy, plan, probe(cfg, plan))


def _creatable(key: str, folder: str) -> None:
    from pathlib import Path

    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError([f"{key}={folder}: cannot create it ({err.strerror}); point {key} at a folder you "
                           f"can write"]) from None


def _reachable(cfg: DictConfig) -> None:
    if cfg.tracking.backend == "mlflow":
        from lsexp.tracking.run import refuse_if_unreachable

        refuse_if_unreachable(cfg.tracking.uri)


class ValidateOnRunStart(Callback):
    """Validates a single run (config, tracking store) before Hydra creates its output directory, and a
    sweep's jobs and tracking store before its sweep directory, so a refused command leaves nothing
    behind; what it raises, lsexp.app reports. Multirun jobs are checked when they start."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with halting():
            validate(config)
            _reachable(config)
            _creatable("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with halting():
            _check_sweep(config)
        _calibrate_before_the_jobs(config)


def _check_sweep(config: DictConfig) -> None:
    """What every job of a sweep shares: that each composes, the launcher, the baseline, the store, the
    resumed sweep and its folder."""
    from lsexp.sweep import baseline_problem, resume_problem

    problem = (hydra_errors.every_job_composes(config) or launchers.problem(config)
               or baseline_problem(config))
    if problem:
        raise ConfigError([problem])
    _reachable(config)
    problem = resume_problem(config)
    if problem:
        raise ConfigError([problem])
    _creatable("hydra.sweep.dir", config.hydra.sweep.dir)


def _calibrate_before_the_jobs(config: DictConfig) -> None:
    """device.onednn_max_cpu_isa=auto is measured here, once, while no job runs beside it; the jobs
    then read the cached decision. A config the jobs will refuse is not worth waiting for."""
    try:
        validate(config)
    except ConfigError:
        return
    device.onednn_isa(config.device)
