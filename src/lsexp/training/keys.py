"""The checks of the train group's keys, and of every key counted in the run's steps, which need the
step count: known before building for lsexp's data sets, after the shape probe for a user's."""

from __future__ import annotations

from pathlib import Path
from typing import List

from lsexp.config.facts import total_steps, world_size


def problems(cfg) -> List[str]:
    """The train group's keys."""
    from lsexp.config.schema import MODES, OBJECTIVES

    t, p = cfg.train, []
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
    return p


def step_problems(cfg, plan, num_train: int) -> List[str]:
    """What needs the run's step count: the accumulation and the batch against the data, the schedule's
    steps, and the steps injection and the histograms name."""
    from lsexp import schedules

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
    p += schedules.step_problems(cfg, n)
    # injection counts micro-batches (k per optimizer step), histograms optimizer steps
    for key, steps, last, (unit, units) in (
        ("inject.overflow_steps", plan.inject_steps, n * k,
         ("micro-batch", "micro-batches") if k > 1 else ("step", "steps")),
        ("telemetry.histogram_steps", plan.histogram_steps, n, ("step", "steps")),
    ):
        outside = [s for s in steps if not 1 <= s <= last]
        if outside:
            p.append(
                f"{key}={list(steps)}: {unit}(s) {outside} are outside this run's {units} 1..{last}; pick "
                f"{units} in that range or raise train.max_steps"
            )
    return p
