"""Preflight: everything lsexp checks before it writes a file or imports MindSpore, and the Hydra
callback that runs it. A config is checked once per run: a single run in on_run_start, before Hydra
creates its output directory (so a refused command leaves nothing behind), a sweep's job when it
starts. The checks gather every problem into one ConfigError, one line each, naming key, value and fix.

It sits just below the app because it asks every layer: the strategy its own problems, the device
target, the families their files and shapes, the studies their names, the launchers theirs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lsexp import casts, schedules, strategies
from lsexp.config import families, hydra_errors
from lsexp.config.errors import ConfigError
from lsexp.config.facts import batch_tokens, known_num_train, total_steps, world_size
from lsexp.config.schema import (
    AMP_DTYPES,
    AMP_LEVELS,
    MODES,
    OBJECTIVES,
    ON_SKIP,
    OVERFLOW_MODES,
    PARALLEL_MODES,
)
from lsexp.report import studies
from lsexp.runtime.device import device_problems
from lsexp.scaleout import launchers
from lsexp.strategies import Strategy, finite_positive
from lsexp.taps import PASSES
from lsexp.tracking.uri import redact
from lsexp.training.job import Checked
from lsexp.training.plan import Plan, plan_of


def validate(cfg: DictConfig) -> Strategy:
    """The run's strategy, or ConfigError naming every problem in cfg; imports nothing heavy."""
    p: List[str] = []
    try:
        strategy: Optional[Strategy] = strategies.resolve(cfg)
    except ConfigError as err:
        strategy, p = None, list(err.problems)

    if cfg.amp.level not in AMP_LEVELS:
        p.append(f"amp.level={cfg.amp.level}: unknown amp level; use one of {', '.join(AMP_LEVELS)}")
    if cfg.amp.dtype not in AMP_DTYPES:
        p.append(f"amp.dtype={cfg.amp.dtype}: unknown low-precision type; use float16 or bfloat16")
    p += casts.list_problems(cfg.amp)

    if strategy is not None:
        p += strategy.problems(cfg)
    opt_scale = cfg.optimizer.get("loss_scale")
    if opt_scale is not None and not finite_positive(opt_scale):
        p.append(f"optimizer.loss_scale={opt_scale}: must be a finite number > 0; leave it unset")
    par = cfg.parallel
    if par.parallel_mode not in PARALLEL_MODES:
        p.append(
            f"parallel.parallel_mode={par.parallel_mode}: use data_parallel (parallel=data) or stand_alone"
        )
    elif par.parallel_mode == "data_parallel":
        if par.workers < 1:
            p.append(f"parallel.workers={par.workers}: must be >= 1")
        if families.of("dataset", cfg.dataset._target_) is None:
            p.append(
                f"parallel=data with dataset._target_={cfg.dataset._target_}: a data set of your own cannot "
                f"be sharded by lsexp yet; use a built-in data set or parallel=none"
            )
        if not cfg.dataset.drop_remainder:
            p.append(
                "dataset.drop_remainder=false with parallel=data: every rank must take the same number "
                "of steps; set dataset.drop_remainder=true"
            )
        if cfg.train.mode != "graph":
            p.append(
                f"train.mode={cfg.train.mode} with parallel=data: data parallel runs in graph mode; "
                f"set train.mode=graph"
            )
    if cfg.inject.rank is not None and not 0 <= cfg.inject.rank < world_size(cfg):
        p.append(
            f"inject.rank={cfg.inject.rank}: there are ranks 0..{world_size(cfg) - 1}; "
            f"use one of them, or null for every rank"
        )
    p += _inject_problems(cfg)
    if cfg.study is not None:
        if cfg.study not in studies.available():
            p.append(f"study={cfg.study}: no such study; use one of {', '.join(studies.available())} or null")
    p += _recipe_problems(cfg)

    d = cfg.dataset
    if d.batch_size < 1:
        p.append(f"dataset.batch_size={d.batch_size}: must be >= 1; e.g. 32")
    workload = _workload_problems(cfg) if d.batch_size >= 1 else []
    p += workload
    if d.batch_size >= 1:
        p += _token_problems(cfg)

    t = cfg.train
    if t.epochs < 1:
        p.append(f"train.epochs={t.epochs}: must be >= 1; e.g. 10")
    if t.accumulate_steps < 1:
        p.append(f"train.accumulate_steps={t.accumulate_steps}: must be >= 1 micro-batch per optimizer step; "
                 f"1 turns accumulation off")
    if t.max_steps is not None and t.max_steps < 1:
        p.append(f"train.max_steps={t.max_steps}: must be >= 1, or null for no cap")
    if t.objective not in OBJECTIVES:
        p.append(f"train.objective={t.objective}: use one of {', '.join(OBJECTIVES)}")
    if t.mode not in MODES:
        p.append(f"train.mode={t.mode}: use graph or pynative")
    if t.collapse_patience is not None and t.collapse_patience < 1:
        p.append(
            f"train.collapse_patience={t.collapse_patience}: must be >= 1 step, or null to never stop early"
        )
    if t.save_checkpoint_steps is not None and t.save_checkpoint_steps < 1:
        p.append(f"train.save_checkpoint_steps={t.save_checkpoint_steps}: must be >= 1, or null")
    if t.resume is not None and not Path(t.resume).is_file():
        p.append(f"train.resume={t.resume}: no such checkpoint file; give the path of a checkpoint.ckpt")

    num_train = known_num_train(cfg) if not p else None
    if num_train is not None:  # the step count needs a sane dataset and train section
        p += step_problems(cfg, num_train)

    uri = cfg.tracking.uri
    if cfg.tracking.backend not in ("mlflow", "none"):
        p.append(f"tracking.backend={cfg.tracking.backend}: use tracking=mlflow or tracking=none")
    elif uri and not re.match(r"^(sqlite|https?|file|postgresql|mysql|mssql|databricks)[+a-z0-9]*:", uri):
        p.append(
            f"tracking.uri={redact(uri)}: not an MLflow tracking URI; use e.g. sqlite:///mlflow.db, "
            f"http://127.0.0.1:5000 or postgresql://user@host:5432/database"
        )

    p += _precision_problems(cfg)
    p += _overflow_mode_problems(cfg)
    p += device_problems(cfg.device)
    if p:
        raise ConfigError(p)
    return strategy


