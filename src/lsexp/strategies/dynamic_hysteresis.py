"""loss_scale=dynamic_hysteresis and loss_scale=megatron: dynamic loss scaling with hysteresis, a floor
and a cap.

MindSpore's DynamicLossScaleManager backs off at the first overflow and has no floor guard or cap.
The scalers large-model training relies on do: DeepSpeed and Megatron tolerate `hysteresis - 1`
overflows before backing off and never go below their floor, and Apex caps the scale at 2^24.

- dynamic_hysteresis is DeepSpeed's DynamicLossScaler.update_scale
  (deepspeed/runtime/fp16/loss_scaler.py) as DeepSpeed has it today: it grows when
  `cur_iter - last_overflow_iter - 1` is positive and a multiple of scale_window, one clean step
  later than older DeepSpeed releases did. raise_error_at_min_scale=False (a run stuck at the floor
  is lsexp's train.collapse_patience), and Apex's cap added.
- megatron is Megatron-LM's DynamicGradScaler.update (megatron/core/optimizer/grad_scaler.py): it
  grows on the growth_interval-th clean step in a row (older DeepSpeed's timing), backs off by
  multiplying with backoff_factor, refills the hysteresis only at a growth, and has no cap.

The rule is written once as tensor arithmetic, so that it runs inside the compiled step:

- as an update cell (get_update_cell), called by the cell engine's train step exactly where
  nn.TrainOneStepWithLossScaleCell calls DynamicLossScaleUpdateCell;
- as a mindspore.amp.LossScaler (get_loss_scaler), the functional engine's counterpart of
  DynamicLossScaler.

Every overflow skips the update, as in both; hysteresis only delays the back-off.
"""

from __future__ import annotations

import math
from typing import Optional

from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype
from mindspore.amp import DynamicLossScaler
from mindspore.graph.api import jit_class

from lsexp.strategies.manager import InStepLossScaleManager, InStepUpdateCell


class _HysteresisState:
    """The scaler's state as Parameters (so checkpoints carry it), and DeepSpeed's rule over them."""

    def _init_state(self, hysteresis, consecutive_hysteresis, min_loss_scale, max_loss_scale, scale_factor,
                    scale_window, growth="deepspeed", backoff_factor=None):
        # Python constants, so the compiled step holds one rule: growth "deepspeed" (today's) or
        # "megatron"; a back-off that divides by scale_factor (DeepSpeed) or multiplies by backoff_factor
        self.deepspeed_growth = growth == "deepspeed"
        self.multiply_back = backoff_factor is not None
        self.backoff = Tensor(backoff_factor or 1.0, mstype.float32)
        self.delayed_shift = Tensor(hysteresis, mstype.int32)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.min_scale = Tensor(min_loss_scale, mstype.float32)
        self.max_scale = Tensor(math.inf if max_loss_scale is None else max_loss_scale, mstype.float32)
        self.factor = Tensor(scale_factor, mstype.float32)
        self.window = Tensor(scale_window, mstype.int32)
        self.cur_hysteresis = Parameter(Tensor(hysteresis, mstype.int32), name="lsexp_cur_hysteresis",
                                        requires_grad=False)
        self.cur_iter = Parameter(Tensor(0, mstype.int32), name="lsexp_hysteresis_iter", requires_grad=False)
        self.last_overflow_iter = Parameter(Tensor(-1, mstype.int32), name="lsexp_last_overflow_iter",
                                            requires_grad=False)

    def _next_scale(self, scale, overflow):
        """DeepSpeed's update_scale: returns the next scale and assigns the counters."""
        hysteresis = self.cur_hysteresis
        # On overflow: back off once the tolerance is used up (cur_hysteresis 1), else use up one.
        back_off = ops.logical_and(overflow, hysteresis <= 1)
        lower = scale * self.backoff if self.multiply_back else scale / self.factor
        scale_overflow = ops.select(back_off, ops.maximum(lower, self.min_scale), scale)
        hysteresis_overflow = ops.select(back_off, hysteresis, hysteresis - 1)
        # Without overflow: grow every scale_window iterations counted from the last overflow.
        since = self.cur_iter - self.last_overflow_iter
        if self.deepspeed_growth:  # stable_interval: the first growth one clean step later
            stable = since - 1
            due = ops.logical_and(stable > 0, ops.floor_mod(stable, self.window) == 0)
        else:  # Megatron's growth_interval-th clean step in a row
            due = ops.floor_mod(since, self.window) == 0
        grow = ops.logical_and(ops.logical_not(overflow), due)
        scale_clean = ops.select(grow, ops.minimum(scale * self.factor, self.max_scale), scale)
        if self.consecutive_hysteresis:
            hysteresis_clean = self.delayed_shift  # any clean step restores the tolerance
        else:
            hysteresis_clean = ops.select(grow, self.delayed_shift, hysteresis)  # only a growth does
        new_scale = ops.select(overflow, scale_overflow, scale_clean)
        new_hysteresis = ops.select(overflow, hysteresis_overflow, hysteresis_clean)
        last = ops.select(overflow, self.cur_iter, self.last_overflow_iter)
        new_scale = ops.depend(new_scale, ops.assign(self.cur_hysteresis, new_hysteresis))
        new_scale = ops.depend(new_scale, ops.assign(self.last_overflow_iter, last))
        return ops.depend(new_scale, ops.assign(self.cur_iter, self.cur_iter + 1))


