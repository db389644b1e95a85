"""Typed schemas for every config group, and the checks that run before MindSpore is imported.

Each YAML option under conf/<group>/ names its schema in its defaults list, so a wrong type or
an unknown key fails at compose time with Hydra's own message. The cross-field rules that a
type cannot express live in `validate`, which gathers every problem into one ConfigError.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lsexp import families, paths
from lsexp.datasets import DatasetConfig
from lsexp.models import ModelConfig
from lsexp.store import redact

AMP_LEVELS = ("O0", "O1", "O2", "O3")
AMP_DTYPES = ("float16", "bfloat16")
MODES = ("graph", "pynative")
OBJECTIVES = ("final_loss", "eval_accuracy")
FIXED_MANAGER = "mindspore.amp.FixedLossScaleManager"
DYNAMIC_MANAGER = "mindspore.amp.DynamicLossScaleManager"
NO_SCALING = "mindspore.nn.TrainOneStepCell"
HYSTERESIS_MANAGER = "lsexp.hysteresis.HysteresisLossScaleManager"
DYNAMIC_STRATEGIES = ("dynamic", "dynamic_hysteresis")


# --- amp -------------------------------------------------------------------------------------
@dataclass
class AmpConfig:
    level: str = "O0"  # the `level` / `amp_level` of mindspore.amp.build_train_network / auto_mixed_precision
    dtype: str = "float16"


# --- loss_scale ------------------------------------------------------------------------------
@dataclass
class LossScaleConfig:
    _target_: str = MISSING


@dataclass
class FixedLossScaleConfig(LossScaleConfig):
    _target_: str = FIXED_MANAGER
    loss_scale: float = 128.0
    drop_overflow_update: bool = True


@dataclass
class NoLossScaleConfig(LossScaleConfig):
    """No loss scaling: MindSpore's plain TrainOneStepCell, sens 1, what ms.Model builds without a manager."""

    _target_: str = NO_SCALING


@dataclass
class DynamicLossScaleConfig(LossScaleConfig):
    _target_: str = DYNAMIC_MANAGER
    init_loss_scale: float = 2.0**24
    scale_factor: int = 2
    scale_window: int = 2000


@dataclass
class HysteresisLossScaleConfig(LossScaleConfig):
    """DeepSpeed's and Megatron's dynamic scaler: back off only after `hysteresis` overflows, never
    below min_loss_scale, never above max_loss_scale (Apex's 2^24; null: no cap)."""

    _target_: str = HYSTERESIS_MANAGER
    init_loss_scale: float = 2.0**16
    hysteresis: int = 2  # overflows until a back-off; 1 is MindSpore's DynamicLossScaleManager
    consecutive_hysteresis: bool = False  # restore the tolerance after any clean step, not only at growth
    min_loss_scale: float = 1.0
    max_loss_scale: Optional[float] = 2.0**24
    scale_factor: int = 2
    scale_window: int = 1000


# --- engine --------------------------------------------------------------------------------
@dataclass
class EngineConfig:
    """How a step is built: `_target_` is the builder that turns the loss_scale group into a train step."""

    _target_: str = MISSING
    name: str = MISSING  # cell or functional, as the run's params and names show it


# --- optimizer -------------------------------------------------------------------------------
@dataclass
class OptimizerConfig:
    _target_: str = MISSING
    learning_rate: float = 0.01
    weight_decay: float = 0.0
    # None: follow the strategy (the manager's scale for fixed_nodrop, 1.0 otherwise).
    loss_scale: Optional[float] = None


@dataclass
class MomentumConfig(OptimizerConfig):
    _target_: str = "mindspore.nn.Momentum"
    momentum: float = 0.9


