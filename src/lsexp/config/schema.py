"""Typed schemas for every config group: the core groups here, each family's own beside its module
(models/<family>_schema.py, datasets/<name>_schema.py, strategies/<family>_schema.py).

Each YAML option under conf/<group>/ names its schema in its defaults list, so a wrong type or an
unknown key fails at compose time with Hydra's own message. The cross-field rules that a type cannot
express are lsexp.preflight's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
AMP_DTYPES = ("float16", "bfloat16")
MODES = ("graph", "pynative")
OVERFLOW_MODES = ("infnan", "saturation")  # device.overflow_mode
OBJECTIVES = ("final_loss", "eval_accuracy")
PARALLEL_MODES = ("stand_alone", "data_parallel")


# --- model and dataset: the keys every family shares ----------------------------------------
@dataclass
class ModelConfig:
    _target_: str = MISSING
    num_class: int = "${dataset.num_classes}"  # type: ignore[assignment]


@dataclass
class ImageModelConfig(ModelConfig):
    num_channel: int = "${dataset.num_channel}"  # type: ignore[assignment]
    image_size: int = "${dataset.image_size}"  # type: ignore[assignment]


@dataclass
class DatasetConfig:
    _target_: str = MISSING
    batch_size: int = 32
    drop_remainder: bool = True
    shuffle: bool = True
    num_classes: int = 10
    seed: int = "${train.seed}"  # type: ignore[assignment]


@dataclass
class ImageDatasetConfig(DatasetConfig):
    num_channel: int = 1
    image_size: int = 32


@dataclass
class FileDatasetConfig(DatasetConfig):
    path: Optional[str] = None
    # mindspore.dataset map workers; 1 leaves the other core to MindSpore's executor (docs/performance.md).
    num_parallel_workers: int = 1


@dataclass
class ImageFileDatasetConfig(FileDatasetConfig, ImageDatasetConfig):
    """Images read by one of MindSpore's loaders (MnistDataset, Cifar10Dataset, ImageFolderDataset)."""

    # memory: the loader's uint8 records are read once and each batch is made from them, because the
    # pipeline's per-row cost is a large part of a small network's step; stream: the pipeline reads
    # every epoch, for sets that do not fit; auto: memory when the records take <= cache_max_mb.
    cache: str = "auto"
    cache_max_mb: int = 1024


# --- amp -------------------------------------------------------------------------------------
@dataclass
class AmpConfig:
    level: str = "O0"  # the `level` / `amp_level` of mindspore.amp.build_train_network / auto_mixed_precision
    dtype: str = "float16"
    # amp.custom_mixed_precision's lists, by cell name (`lsexp layers`) or cell class (lsexp.amp.lists):
    # white_list runs the cells in low precision at O0/O1; black_list keeps them in float32 at O2/O3/auto
    white_list: Optional[List[str]] = None
    black_list: Optional[List[str]] = None


# --- loss_scale ------------------------------------------------------------------------------
@dataclass
class LossScaleConfig:
    _target_: str = MISSING


# --- engine --------------------------------------------------------------------------------
@dataclass
class EngineConfig:
    """How a step is built: `_target_` is the builder that turns the loss_scale group into a train step."""

    _target_: str = MISSING
    name: str = MISSING  # cell or functional, as the run's params and names show it


# --- optimizer and lr_schedule --------------------------------------------------------------
@dataclass
class OptimizerConfig:
    """The keys every optimizer option has; each family's own are in lsexp/optimizers/<name>_schema.py.
    clip_grad_norm and decay_filter are lsexp's, never passed to the class."""

    _target_: str = MISSING
    learning_rate: float = 0.01
    weight_decay: float = 0.0
    # The global norm the unscaled gradients are clipped to (ops.clip_by_global_norm's clip_norm), after
    # the overflow check; None: no clipping.
    clip_grad_norm: Optional[float] = None
    # True: no weight decay on biases and normalisation parameters (beta, gamma, moving statistics), by
    # parameter groups as MindSpore's examples build them.
    decay_filter: bool = False


@dataclass
class ScaledOptimizerConfig(OptimizerConfig):
    """An optimizer whose class takes loss_scale and divides the gradients by it (Momentum, SGD, Adam)."""

    # None: follow the strategy (the manager's scale for fixed_nodrop, 1.0 otherwise).
    loss_scale: Optional[float] = None


@dataclass
class AdamFamilyConfig(OptimizerConfig):
    """The keys Adam, AdamWeightDecay and Lamb share, with MindSpore's defaults for the latter two."""

    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6


ON_SKIP = ("hold", "advance")


@dataclass
class LrScheduleConfig:
    """The keys every lr_schedule option has; each family's own are in lsexp/schedules/<name>_schema.py."""

    _target_: str = MISSING
    # hold: a skipped update does not move the schedule (MindSpore's optimizers advance global_step only
    # when they run); advance: it moves every step, as a PyTorch scheduler.step() per iteration does.
    on_skip: str = "hold"