def _inject_problems(cfg: DictConfig) -> List[str]:
    """inject.layer's and telemetry.layers' keys, as far as the model's layers are not needed."""
    i, p = cfg.inject, []
    k = cfg.train.accumulate_steps
    if i["pass"] not in PASSES:
        p.append(f"inject.pass={i['pass']}: use forward (the layer's output) or backward (the gradient "
                 f"flowing into it)")
    if i.layer is not None:
        if not i.overflow_steps:
            p.append(f"inject.layer={i.layer} without inject.overflow_steps: name the steps to poison, "
                     f"e.g. inject.overflow_steps=[7]")
        if k > 1:
            p.append(f"inject.layer={i.layer} with train.accumulate_steps={k}: injection at a layer counts "
                     f"optimizer steps, not micro-batches; set train.accumulate_steps=1 or drop inject.layer")
    asks = plan_of(cfg).asks_of_layers
    if asks and cfg.train.mode != "graph":
        p.append(f"{' and '.join(asks)} with train.mode={cfg.train.mode}: the taps are in the compiled step; "
                 f"set train.mode=graph")
    if cfg.telemetry.layers and k > 1:
        p.append(f"telemetry.layers=true with train.accumulate_steps={k}: the taps measure one micro-batch; "
                 f"set train.accumulate_steps=1 or use telemetry=grads")
    return p


