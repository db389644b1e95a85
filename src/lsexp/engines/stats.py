"""The step's statistics by name: what the train step reports in its one small vector, in order, and
where each goes. Both engines write a statistic by its name (`got[name] = value` in construct) and the
vector follows this order; the loop reads it back by name. A new statistic is one line here plus the
code that computes it: as a history column it is also an MLflow metric (lsexp.tracking.worker).

Nothing here imports MindSpore: the loop reads it, and a job must not import MindSpore before its
tracker has let an early worker go (tracking=none)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

HISTORY = "history"  # a column of history.csv, and an MLflow metric
LOOP = "loop"  # read by the loop alone


@dataclass(frozen=True)
class Stat:
    name: str
    when: Optional[str] = None  # the train step's flag that adds it (an attribute of the step), or always
    goes: str = HISTORY
    measured_on_overflow: bool = True  # False: NaN on a step whose gradients overflowed


STATS: Tuple[Stat, ...] = (
    Stat("loss"),
    Stat("overflow"),  # the gradients overflowed, as the check the step acts on saw them
    Stat("loss_scale"),  # the scale the step used
    Stat("skipped", goes=LOOP),  # the update was not applied; the loop counts them (skipped_steps)
    Stat("params_finite", goes=LOOP),  # every parameter finite after the update: else the run diverged
    Stat("lr"),  # the learning rate the update used, or would have used if it was skipped
    # telemetry.grads: the gradients as backprop made them (before the reducer): their unscaled global
    # norm, the fractions float16 would flush to zero, that overflow it, that are zero, and the powers of
    # two between the largest and float16's largest value
    Stat("grad_norm", when="telemetry"),
    Stat("underflow_fraction", when="telemetry"),
    Stat("overflow_fraction", when="telemetry"),
    Stat("zero_fraction", when="telemetry"),
    Stat("headroom_log2", when="telemetry", measured_on_overflow=False),
    # and the parameters' global norm after the update: weights that grow step after step diverge in
    # float32's range, not float16's
    Stat("weight_norm", when="telemetry"),
    # a strategy that measures_amax: the largest unscaled gradient magnitude after the reducer
    Stat("grad_amax", when="measure_amax", measured_on_overflow=False),
    # optimizer.clip_grad_norm: the unscaled global norm the clip saw; the loop adds `clipped` after
    # the step's columns, that norm above clip_norm on a step that updated
    Stat("global_norm", when="clip"),
    # device.overflow_mode=saturation: 1 where the emulated float-status register was raised (a value
    # saturated in a tapped layer or a parameter gradient), whether or not the check read it
    Stat("float_status", when="saturation"),
)
# After them, telemetry=layers' statistics: every tapped layer's, as lsexp.taps lays them out.


def present(step) -> Tuple[str, ...]:
    """The names a train step reports, in the vector's order: those whose flag it has set."""
    return tuple(s.name for s in STATS if s.when is None or getattr(step, s.when))


class Layout:
    """How the loop reads a step's vector: by name, then the taps' statistics that follow."""

    def __init__(self, names: Tuple[str, ...]):
        self.names = names
        by_name = {s.name: s for s in STATS}
        self.history = tuple(n for n in names if by_name[n].goes == HISTORY)
        self.unmeasured = tuple(n for n in names if not by_name[n].measured_on_overflow)

    def read(self, values: List[float]) -> Tuple[Dict[str, float], List[float]]:
        """({name: value}, the taps' statistics after them)."""
        n = len(self.names)
        return dict(zip(self.names, values[:n])), values[n:]
