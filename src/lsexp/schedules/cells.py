"""The schedules as MindSpore LearningRateSchedule cells, evaluated in the compiled step at the
0-based step the optimizer passes (its global_step: the number of updates it has applied)."""

from __future__ import annotations

from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.nn.learning_rate_schedule import LearningRateSchedule


class WarmupThen(LearningRateSchedule):
    """nn.WarmUpLR's linear warm-up to learning_rate over warmup_steps (0 at step 0), then `decay`, whose
    own step starts at 0 when the warm-up ends."""

    def __init__(self, learning_rate: float, warmup_steps: int, decay: LearningRateSchedule):
        super().__init__()
        self.warmup_steps = warmup_steps
        self.warmup = nn.WarmUpLR(learning_rate, warmup_steps) if warmup_steps > 0 else None
        self.decay = decay

    def construct(self, global_step):
        if self.warmup is None:
            return self.decay(global_step)
        after = self.decay(ops.maximum(global_step - self.warmup_steps, 0))
        return ops.select(global_step < self.warmup_steps, self.warmup(global_step), after)


class OnOwnCounter(LearningRateSchedule):
    """lr_schedule.on_skip=advance: the schedule at a step count of its own, which the train step moves
    every step, skipped or not, instead of at the optimizer's global_step."""

    def __init__(self, schedule: LearningRateSchedule):
        super().__init__()
        self.schedule = schedule
        self.step = Parameter(Tensor([0], mstype.int32), name="lsexp_schedule_step", requires_grad=False)

    def construct(self, global_step):
        return self.schedule(self.step)


def constant(learning_rate: float) -> float:
    return float(learning_rate)


def warmup_cosine(learning_rate: float, warmup_steps: int, total_steps: int, min_learning_rate: float):
    """Linear warm-up, then nn.CosineDecayLR from learning_rate to min_learning_rate at total_steps."""
    decay = nn.CosineDecayLR(float(min_learning_rate), float(learning_rate), total_steps - warmup_steps)
    return WarmupThen(learning_rate, warmup_steps, decay)


def warmup_linear(learning_rate: float, warmup_steps: int, total_steps: int, end_learning_rate: float):
    """Linear warm-up, then a linear decay (nn.PolynomialDecayLR, power 1) to end_learning_rate at
    total_steps: the schedule transformers calls linear."""
    decay = nn.PolynomialDecayLR(float(learning_rate), float(end_learning_rate), total_steps - warmup_steps,
                                 1.0)
    return WarmupThen(learning_rate, warmup_steps, decay)


def polynomial(learning_rate: float, warmup_steps: int, total_steps: int, end_learning_rate: float,
               power: float):
    """nn.PolynomialDecayLR from learning_rate to end_learning_rate at total_steps, after an optional
    linear warm-up."""
    decay = nn.PolynomialDecayLR(float(learning_rate), float(end_learning_rate), total_steps - warmup_steps,
                                 float(power))
    return WarmupThen(learning_rate, warmup_steps, decay)