def _overflow_mode_problems(cfg: DictConfig) -> List[str]:
    """device.overflow_mode and device.status_check (lsexp.taps.saturation)."""
    mode = cfg.device.get("overflow_mode", "infnan")
    if mode not in OVERFLOW_MODES:
        return [f"device.overflow_mode={mode}: no such mode; use infnan (inf and NaN, as GPUs and CPUs "
                f"report an overflow) or saturation (Ascend's saturation mode, emulated)"]
    if mode != "saturation":
        return []
    p = []
    if cfg.amp.level == "O0":
        p.append("device.overflow_mode=saturation with amp.level=O0: float32 does not overflow where float16 "
                 "saturates; use amp=O2 (or amp=O1, O3)")
    if cfg.parallel.parallel_mode == "data_parallel":
        p.append("device.overflow_mode=saturation with parallel=data: the emulated status flag is not yet "
                 "reduced over the ranks; use parallel=none")
    if str(cfg.device.device_target) == "Ascend":
        p.append("device.overflow_mode=saturation with device=ascend: the chip has the mode itself; set "
                 "INF_NAN_MODE_ENABLE=0 (910B/C) and keep device.overflow_mode=infnan, or emulate it on CPU")
    return p


def _precision_problems(cfg: DictConfig) -> List[str]:
    """precision.* against lsexp.precision's recipes and formats."""
    from lsexp.precision.keys import AMAX_COMPUTE_ALGOS, FP8_FORMATS, MX_BLOCK_SIZES, RECIPES, ROUNDINGS

    pr, p = cfg.get("precision"), []
    if pr is None or pr.recipe == "none":
        return p
    if pr.recipe not in RECIPES:
        return [f"precision.recipe={pr.recipe}: no such recipe; use one of {', '.join(RECIPES)} "
                f"(conf/precision/: fp8_delayed, fp8_current, mxfp8, hif8_current)"]
    if pr.fp8_format not in FP8_FORMATS:
        p.append(f"precision.fp8_format={pr.fp8_format}: no such format; use one of {', '.join(FP8_FORMATS)}")
    if pr.recipe == "delayed":
        if pr.margin < 0:
            p.append(f"precision.margin={pr.margin}: must be >= 0 (the scale is 2^-margin * FP8_MAX / amax)")
        if pr.amax_history_len < 1:
            p.append(f"precision.amax_history_len={pr.amax_history_len}: must be >= 1 step; TE's default "
                     f"is 1024")
        if pr.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            p.append(f"precision.amax_compute_algo={pr.amax_compute_algo}: use one of "
                     f"{', '.join(AMAX_COMPUTE_ALGOS)}")
    if pr.recipe == "mx":
        if pr.block_size not in MX_BLOCK_SIZES:
            p.append(f"precision.block_size={pr.block_size}: OCP MX v1.0 defines blocks of "
                     f"{', '.join(map(str, MX_BLOCK_SIZES))} elements only; set precision.block_size=32")
        if pr.fp8_format == "HIF8":
            p.append("precision.fp8_format=HIF8 with precision.recipe=mx: MX's elements are OCP FP8; use "
                     "HYBRID, E4M3 or E5M2, or precision=hif8_current")
        if pr.rounding not in ROUNDINGS:
            p.append(f"precision.rounding={pr.rounding}: use one of {', '.join(ROUNDINGS)}")
    if cfg.amp.level == "O0":
        p.append(f"precision={pr.recipe} with amp.level=O0: nothing runs in low precision for the recipe to "
                 f"scale; use amp=O2 (or amp=O1, O3)")
    return p


