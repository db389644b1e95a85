"""One road into training. A run, a sweep's job, an msrun rank and `lsexp.app.train_here` each hand
`run` the config that passed its checks with what was decided for it; `run` configures the device,
joins the ranks of a data-parallel run, and trains the job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from lsexp.config.errors import ConfigError
from lsexp.training.plan import Plan


@dataclass(frozen=True)
class Checked:
    """A config that passed: its strategy, its plan, and what the probes of its network built
    (lsexp.training.probes.Probed, or None), which the step then trains."""

    strategy: Any
    plan: Plan
    probed: Any = None


@dataclass(frozen=True)
class Job:
    """What a training job is given: the config as composed, its plan and strategy, what was decided
    at run time (lsexp.device.decided), where it writes, the device target in force and its rank."""

    cfg: Any
    plan: Plan
    strategy: Any
    decided: Any
    out_dir: Path
    target: str
    rank: int = 0
    probed: Any = None

    @property
    def primary(self) -> bool:
        """Rank 0, which evaluates and writes what the job leaves behind."""
        return self.rank == 0


def run(cfg, checked: Checked, decided, out_dir: Path, history, on_done: Optional[Callable] = None) -> dict:
    """Train the job; its summary. on_done(step_cell) runs once training has finished (an msrun rank's
    digest of its parameters). A device MindSpore cannot use is a ConfigError."""
    from lsexp.training.loop import train

    target = _configure(cfg, decided)
    rank = 0
    if checked.plan.data_parallel:  # a rank under msrun: the job itself launched the ranks
        rank, world = _join_ranks(cfg)
        decided = decided.for_rank(world, rank)
    job = Job(cfg=cfg, plan=checked.plan, strategy=checked.strategy, decided=decided, out_dir=out_dir,
              target=target, rank=rank, probed=checked.probed)
    return train(job, history, on_done)


def _configure(cfg, decided) -> str:
    from lsexp import device

    try:
        return device.configure(cfg.device, cfg.train.mode, decided.threads_num, decided.onednn_max_cpu_isa)
    except (RuntimeError, ValueError) as err:  # a ConfigError of device's own passes as it is
        raise ConfigError([f"device.device_target={cfg.device.device_target}: MindSpore cannot use it "
                           f"({str(err).splitlines()[0]}); use device=cpu"]) from None


def _join_ranks(cfg) -> tuple:
    """(rank, world size), once this process has joined msrun's collective group in data parallel."""
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    init()
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=bool(cfg.parallel.gradients_mean)
    )
    return get_rank(), get_group_size()