# --- device, train, inject -------------------------------------------------------------------
@dataclass
class DeviceConfig:
    device_target: str = "CPU"  # CPU, GPU, Ascend or auto
    device_id: int = 0
    # mindspore.device_context.cpu.op_tuning.threads_num: MindSpore's CPU kernel threads. None: its
    # default, or the cores divided among the jobs when a sweep runs jobs in parallel (joblib n_jobs).
    threads_num: Optional[int] = None
    # oneDNN's ONEDNN_MAX_CPU_ISA, the newest instruction set its CPU kernels may use. None: all the
    # CPU has. On AVX-512 CPUs where oneDNN runs MindSpore's NCHW convolutions through a reference
    # loop (jit_uni_ncsp:conv+ref), AVX2 takes its GEMM kernels instead, at the cost of other roundings.
    # auto: whichever of the two a once-per-machine measurement found clearly faster (lsexp.onednn).
    onednn_max_cpu_isa: Optional[str] = "auto"
    # The cores the job's threads run on, as mindspore.runtime.set_cpu_affinity names them (which
    # binds on Ascend hosts only, from cgroup v1's cpuset). None: unbound, or, when a sweep runs jobs
    # side by side on one machine, a share of its cores that no other running job holds.
    affinity_cpu_list: Optional[List[int]] = None


@dataclass
class TrainConfig:
    epochs: int = 10
    max_steps: Optional[int] = None
    seed: int = 1
    mode: str = "graph"
    checkpoint: bool = False
    save_checkpoint_steps: Optional[int] = None
    resume: Optional[str] = None
    progress: bool = True
    # What a job returns to a search sweeper (hydra/sweeper=optuna): eval_accuracy (maximise) or
    # final_loss (minimise); a diverged run counts as the worst value.
    objective: str = "final_loss"
    # A dynamic strategy whose scale sits at its floor and overflows this many steps in a row stops
    # early with collapsed: true (null: never).
    collapse_patience: Optional[int] = 20


@dataclass
class TelemetryConfig:
    grads: bool = False  # per-step gradient norm and float16 underflow/overflow/zero fractions, in the step
    histogram_steps: List[int] = field(default_factory=list)  # log2|g| histograms and per-layer breakdown


@dataclass
class InjectConfig:
    overflow_steps: List[int] = field(default_factory=list)
    rank: Optional[int] = None  # with parallel=data: the one rank whose gradients are poisoned (None: all)


PARALLEL_MODES = ("stand_alone", "data_parallel")


@dataclass
class ParallelConfig:
    """mindspore.set_auto_parallel_context's parallel_mode and gradients_mean, and msrun's options."""

    parallel_mode: str = "stand_alone"
    workers: int = 1  # msrun --worker_num (all on this node)
    gradients_mean: bool = True
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    cluster_time_out: int = 300


@dataclass
class TrackingConfig:
    backend: str = "mlflow"
    uri: Optional[str] = None
    experiment_name: str = "lsexp"
    run_name: Optional[str] = None


@dataclass
class Config:
    model: ModelConfig = MISSING
    dataset: DatasetConfig = MISSING
    amp: AmpConfig = MISSING
    loss_scale: LossScaleConfig = MISSING
    engine: EngineConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    device: DeviceConfig = MISSING
    train: TrainConfig = MISSING
    tracking: TrackingConfig = MISSING
    inject: InjectConfig = field(default_factory=InjectConfig)
    parallel: ParallelConfig = MISSING
    telemetry: TelemetryConfig = MISSING
    # A sweep's own table and figure, drawn by lsexp.studies.<study> when the sweep ends (experiments/ set it).
    study: Optional[str] = None


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group in families.PACKAGES:
        for name, module in families.schemas(group).items():
            cs.store(group=group, name=f"base_{name}", node=module.SCHEMA)
    for group, name, node in [
        ("amp", "base_amp", AmpConfig),
        ("loss_scale", "base_fixed", FixedLossScaleConfig),
        ("loss_scale", "base_dynamic", DynamicLossScaleConfig),
        ("loss_scale", "base_none", NoLossScaleConfig),
        ("loss_scale", "base_dynamic_hysteresis", HysteresisLossScaleConfig),
        ("engine", "base_engine", EngineConfig),
        ("optimizer", "base_momentum", MomentumConfig),
        ("device", "base_device", DeviceConfig),
        ("train", "base_train", TrainConfig),
        ("tracking", "base_tracking", TrackingConfig),
        ("telemetry", "base_telemetry", TelemetryConfig),
        ("parallel", "base_parallel", ParallelConfig),
    ]:
        cs.store(group=group, name=name, node=node)
    # experiments/ sits at the top of the checkout; ConfigStore makes its files the options of
    # the `experiment` group, so `experiment=seed_blog` works from a checkout and from a wheel.
    for path in sorted(paths.experiments_dir().glob("*.yaml")):
        cs.store(group="experiment", name=path.stem, node=OmegaConf.load(path), package="_global_")