def tap_problems(cfg: DictConfig, plan: Plan, net) -> List[str]:
    """inject.layer and telemetry.layers against the network's layers (lsexp.taps.layers), and a
    precision recipe against its matrix products."""
    from lsexp.taps.layers import NoLayers, layer_names

    unknown = casts.name_problems(cfg.amp, net)
    if unknown:
        return [unknown]
    if plan.precision is not None:
        from lsexp.precision.recipes import products

        if not products(net):
            return [f"precision={plan.precision} with model._target_={cfg.model._target_}: the model has "
                    f"no nn.Dense or nn.Conv2d for the recipe to quantise; use precision=none"]

    asks = plan.asks_of_layers
    if not asks:
        return []
    try:
        names = layer_names(net)
    except NoLayers as err:
        return [f"{' and '.join(asks)} with model._target_={cfg.model._target_}: {err}"]
    if plan.inject_layer is not None and plan.inject_layer not in names:
        return [f"inject.layer={plan.inject_layer}: model._target_={cfg.model._target_} has no such layer; "
                f"use one of {', '.join(names)} (lsexp layers lists them)"]
    return []


def step_problems(cfg: DictConfig, num_train: int) -> List[str]:
    """What needs the run's step count: known here for lsexp's data sets, after building for a user's."""
    n, p = total_steps(cfg, num_train), []
    k = cfg.train.accumulate_steps
    if n < 1 and k > 1:
        micro = num_train // (cfg.dataset.batch_size * world_size(cfg))
        p.append(f"train.accumulate_steps={k}: more micro-batches than an epoch's {micro} of "
                 f"dataset.batch_size={cfg.dataset.batch_size}; lower it to <= {micro}")
        return p
    if n < 1:
        p.append(f"dataset.batch_size={cfg.dataset.batch_size}: larger than the data, so the run has no step")
        return p
    p += _schedule_problems(cfg, n)
    # injection counts micro-batches (k per optimizer step), histograms optimizer steps
    for key, last, (unit, units) in (
        ("inject.overflow_steps", n * k, ("micro-batch", "micro-batches") if k > 1 else ("step", "steps")),
        ("telemetry.histogram_steps", n, ("step", "steps")),
    ):
        steps = list(OmegaConf.select(cfg, key))
        outside = [s for s in steps if not 1 <= s <= last]
        if outside:
            p.append(
                f"{key}={steps}: {unit}(s) {outside} are outside this run's {units} 1..{last}; pick "
                f"{units} in that range or raise train.max_steps"
            )
    return p


def _recipe_problems(cfg: DictConfig) -> List[str]:
    """The optimizer's and the schedule's keys, as far as the run's step count is not needed."""
    o, p = cfg.optimizer, []
    if not finite_positive(o.learning_rate):
        p.append(f"optimizer.learning_rate={o.learning_rate}: must be a finite number > 0")
    if o.weight_decay < 0:
        p.append(f"optimizer.weight_decay={o.weight_decay}: must be >= 0; e.g. 0.01")
    if o.clip_grad_norm is not None and not finite_positive(o.clip_grad_norm):
        p.append(f"optimizer.clip_grad_norm={o.clip_grad_norm}: must be a finite number > 0, e.g. 1.0, "
                 f"or null for no clipping")
    family = families.of("optimizer", o._target_)
    p += list(getattr(family, "problems", lambda _: [])(cfg))
    ls = cfg.lr_schedule
    if ls.on_skip not in ON_SKIP:
        p.append(f"lr_schedule.on_skip={ls.on_skip}: use hold (a skipped update holds the schedule) or "
                 f"advance (it moves every step)")
    for key in ("warmup_steps", "total_steps"):
        if ls.get(key) is not None and ls[key] < (0 if key == "warmup_steps" else 1):
            p.append(f"lr_schedule.{key}={ls[key]}: must be >= {0 if key == 'warmup_steps' else 1}, "
                     f"or null for the default")
    return p