class HysteresisLossScaleUpdateCell(_HysteresisState, InStepUpdateCell):
    """The update cell the train step calls with (scale Parameter, overflow), like
    DynamicLossScaleUpdateCell; options: HysteresisLossScaleManager's, past init_loss_scale."""

    def construct(self, loss_scale, overflow):
        return ops.depend(overflow, ops.assign(loss_scale, self._next_scale(loss_scale, overflow)))


@jit_class
class HysteresisLossScaler(_HysteresisState, DynamicLossScaler):
    """The functional API's counterpart: DynamicLossScaler's scale/unscale, DeepSpeed's adjust."""

    def __init__(self, scale_value, **options):
        """options: HysteresisLossScaleManager's, past init_loss_scale."""
        # DynamicLossScaler's own factor and window (positive ints) go unused: adjust is replaced
        super().__init__(scale_value, 2, 1)
        del self.counter  # DynamicLossScaler's window counter; the hysteresis state replaces it
        self._init_state(**options)

    def adjust(self, grads_finite):
        ops.assign(self.scale_value, self._next_scale(self.scale_value, ops.logical_not(grads_finite)))
        return True


class HysteresisLossScaleManager(InStepLossScaleManager):
    """DeepSpeed's keys, as a mindspore.amp.LossScaleManager like DynamicLossScaleManager."""

    UPDATE_CELL, LOSS_SCALER = HysteresisLossScaleUpdateCell, HysteresisLossScaler

    def __init__(self, init_loss_scale: float = 2.0**16, hysteresis: int = 2,
                 consecutive_hysteresis: bool = False, min_loss_scale: float = 1.0,
                 max_loss_scale: Optional[float] = 2.0**24, scale_factor: int = 2, scale_window: int = 1000):
        super().__init__(init_loss_scale, hysteresis=hysteresis,
                         consecutive_hysteresis=consecutive_hysteresis, min_loss_scale=min_loss_scale,
                         max_loss_scale=max_loss_scale, scale_factor=scale_factor, scale_window=scale_window)


class MegatronGradScalerManager(InStepLossScaleManager):
    """Megatron-LM's DynamicGradScaler over its own argument names, as a LossScaleManager."""

    UPDATE_CELL, LOSS_SCALER = HysteresisLossScaleUpdateCell, HysteresisLossScaler

    def __init__(self, initial_scale: float = 2.0**32, min_scale: float = 1.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 1000, hysteresis: int = 2):
        super().__init__(initial_scale, hysteresis=hysteresis, consecutive_hysteresis=False,
                         min_loss_scale=min_scale, max_loss_scale=None, scale_factor=growth_factor,
                         scale_window=growth_interval, growth="megatron", backoff_factor=backoff_factor)