# --- derived facts the rest of the program shares --------------------------------------------
def strategy(cfg: DictConfig) -> str:
    """none, fixed_drop, fixed_nodrop, dynamic or dynamic_hysteresis: what the loss_scale group asks
    for, by content."""
    if cfg.loss_scale._target_ == NO_SCALING:
        return "none"
    if cfg.loss_scale._target_ == DYNAMIC_MANAGER:
        return "dynamic"
    if cfg.loss_scale._target_ == HYSTERESIS_MANAGER:
        return "dynamic_hysteresis"
    return "fixed_drop" if cfg.loss_scale.drop_overflow_update else "fixed_nodrop"


def manager_scale(cfg: DictConfig) -> float:
    ls, s = cfg.loss_scale, strategy(cfg)
    return 1.0 if s == "none" else float(ls.init_loss_scale if s in DYNAMIC_STRATEGIES else ls.loss_scale)


def scale_floor(cfg: DictConfig) -> Optional[float]:
    """The lowest scale a dynamic strategy backs off to (None for a constant scale): 1 for MindSpore's
    managers and scalers, min_loss_scale for dynamic_hysteresis."""
    s = strategy(cfg)
    if s == "dynamic":
        return 1.0
    return float(cfg.loss_scale.min_loss_scale) if s == "dynamic_hysteresis" else None


def optimizer_loss_scale(cfg: DictConfig) -> float:
    """The optimizer divides gradients by this; only fixed_nodrop leaves them scaled for it."""
    if cfg.optimizer.loss_scale is not None:
        return float(cfg.optimizer.loss_scale)
    return manager_scale(cfg) if strategy(cfg) == "fixed_nodrop" else 1.0


def world_size(cfg: DictConfig) -> int:
    return int(cfg.parallel.workers) if cfg.parallel.parallel_mode == "data_parallel" else 1


def steps_per_epoch(cfg: DictConfig, num_train: int) -> int:
    """Each of the world's ranks takes its own batch of dataset.batch_size at every step."""
    b = cfg.dataset.batch_size * world_size(cfg)
    return num_train // b if cfg.dataset.drop_remainder else -(-num_train // b)


def total_steps(cfg: DictConfig, num_train: int) -> int:
    steps = cfg.train.epochs * steps_per_epoch(cfg, num_train)
    return min(steps, cfg.train.max_steps) if cfg.train.max_steps is not None else steps


def known_num_train(cfg: DictConfig) -> Optional[int]:
    """The training-set size, from the config and the files' headers; None for a user's own data set."""
    family = families.of("dataset", cfg.dataset._target_)
    return family.num_train(cfg.dataset) if family is not None else None


def model_name(cfg: DictConfig) -> str:
    return cfg.model._target_.rsplit(".", 1)[-1].lower()


def dataset_name(cfg: DictConfig) -> str:
    return cfg.dataset._target_.rsplit(".", 1)[-1]


def run_name(cfg: DictConfig) -> str:
    engine = "" if cfg.engine.name == "cell" else f"-{cfg.engine.name}"  # the default engine goes unnamed
    return f"{model_name(cfg)}-{dataset_name(cfg)}-{cfg.amp.level}-{strategy(cfg)}{engine}"


# --- validation ------------------------------------------------------------------------------
class ConfigError(Exception):
    """Every problem found in one config; str() is one line per problem."""

    def __init__(self, problems: List[str]):
        self.problems = problems
        super().__init__("\n".join(f"lsexp: config error: {p}" for p in problems))