def _token_problems(cfg: DictConfig) -> List[str]:
    """train.mean_over_tokens: a token count no smaller than the step's own, with an optimizer whose float32
    update a correction keeps (lsexp.optimizers.divisor_correction)."""
    from lsexp.optimizers import divisor_correction

    n = cfg.train.get("mean_over_tokens")
    if n is None:
        return []
    own = batch_tokens(cfg)
    if n < own:
        return [f"train.mean_over_tokens={n}: below the {own} tokens a step already averages (world size x "
                f"train.accumulate_steps x dataset.batch_size, x dataset.seq_len for a language model); use "
                f">= {own}, or null for the batch's own count"]
    p = []
    if divisor_correction(cfg.optimizer) is None:
        p.append(f"train.mean_over_tokens={n} with optimizer._target_={cfg.optimizer._target_}: no "
                 f"correction keeps its float32 update unchanged; use optimizer=adamw, adam, momentum or "
                 f"sgd, or train.mean_over_tokens=null")
    if cfg.optimizer.clip_grad_norm is not None:
        p.append(f"train.mean_over_tokens={n} with optimizer.clip_grad_norm={cfg.optimizer.clip_grad_norm}: "
                 f"the clip would see the smaller gradients; set optimizer.clip_grad_norm=null")
    return p


def _schedule_problems(cfg: DictConfig, n: int) -> List[str]:
    """The schedule's steps against the run's n optimizer steps."""
    ls, p = cfg.lr_schedule, []
    total = schedules.total_of(ls, n)
    if ls.get("total_steps") is not None and total < n:
        p.append(f"lr_schedule.total_steps={total}: smaller than this run's {n} optimizer steps, so the "
                 f"schedule would end before the run; raise it to >= {n} or leave it null")
    if "warmup_steps" in ls and schedules.warmup_of(ls, total) >= total:
        p.append(f"lr_schedule.warmup_steps={ls.warmup_steps}: the warm-up must end before the schedule's "
                 f"{total} steps; lower it below {total}")
    return p


def _workload_problems(cfg: DictConfig) -> List[str]:
    """The data set's files and keys, then whether the model can take what the data set gives."""
    dataset, model = families.of("dataset", cfg.dataset._target_), families.of("model", cfg.model._target_)
    p = list(getattr(dataset, "problems", lambda _: [])(cfg))
    if p:  # the model's sizes come from the data set, so they mean nothing yet
        return p
    try:
        m = OmegaConf.to_container(cfg.model, resolve=True)
    except OmegaConfBaseException as err:
        key = re.search(r"dataset\.(\w+)", str(err))
        kind = (
            "model=transformer for token data"
            if "vocab_size" in cfg.dataset
            else "an image model, e.g. model=resnet"
        )
        return [
            f"model._target_={cfg.model._target_}: takes dataset.{key.group(1) if key else '?'}, which "
            f"dataset._target_={cfg.dataset._target_} does not have; pick a model made for this "
            f"data set: {kind}"
        ]
    if m.get("num_class", 1) < 1:
        p.append(f"model.num_class={m['num_class']}: a classifier needs >= 1 class; leave it to the data set")
    for key, data_key in (("num_channel", "num_channel"), ("image_size", "image_size")):
        if key in m and data_key in cfg.dataset and m[key] != cfg.dataset[data_key]:
            p.append(
                f"model.{key}={m[key]} but dataset.{data_key}={cfg.dataset[data_key]}: the model would not "
                f"fit the data; set them equal, or leave model.{key} to follow the data set"
            )
    if model is not None and not p:
        p += getattr(model, "problems", lambda _: [])(cfg)
    return p