@dataclass
class WarmupScheduleConfig(LrScheduleConfig):
    """A schedule with a linear warm-up, over total_steps."""

    warmup_steps: Optional[int] = None  # None: a tenth of total_steps
    total_steps: Optional[int] = None  # None: the run's optimizer steps


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
    # How float16 arithmetic reports an overflow. infnan: as inf and NaN (GPU, CPU, Ascend 910B/C by
    # default). saturation: Ascend's saturation mode (910A; 910B/C with INF_NAN_MODE_ENABLE=0), emulated
    # at every layer: an inf becomes the type's largest value with its sign, a NaN 0, and an emulated
    # float-status flag is raised (lsexp.taps.saturating).
    overflow_mode: str = "infnan"
    # Under saturation: the overflow check reads the status flag, as MindSpore does on Ascend. False:
    # it checks the values only, which saturation has made finite.
    status_check: bool = True


@dataclass
class TrainConfig:
    epochs: int = 10
    max_steps: Optional[int] = None
    # Micro-batches of dataset.batch_size per optimizer step, their gradients averaged in the step; steps,
    # max_steps and every *_steps key count optimizer steps, epochs passes over the data.
    accumulate_steps: int = 1
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
    # The loss's gradients as a mean over this many tokens (a language model's positions, a classifier's
    # samples) make them, instead of the batch's own count: each token's gradient is where a batch of N
    # tokens puts it. The loss reported is still the batch's mean, and the optimizer is corrected so that
    # float32 trains as without the key (docs/mean_over_tokens.md). null: the batch's own count.
    mean_over_tokens: Optional[int] = None


@dataclass
class TelemetryConfig:
    grads: bool = False  # per-step gradient norm and float16 underflow/overflow/zero fractions, in the step
    histogram_steps: List[int] = field(default_factory=list)  # log2|g| histograms and per-layer breakdown
    # per tapped layer and step (lsexp.taps): the forward output's amax, the activation gradient's amax and
    # its float16 underflow, zero and overflow fractions; telemetry/layers.csv and layers.png
    layers: bool = False
    # on a step whose gradients are non-finite, replay it through the taps and name the layer and pass
    # where the first inf or NaN arose (history.csv, summary.json, the lsexp.first_nonfinite tag)
    locate: bool = True


@dataclass
class PrecisionConfig:
    """Eight-bit emulation of the matrix products (lsexp.precision): keys as Transformer Engine's recipes
    name them. recipe: none, delayed (DelayedScaling), current (Float8CurrentScaling) or mx (MX blocks)."""

    recipe: str = "none"
    # HYBRID (E4M3 forward, E5M2 backward), E4M3, E5M2 (TE's recipe.Format), or HIF8 (Ascend's HiFloat8)
    fp8_format: str = "HYBRID"
    margin: int = 0  # delayed: scale = 2^-margin * FP8_MAX / amax
    amax_history_len: int = 1024  # delayed
    amax_compute_algo: str = "max"  # delayed: max or most_recent
    block_size: int = 32  # mx: OCP MX v1.0 fixes 32
    rounding: str = "even"  # mx: even (OCP, TE) or away (microxcaling's "nearest")


def _inject_init(self, **values):
    defaults = {"overflow_steps": [], "rank": None, "layer": None, "pass": "forward"}
    for name, value in {**defaults, **values}.items():
        setattr(self, name, value)


# `pass` is a Python keyword, which a dataclass's generated methods cannot name: this one is built with an
# __init__ of its own.
InjectConfig = dataclass(init=False, repr=False, eq=False)(type("InjectConfig", (), {
    "__init__": _inject_init,
    "__module__": __name__,
    "__doc__": "inject.overflow_steps poisons the weight gradients after backprop, or with inject.layer the "
               "tapped layer's output (pass=forward) or the gradient flowing into it (pass=backward).",
    "__annotations__": {"overflow_steps": List[int], "rank": Optional[int], "layer": Optional[str],
                        "pass": str},
    "overflow_steps": field(default_factory=list),
    "rank": None,  # with parallel=data: the one rank whose gradients are poisoned (None: all)
    "layer": None,  # a name `lsexp layers` prints
    "pass": "forward",
}))


@dataclass
class SweepConfig:
    """What a multirun does beyond its jobs; a single run ignores it."""

    # a group, as its runs' lsexp.group tag spells it ("loss_scale=dynamic amp=O2"), that every other
    # group is compared with seed by seed (comparison_paired.*); or some of its choices
    # ("loss_scale=dynamic"), each group then compared with the one that differs from it in those alone
    baseline: Optional[str] = None
    # Run again with the old hydra.sweep.dir: jobs whose run finished with the same config are not
    # trained again; the rest run under the same parent (lsexp.tracking.resume).
    resume: bool = False


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
    # Any: lsexp's own options are typed by their base_<family> schema at compose time, a strategy from
    # outside lsexp by its SCHEMA when it is resolved (lsexp.strategies.resolve)
    loss_scale: Any = MISSING
    engine: EngineConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    lr_schedule: LrScheduleConfig = MISSING
    device: DeviceConfig = MISSING
    train: TrainConfig = MISSING
    tracking: TrackingConfig = MISSING
    inject: InjectConfig = field(default_factory=InjectConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    parallel: ParallelConfig = MISSING
    telemetry: TelemetryConfig = MISSING
    precision: PrecisionConfig = MISSING
    # A sweep's own table and figure, drawn by lsexp.report.studies.<study> when the sweep ends
    # (experiments/ set it).
    study: Optional[str] = None