def _finite_positive(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _scale_ok(value: float) -> bool:
    # MindSpore's managers and scalers refuse a scale below 1 (ValueError at construction).
    return _finite_positive(value) and value >= 1


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming every problem in cfg; imports nothing heavy."""
    from lsexp.device import device_problems

    p: List[str] = []
    s = strategy(cfg)
    ls = cfg.loss_scale

    if cfg.amp.level not in AMP_LEVELS:
        p.append(f"amp.level={cfg.amp.level}: unknown amp level; use one of {', '.join(AMP_LEVELS)}")
    if cfg.amp.dtype not in AMP_DTYPES:
        p.append(f"amp.dtype={cfg.amp.dtype}: unknown low-precision type; use float16 or bfloat16")

    if s in DYNAMIC_STRATEGIES:
        if not _scale_ok(ls.init_loss_scale):
            p.append(f"loss_scale.init_loss_scale={ls.init_loss_scale}: must be a finite number >= 1 (MindSpore's "
                     f"managers refuse less); e.g. 65536")
        if ls.scale_factor <= 1:
            p.append(f"loss_scale.scale_factor={ls.scale_factor}: must be > 1, or the scale never recovers; e.g. 2")
        if ls.scale_window < 1:
            p.append(f"loss_scale.scale_window={ls.scale_window}: must be >= 1 step; e.g. 2000")
        if s == "dynamic_hysteresis":
            p += _hysteresis_problems(ls)
    elif s != "none" and not _scale_ok(ls.loss_scale):
        p.append(f"loss_scale.loss_scale={ls.loss_scale}: must be a finite number >= 1 (MindSpore's managers "
                 f"refuse less); e.g. 1024")

    opt_scale = cfg.optimizer.loss_scale
    if opt_scale is not None:
        if not _finite_positive(opt_scale):
            p.append(f"optimizer.loss_scale={opt_scale}: must be a finite number > 0; leave it unset")
        elif s == "fixed_nodrop" and _finite_positive(ls.loss_scale) and opt_scale != ls.loss_scale:
            p.append(
                f"optimizer.loss_scale={opt_scale} with loss_scale=fixed_nodrop (loss_scale.loss_scale="
                f"{ls.loss_scale}): every update would be scaled by {ls.loss_scale / opt_scale:g}; "
                f"set optimizer.loss_scale={ls.loss_scale} or leave it unset"
            )
        elif s != "fixed_nodrop" and opt_scale != 1:
            p.append(
                f"optimizer.loss_scale={opt_scale} with loss_scale={s}: the train step already divides "
                f"the gradients by the scale, so they would be divided twice; set optimizer.loss_scale=1 "
                f"or leave it unset"
            )
    par = cfg.parallel
    if par.parallel_mode not in PARALLEL_MODES:
        p.append(f"parallel.parallel_mode={par.parallel_mode}: use data_parallel (parallel=data) or stand_alone")
    elif par.parallel_mode == "data_parallel":
        if par.workers < 1:
            p.append(f"parallel.workers={par.workers}: must be >= 1")
        if families.of("dataset", cfg.dataset._target_) is None:
            p.append(f"parallel=data with dataset._target_={cfg.dataset._target_}: a data set of your own cannot "
                     f"be sharded by lsexp yet; use a built-in data set or parallel=none")
        if not cfg.dataset.drop_remainder:
            p.append("dataset.drop_remainder=false with parallel=data: every rank must take the same number "
                     "of steps; set dataset.drop_remainder=true")
        if cfg.train.mode != "graph":
            p.append(f"train.mode={cfg.train.mode} with parallel=data: data parallel runs in graph mode; "
                     f"set train.mode=graph")
    if cfg.inject.rank is not None and not 0 <= cfg.inject.rank < world_size(cfg):
        p.append(f"inject.rank={cfg.inject.rank}: there are ranks 0..{world_size(cfg) - 1}; "
                 f"use one of them, or null for every rank")
    if cfg.study is not None:
        from lsexp import studies

        if cfg.study not in studies.available():
            p.append(f"study={cfg.study}: no such study; use one of {', '.join(studies.available())} or null")
    if not _finite_positive(cfg.optimizer.learning_rate):
        p.append(f"optimizer.learning_rate={cfg.optimizer.learning_rate}: must be a finite number > 0")
    if "momentum" in cfg.optimizer and not 0 <= cfg.optimizer.momentum:
        p.append(f"optimizer.momentum={cfg.optimizer.momentum}: must be >= 0; e.g. 0.9")

    d = cfg.dataset
    if d.batch_size < 1:
        p.append(f"dataset.batch_size={d.batch_size}: must be >= 1; e.g. 32")
    workload = _workload_problems(cfg) if d.batch_size >= 1 else []
    p += workload

    t = cfg.train
    if t.epochs < 1:
        p.append(f"train.epochs={t.epochs}: must be >= 1; e.g. 10")
    if t.max_steps is not None and t.max_steps < 1:
        p.append(f"train.max_steps={t.max_steps}: must be >= 1, or null for no cap")
    if t.objective not in OBJECTIVES:
        p.append(f"train.objective={t.objective}: use one of {', '.join(OBJECTIVES)}")
    if t.mode not in MODES:
        p.append(f"train.mode={t.mode}: use graph or pynative")
    if t.collapse_patience is not None and t.collapse_patience < 1:
        p.append(f"train.collapse_patience={t.collapse_patience}: must be >= 1 step, or null to never stop early")
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
        p.append(f"tracking.uri={redact(uri)}: not an MLflow tracking URI; use e.g. sqlite:///mlflow.db, "
                 f"http://127.0.0.1:5000 or postgresql://user@host:5432/database")

    p += device_problems(cfg.device)
    if p:
        raise ConfigError(p)


def _hysteresis_problems(ls) -> List[str]:
    p = []
    if ls.hysteresis < 1:
        p.append(f"loss_scale.hysteresis={ls.hysteresis}: must be >= 1 (1 backs off at every overflow); e.g. 2")
    if not _finite_positive(ls.min_loss_scale):
        p.append(f"loss_scale.min_loss_scale={ls.min_loss_scale}: must be a finite number > 0; e.g. 1")
    elif ls.max_loss_scale is not None and not (_finite_positive(ls.max_loss_scale)
                                                and ls.max_loss_scale >= ls.min_loss_scale):
        p.append(f"loss_scale.max_loss_scale={ls.max_loss_scale}: must be a finite number >= loss_scale."
                 f"min_loss_scale={ls.min_loss_scale}, or null for no cap; e.g. 16777216")
    elif _scale_ok(ls.init_loss_scale) and not (
            ls.min_loss_scale <= ls.init_loss_scale <= (ls.max_loss_scale or math.inf)):
        p.append(f"loss_scale.init_loss_scale={ls.init_loss_scale}: must lie between loss_scale.min_loss_scale="
                 f"{ls.min_loss_scale} and loss_scale.max_loss_scale={ls.max_loss_scale}")
    return p


def step_problems(cfg: DictConfig, num_train: int) -> List[str]:
    """What needs the run's step count: known here for lsexp's data sets, after building for a user's."""
    n, p = total_steps(cfg, num_train), []
    if n < 1:
        p.append(f"dataset.batch_size={cfg.dataset.batch_size}: larger than the data, so the run has no step")
    for key in ("inject.overflow_steps", "telemetry.histogram_steps"):
        steps = list(OmegaConf.select(cfg, key))
        outside = [k for k in steps if not 1 <= k <= n]
        if outside:
            p.append(f"{key}={steps}: step(s) {outside} are outside this run's steps 1..{n}; pick steps in that "
                     f"range or raise train.max_steps")
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
        kind = "model=transformer for token data" if "vocab_size" in cfg.dataset else "an image model, e.g. model=resnet"
        return [f"model._target_={cfg.model._target_}: takes dataset.{key.group(1) if key else '?'}, which "
                f"dataset._target_={cfg.dataset._target_} does not have; pick a model made for this data set: {kind}"]
    if m.get("num_class", 1) < 1:
        p.append(f"model.num_class={m['num_class']}: a classifier needs >= 1 class; leave it to the data set")
    for key, data_key in (("num_channel", "num_channel"), ("image_size", "image_size")):
        if key in m and data_key in cfg.dataset and m[key] != cfg.dataset[data_key]:
            p.append(f"model.{key}={m[key]} but dataset.{data_key}={cfg.dataset[data_key]}: the model would not "
                     f"fit the data; set them equal, or leave model.{key} to follow the data set")
    if model is not None and not p:
        p += getattr(model, "problems", lambda _: [])(cfg)
    return p