def trace_shapes(cfg, strategy: Strategy):
    """Build the data and the network and run two samples forward, eagerly (PyNative), so that a
    network that cannot take the data fails with one line before anything is written. Returns the
    (data, network) for the run to train, so that neither is built twice."""
    from lsexp.models.loss import SoftmaxCrossEntropy
    from lsexp.runtime import device
    from lsexp.training.build import load_data, network

    device.configure(cfg.device, "pynative", cfg.device.threads_num, device.onednn_isa(cfg.device))
    try:
        data = load_data(cfg)
        x, y = next(iter(data.batches(cfg.dataset, 0, 0)))
        net = network(cfg)
        SoftmaxCrossEntropy()(net(x[:2]), y[:2])
    except Exception as err:  # MindSpore's shape and type errors, a user's own exceptions
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ConfigError(
            [
                f"model._target_={cfg.model._target_} with dataset._target_={cfg.dataset._target_}: "
                f"{first}; make the model take the data set's batches"
            ]
        ) from None
    # Only now is a user's data set's size known: the checks validate() could not make for it.
    problems = step_problems(cfg, data.num_train)
    if problems:
        raise ConfigError(problems)
    return data, net


def check(cfg: DictConfig) -> Checked:
    """validate, then, for a model or data set lsexp has no schema for, one traced batch."""
    strategy = validate(cfg)
    if cfg.amp.dtype == "bfloat16" and cfg.amp.level != "O0":
        from lsexp.training.build import bfloat16_refusal

        refusal = bfloat16_refusal(cfg)
        if refusal:
            raise ConfigError([refusal])
    own = (families.of("model", cfg.model._target_) is None
           or families.of("dataset", cfg.dataset._target_) is None)
    probed = trace_shapes(cfg, strategy) if own else None
    plan = plan_of(cfg)
    if plan.probes_network:  # from the network itself
        from lsexp.training.build import network

        problems = tap_problems(cfg, plan, probed[1] if probed else network(cfg))
        if problems:
            raise ConfigError(problems)
    return Checked(strategy, plan, probed)


_single_run: Optional[Checked] = None  # what on_run_start checked, for the run that follows it


def checked_or_exit(cfg: DictConfig) -> Checked:
    """The run's Checked: the one on_run_start made for a single run, else checked now; a config error
    is its lines on stderr and exit 2."""
    global _single_run
    if _single_run is not None:
        found, _single_run = _single_run, None
        return found
    try:
        return check(cfg)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


def _exit_unless_creatable(key: str, folder: str) -> None:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(
            f"lsexp: config error: {key}={folder}: cannot create it ({err.strerror}); "
            f"point {key} at a folder you can write",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def _exit_on_unreachable_tracking(cfg: DictConfig) -> None:
    if cfg.tracking.backend == "mlflow":
        from lsexp.tracking.run import exit_if_unreachable

        exit_if_unreachable(cfg.tracking.uri)


class ValidateOnRunStart(Callback):
    """Checks a single run (config, tracking store) before Hydra creates its output directory,
    and a sweep's tracking store before its sweep directory, so a rejected command leaves nothing
    behind. Multirun jobs are checked when they start (lsexp.app.run)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _single_run
        _single_run = None
        found = checked_or_exit(config)
        _exit_on_unreachable_tracking(config)
        _exit_unless_creatable("hydra.run.dir", config.hydra.run.dir)
        _single_run = found

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from lsexp.sweep import baseline_problem, resume_problem

        problem = (hydra_errors.every_job_composes(config) or launchers.problem(config)
                   or baseline_problem(config))
        if problem:
            print(f"lsexp: config error: {problem}", file=sys.stderr)
            raise SystemExit(2)
        _exit_on_unreachable_tracking(config)
        problem = resume_problem(config)
        if problem:
            print(f"lsexp: config error: {problem}", file=sys.stderr)
            raise SystemExit(2)
        _exit_unless_creatable("hydra.sweep.dir", config.hydra.sweep.dir)
        _calibrate_before_the_jobs(config)


def _calibrate_before_the_jobs(config: DictConfig) -> None:
    """device.onednn_max_cpu_isa=auto is measured here, once, while no job runs beside it; the jobs
    then read the cached decision. A config the jobs will refuse is not worth waiting for."""
    try:
        validate(config)
    except ConfigError:
        return
    from lsexp.runtime.device import onednn_isa

    onednn_isa(config.device)
