"""engine=functional: the train step as MindSpore 2.x teaches for custom loops.

`ms.value_and_grad` over the loss a `mindspore.amp.LossScaler` scaled, `amp.all_finite` on the
gradients, the scaler's `unscale` and `adjust`; the optimizer runs only on finite gradients
unless the strategy applies every update. The same loss_scale configs give the same scalers
(each strategy's `scaler()`):

- fixed_drop: StaticLossScaler(loss_scale), overflowed updates skipped;
- fixed_nodrop: StaticLossScaler(loss_scale), every update applied, and the optimizer's own
  loss_scale divides the gradients (as under the cell engine);
- dynamic: DynamicLossScaler(init_loss_scale, scale_factor, scale_window);
- dynamic_hysteresis: lsexp.strategies.dynamic_hysteresis.HysteresisLossScaler;
- none: no scaler.

With the same overflows both engines give the same scale history, with one exception
(docs/engines.md): DynamicLossScaler grows the scale only to a finite value, where
DynamicLossScaleUpdateCell grows it past float32's largest, to inf, and then skips every step.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import all_finite

from lsexp.engines.body import StepBody, StepOptions


def _grad_reducer(weights):
    # What TrainOneStepCell builds for itself; a custom loop builds it by hand.
    from mindspore.context import ParallelMode

    # private, as TrainOneStepCell reads them: MindSpore exports no getter for the three
    from mindspore.parallel._utils import _get_device_num, _get_gradients_mean, _get_parallel_mode

    if _get_parallel_mode() in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL):
        return nn.DistributedGradReducer(weights, _get_gradients_mean(), _get_device_num())
    return nn.Identity()


class FunctionalTrainStep(StepBody, nn.Cell):
    """One step of the custom loop; a Cell only so that checkpoints and graph mode take it whole."""

    def __init__(self, network, optimizer, scaler, drop_overflow_update, options: StepOptions = StepOptions(),
                 measure_amax: bool = False):
        super().__init__(auto_prefix=False)
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.scaler = scaler
        self.drop = drop_overflow_update
        self.grad_reducer = _grad_reducer(self.weights)
        self._init_step(options, options.keep_weights and not drop_overflow_update, measure_amax)
        # fixed_nodrop with an optimizer that takes no loss_scale: the step unscales before the update
        self.divide = not drop_overflow_update and scaler is not None and not options.optimizer_divides
        # The scaler's Parameters as the Cell's own, so that a checkpoint saves and restores them.
        for name, value in (vars(scaler) if scaler is not None else {}).items():
            if isinstance(value, Parameter):
                setattr(self, f"lsexp_scaler_{name}", value)
        self.scale_used = Parameter(Tensor(1.0, mstype.float32), name="lsexp_scale_used", requires_grad=False)
        # has_aux: the gradients are of the scaled loss; the loss itself is returned as it was
        # computed, so a scaled loss that overflows does not read as divergence.
        self.grad_fn = ms.value_and_grad(self.forward, None, self.grad_params, has_aux=True)

    def scale_now(self) -> float:
        return 1.0 if self.scaler is None else float(self.scaler.scale_value.asnumpy())

    def _micro_step(self, scale, *inputs):
        (_, loss), grads = self.grad_fn(*inputs)
        return loss, grads

    def forward(self, *inputs):
        loss = self.network(*inputs)
        scaled = loss if self.scaler is None else self.scaler.scale(loss)
        return scaled, loss

    def _update_if_finite(self, grads, scale, finite, loss):
        """(loss, clipping's statistics, parameters finite, skipped): the update applied only where the
        gradients are finite."""
        clip = {}
        if self.clip:  # of the unscaled gradients; a skipped step is not clipped
            norm, factor = self._clip(grads, scale, True)
            clip = {"global_norm": norm}
        if finite:
            if self.clip:  # the clip's one multiply is the scaler's unscale too
                grads = self._times(factor, grads)
            else:
                grads = self.scaler.unscale(grads)
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, clip, self.one, ops.logical_not(finite)

    def _update_always(self, grads, scale, finite, loss):
        """fixed_nodrop's update, applied whatever the gradients hold: the optimizer's own loss_scale
        unscales, or the step does for one without; the parameters are checked after it."""
        loss = self._keep_weights(ops.logical_not(finite), loss)
        clip = {}
        if self.clip:
            norm, factor = self._clip(grads, scale, self.divide)
            clip = {"global_norm": norm}
            grads = self._times(factor, grads)
        elif self.divide:
            grads = self.scaler.unscale(grads)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, clip, all_finite(ops.depend(self.weights, loss)), self.zero

    def construct(self, *inputs):
        scale = self.one if self.scaler is None else ops.assign(self.scale_used, self.scaler.scale_value)
        lr = self._lr()
        inputs = self._begin(inputs)
        if self.k == 1:
            loss, grads = self._micro_step(scale, *inputs)
        else:
            loss, grads = self._accumulate(inputs, scale)
        grads, layers, statuses = self._split(grads, scale)
        telemetry, loss = self._observe(grads, scale, loss)
        grads = self._advance_and_inject(grads)
        grads, flag = self._saturate(grads, statuses)
        grads = self.grad_reducer(grads)
        amax = {}
        if self.measure_amax:  # the scaler predicts from it; its pass is the overflow check too
            measured, finite = self._amax_and_finite(grads, scale)
            amax = {"grad_amax": measured}
        if self.status_check:  # where amp.all_finite reads the chip's float status in saturation mode
            finite = ops.logical_not(flag)
        elif not self.measure_amax:
            finite = all_finite(grads)
        if self.drop:
            loss, clip, params_finite, skipped = self._update_if_finite(grads, scale, finite, loss)
        else:
            loss, clip, params_finite, skipped = self._update_always(grads, scale, finite, loss)
        if self.measure_amax:
            loss = ops.depend(loss, self.scaler.adjust(finite, measured))
        elif self.scaler is not None:
            loss = ops.depend(loss, self.scaler.adjust(finite))
        loss = self._schedule_moved(loss)
        got = self._first(loss, ops.logical_not(finite), scale, skipped, params_finite, lr)
        got.update(telemetry)
        got.update(amax)
        got.update(clip)
        got.update(self._status(flag))
        return self._stats(got, layers)


def build_train_step(strategy, loss_net: nn.Cell, optimizer: nn.Optimizer,
                     options: StepOptions = StepOptions()) -> nn.Cell:
    """engine=functional's counterpart of lsexp.engines.cell.build_train_step."""
    return FunctionalTrainStep(loss_net, optimizer, strategy.scaler(), strategy.drops_overflow, options,
                               strategy.measures_amax)
