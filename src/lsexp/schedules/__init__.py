"""The lr_schedule group: the learning rate as a function of the step, from MindSpore's
nn.learning_rate_schedule cells (lsexp.schedules.cells).

`on_skip` says which step: `hold` gives the schedule the optimizer's own global_step, which MindSpore's
optimizers advance only when they run, so a skipped update holds it; `advance` gives it a counter of
its own that the train step moves every step, as a PyTorch scheduler.step() per iteration does. The
optimizer's global_step, which Lamb's bias correction reads, is left alone either way. Each family is
its `<name>_schema.py` here and its YAML under conf/lr_schedule/.
"""

from __future__ import annotations

from typing import List

from omegaconf import DictConfig, OmegaConf

OWN_KEYS = ("on_skip",)


def warmup_of(cfg_schedule: DictConfig, total: int) -> int:
    """warmup_steps as given, or a tenth of the schedule's steps when null."""
    w = cfg_schedule.get("warmup_steps")
    return total // 10 if w is None else int(w)


def total_of(cfg_schedule: DictConfig, run_steps: int) -> int:
    """total_steps as given, or the run's optimizer steps when null."""
    t = cfg_schedule.get("total_steps")
    return run_steps if t is None else int(t)


def build(cfg_schedule: DictConfig, learning_rate: float, run_steps: int):
    """(learning_rate for the optimizer, whether the train step must move its own counter): a float for
    a constant rate, else a LearningRateSchedule over the run's optimizer steps."""
    from hydra.utils import get_method

    kwargs = OmegaConf.to_container(cfg_schedule, resolve=True)
    target = kwargs.pop("_target_")
    for key in OWN_KEYS:
        kwargs.pop(key)
    if "total_steps" in kwargs:
        kwargs["total_steps"] = total_of(cfg_schedule, run_steps)
    if "warmup_steps" in kwargs:
        kwargs["warmup_steps"] = warmup_of(cfg_schedule, kwargs.get("total_steps", run_steps))
    schedule = get_method(target)(learning_rate=learning_rate, **kwargs)
    if cfg_schedule.on_skip == "advance" and not isinstance(schedule, float):
        from lsexp.schedules.cells import OnOwnCounter

        return OnOwnCounter(schedule), True
    return schedule, False


def problems(cfg: DictConfig) -> List[str]:
    """The lr_schedule group's keys, as far as the run's step count is not needed."""
    from lsexp.config.schema import ON_SKIP

    ls, p = cfg.lr_schedule, []
    if ls.on_skip not in ON_SKIP:
        p.append(f"lr_schedule.on_skip={ls.on_skip}: use hold (a skipped update holds the schedule) or "
                 f"advance (it moves every step)")
    for key in ("warmup_steps", "total_steps"):
        if ls.get(key) is not None and ls[key] < (0 if key == "warmup_steps" else 1):
            p.append(f"lr_schedule.{key}={ls[key]}: must be >= {0 if key == 'warmup_steps' else 1}, "
                     f"or null for the default")
    return p


def step_problems(cfg: DictConfig, n: int) -> List[str]:
    """The schedule's steps against the run's n optimizer steps."""
    ls, p = cfg.lr_schedule, []
    total = total_of(ls, n)
    if ls.get("total_steps") is not None and total < n:
        p.append(f"lr_schedule.total_steps={total}: smaller than this run's {n} optimizer steps, so the "
                 f"schedule would end before the run; raise it to >= {n} or leave it null")
    if "warmup_steps" in ls and warmup_of(ls, total) >= total:
        p.append(f"lr_schedule.warmup_steps={ls.warmup_steps}: the warm-up must end before the schedule's "
                 f"{total} steps; lower it below {total}")
    return p
