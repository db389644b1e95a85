"""loss_scale=amax_history: a scale predicted from the gradients' measured amax instead of found by
trial and error.

The rule is Transformer Engine's DelayedScaling recipe (transformer_engine/common/recipe.py) applied to
the loss scale: a rolling history of the largest unscaled gradient magnitude (amax) over the last
`history_len` clean steps, aggregated by `amax_compute_algo` (max or most_recent), gives

    scale = 2 ** (floor(log2(FP16_MAX / amax)) - margin),  clipped to [min_loss_scale, max_loss_scale]

so that the largest gradient, scaled, lands within a power of two of float16's largest value, with
`margin` powers of two kept free. What does not carry over from TE: TE scales each tensor by its own
amax, while one loss scale covers every gradient in the backward pass, and the activation gradients
between the layers are not measured. They can overflow where the weight gradients did not, so an
overflow is still possible; it skips the update and backs the scale off by `backoff_factor`, as a
dynamic scaler does, and adds nothing to the history. Because the history would predict the scale
that just overflowed again, the backed-off scale is also a ceiling on the prediction until
`history_len` clean steps have passed. Before the first clean step the scale is `init_loss_scale`.

The amax is measured inside the compiled step, after the gradient reducer (so every data-parallel rank
predicts the same scale), with no host sync. As the other scalers here, the rule is written once as
tensor arithmetic and runs as an update cell (cell engine) and as a mindspore.amp.LossScaler
(functional engine); its state is Parameters, so checkpoints carry it.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype
from mindspore.amp import StaticLossScaler
from mindspore.graph.api import jit_class

from lsexp.formats.spec import FP16_MAX
from lsexp.strategies.amax_history_schema import STATE
from lsexp.strategies.manager import InStepLossScaleManager, InStepUpdateCell

# the largest scaled gradient must stay below float16's largest finite value


class _AmaxHistoryState:
    """The history, the ceiling and the rule over them, as Parameters and tensor arithmetic."""

    def _init_state(self, history_len, amax_compute_algo, margin, backoff_factor, min_loss_scale,
                    max_loss_scale):
        self.most_recent = amax_compute_algo == "most_recent"  # a Python constant: one rule per graph
        self.length = Tensor(history_len, mstype.int32)
        self.fp16_max = Tensor(FP16_MAX, mstype.float32)
        # float32's normal powers of two, and each times 2^-margin: the prediction is the largest power
        # of two at or below FP16_MAX / amax (floor(log2(.)) exactly, as frexp's exponent gives it),
        # found by comparing with every power, which is exact where a float log2 rounds near them
        exponents = np.arange(-126, 128)
        self.powers = Tensor(np.ldexp(np.float32(1), exponents).astype(np.float32))
        self.predictions = Tensor(np.ldexp(np.float32(1), exponents - int(margin)).astype(np.float32))
        self.nothing = Tensor(0.0, mstype.float32)
        self.backoff = Tensor(backoff_factor, mstype.float32)
        self.min_scale = Tensor(min_loss_scale, mstype.float32)
        self.max_scale = Tensor(max_loss_scale, mstype.float32)
        self.one_step, self.no_steps = Tensor(1, mstype.int32), Tensor(0, mstype.int32)

        def state(value, dtype, name):
            return Parameter(Tensor(value, dtype), name=name, requires_grad=False)

        # oldest first, the most recent last; zeros count for nothing under max (amax >= 0), and after
        # the first clean step the most recent entry is a measurement
        self.history = state(np.zeros(history_len, np.float32), mstype.float32, STATE[0])
        self.ceiling = state(max_loss_scale, mstype.float32, STATE[1])
        self.calm = state(history_len, mstype.int32, STATE[2])  # clean steps since the last overflow

    def _next_scale(self, scale, overflow, amax):
        """Returns the next scale and assigns the history, the ceiling and the count of clean steps.
        Before the first clean step the scale stays as it was (only an overflow moves it); from it on, a
        clean step predicts."""
        history = ops.select(overflow, self.history, ops.concat((self.history[1:], amax.reshape((1,)))))
        calm = ops.select(overflow, self.no_steps, self.calm + self.one_step)
        agg = history[-1] if self.most_recent else history.max()
        # an amax of 0 gives inf, and the largest power: the cap
        ratio = self.fp16_max / agg
        predicted = ops.select(self.powers <= ratio, self.predictions, self.nothing).max()
        predicted = ops.minimum(ops.maximum(predicted, self.min_scale), self.max_scale)
        backed_off = ops.maximum(scale / self.backoff, self.min_scale)
        # an overflow caps the prediction at the backed-off scale until history_len clean steps have passed
        ceiling = ops.select(overflow, backed_off,
                             ops.select(calm >= self.length, self.max_scale, self.ceiling))
        new_scale = ops.select(overflow, backed_off, ops.minimum(predicted, ceiling))
        new_scale = ops.depend(new_scale, ops.assign(self.history, history))
        new_scale = ops.depend(new_scale, ops.assign(self.calm, calm))
        return ops.depend(new_scale, ops.assign(self.ceiling, ceiling))


class AmaxHistoryUpdateCell(_AmaxHistoryState, InStepUpdateCell):
    """The update cell the cell engine's train step calls with (scale Parameter, overflow, amax): like
    DynamicLossScaleUpdateCell, plus the step's unscaled amax."""

    def construct(self, loss_scale, overflow, amax):
        return ops.depend(overflow, ops.assign(loss_scale, self._next_scale(loss_scale, overflow, amax)))


@jit_class
class AmaxHistoryLossScaler(_AmaxHistoryState, StaticLossScaler):
    """The functional engine's counterpart: StaticLossScaler's scale/unscale over a scale_value Parameter,
    and an adjust that also takes the step's unscaled amax."""

    def __init__(self, scale_value, **options):
        super().__init__(scale_value)
        self._init_state(**options)

    def adjust(self, grads_finite, amax):
        ops.assign(self.scale_value, self._next_scale(self.scale_value, ops.logical_not(grads_finite), amax))
        return True


class AmaxHistoryLossScaleManager(InStepLossScaleManager):
    """The schema's keys, as a mindspore.amp.LossScaleManager like DynamicLossScaleManager."""

    UPDATE_CELL, LOSS_SCALER = AmaxHistoryUpdateCell, AmaxHistoryLossScaler

    def __init__(self, init_loss_scale: float = 2.0**16, history_len: int = 16,
                 amax_compute_algo: str = "max", margin: int = 0, backoff_factor: float = 2.0,
                 min_loss_scale: float = 1.0, max_loss_scale: float = 2.0**24):
        super().__init__(init_loss_scale, history_len=history_len, amax_compute_algo=amax_compute_algo,
                         margin=margin, backoff_factor=backoff_factor, min_loss_scale=min_loss_scale,
                         max_loss_scale=max_loss_scale)
