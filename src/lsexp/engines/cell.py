"""engine=cell: the train step as ms.Model builds it, from the strategy's update cell.

The scale arithmetic is MindSpore's own: FixedLossScaleManager / DynamicLossScaleManager hand
out their update cell, and the train step calls it exactly as nn.TrainOneStepWithLossScaleCell
does. What lsexp adds is what MindSpore lacks:

- a portable overflow check: the cell's native check uses NPUGetFloatStatusV2 / FloatStatus,
  which have no CPU kernels, so on CPU it is replaced by mindspore.amp.all_finite;
- overflow injection inside the compiled step, so a strategy's reaction can be tested;
- one small stats vector per step (loss, overflow, scale used, update skipped, parameters
  finite, and with telemetry the gradient statistics), so recording costs the single host sync
  that reading the loss needs anyway.
"""

from __future__ import annotations

from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import all_finite

# private: the unscaling map TrainOneStepWithLossScaleCell applies, so this cell does exactly what it does
from mindspore.nn.wrap.loss_scale import _grad_scale

from lsexp.engines.body import StepBody, StepOptions


class LossScaleTrainStep(StepBody, nn.TrainOneStepWithLossScaleCell):
    """nn.TrainOneStepWithLossScaleCell with a CPU-capable overflow check; used for drop and dynamic."""

    def __init__(self, network, optimizer, scale_sense, options: StepOptions = StepOptions(),
                 measure_amax: bool = False):
        super().__init__(network, optimizer, scale_sense)
        self._init_step(options, keep_weights=False, measure_amax=measure_amax)  # an overflow is not applied
        self.scale_used = Parameter(Tensor(1.0, mstype.float32), name="lsexp_scale_used", requires_grad=False)
        self.dynamic = not isinstance(scale_sense, nn.FixedLossScaleUpdateCell)  # a fixed scale never changes

    def scale_now(self) -> float:
        return float(self.scale_sense.asnumpy())

    def _micro_step(self, scaling_sens, *inputs):  # one of _accumulate's micro-batches
        loss = self.network(*inputs)
        scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        return loss, self.grad(self.network, self.weights)(*inputs, scaling_sens_filled)

    def get_overflow_status(self, status, compute_output):
        if self.native_check:
            return super().get_overflow_status(status, compute_output)
        return ops.logical_not(all_finite(compute_output))

    def construct(self, *inputs):
        # The body of TrainOneStepWithLossScaleCell.construct, plus injection, what is done around the
        # update, and stats.
        lr = self._lr()
        inputs = self._begin(inputs)
        scaling_sens = self.scale_sense
        loss = self.network(*inputs) if self.k == 1 else scaling_sens
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        scale_used = scaling_sens
        if self.dynamic:
            # The update cell assigns the scale in place, and the graph compiler folds a plain copy back
            # into the Parameter: an assign is a side effect, kept in program order before the update's.
            scale_used = ops.assign(self.scale_used, scaling_sens)
        if self.k == 1:
            scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
            grads = self.grad(self.network, self.grad_params)(*inputs, scaling_sens_filled)
        else:
            loss, grads = self._accumulate(inputs, scaling_sens)
        grads, layers, statuses = self._split(grads, scale_used)
        telemetry, loss = self._observe(grads, scale_used, loss)
        # Injected before the reducer (DistributedGradReducer under data parallel, else identity),
        # and checked after it: one rank's poisoned gradient reaches every rank's overflow decision.
        # Saturation, where the mode asks for it, acts on what injection left, as a chip's would on an
        # operation that overflowed; the unscale follows, as on the chip (an injected inf stays inf).
        grads = self._advance_and_inject(grads)
        grads, flag = self._saturate(grads, statuses)
        if not self.clip:  # with clipping, the unscale is the clip's multiply, after the check
            grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        grads = self.grad_reducer(grads)
        amax = {}
        if self.measure_amax:  # the update cell predicts the scale from it (with clipping, still scaled)
            measured, finite = self._amax_and_finite(grads, scale_used if self.clip else None)
            # on CPU the amax's pass is the overflow check; a device's own status register stays
            cond = self.get_overflow_status(status, grads) if self.native_check else ops.logical_not(finite)
            cond = self._checked(cond, flag)
            overflow = self.loss_scaling_manager(self.scale_sense, cond, measured)
            amax = {"grad_amax": measured}
        else:
            if self.status_check:  # where MindSpore reads the chip's float status (NPUGetFloatStatusV2)
                cond = flag
            else:
                cond = self.get_overflow_status(status, grads)
            overflow = self.process_loss_scale(cond)
        clip = {}
        if self.clip:  # the norm of the unscaled gradients; a skipped step is not clipped
            norm, factor = self._clip(grads, ops.cast(scale_used, mstype.float32), True)
            clip = {"global_norm": norm}
        if not overflow:
            if self.clip:
                grads = self._times(factor, grads)
            loss = ops.depend(loss, self.optimizer(grads))
        loss = self._schedule_moved(loss)
        # Only finite gradients are applied here, so the parameters stay finite unless the loss
        # itself blows up, which the loss shows: no per-step pass over the parameters.
        got = self._first(loss, cond, scale_used, overflow, self.one, lr)
        got.update(telemetry)
        got.update(amax)
        got.update(clip)
        got.update(self._status(flag))
        return self._stats(got, layers)


class NoDropTrainStep(StepBody, nn.TrainOneStepCell):
    """What ms.Model builds for FixedLossScaleManager(drop_overflow_update=False): a TrainOneStepCell
    whose sens is the loss scale, with the optimizer's own loss_scale dividing the gradients; and,
    with sens 1, what it builds without a manager (loss_scale=none). The update is always applied;
    the overflow flag is only recorded."""

    def __init__(self, network, optimizer, sens, options: StepOptions = StepOptions()):
        super().__init__(network, optimizer, sens)
        self._init_step(options, keep_weights=options.keep_weights)
        self.scale = Tensor(sens, mstype.float32)
        # the optimizer takes no loss_scale: the step takes the scale off the gradients first
        self.divide = sens != 1 and not options.optimizer_divides
        self.inverse = Tensor(1.0 / sens, mstype.float32)

    def scale_now(self) -> float:
        return float(self.sens)

    def _micro_step(self, sens, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, sens)
        return loss, self.grad(self.network, self.grad_params)(*inputs, sens)

    def construct(self, *inputs):
        lr = self._lr()
        inputs = self._begin(inputs)
        if self.k == 1:
            loss, grads = self._micro_step(self.sens, *inputs)
        else:
            loss, grads = self._accumulate(inputs, self.sens)
        grads, layers, statuses = self._split(grads, self.scale)
        telemetry, loss = self._observe(grads, self.scale, loss)
        grads = self._advance_and_inject(grads)
        grads, flag = self._saturate(grads, statuses)
        grads = self.grad_reducer(grads)
        if self.status_check:  # the emulated status flag, not a pass over the values
            overflow = flag
        else:
            overflow = ops.logical_not(all_finite(grads))
        loss = self._keep_weights(overflow, loss)
        clip = {}
        if self.clip:  # of the unscaled gradients; the factor also unscales them when the optimizer does not
            norm, factor = self._clip(grads, self.scale, self.divide)
            clip = {"global_norm": norm}
            grads = self._times(factor, grads)
        elif self.divide:
            grads = self._times(self.inverse, grads)
        loss = ops.depend(loss, self.optimizer(grads))
        loss = self._schedule_moved(loss)
        # An overflowed update is applied here, so check what it did to the parameters.
        params_finite = all_finite(ops.depend(self.weights, loss))
        got = self._first(loss, overflow, self.scale, self.zero, params_finite, lr)
        got.update(telemetry)
        got.update(clip)
        got.update(self._status(flag))
        return self._stats(got, layers)


def build_train_step(strategy, loss_net: nn.Cell, optimizer: nn.Optimizer,
                     options: StepOptions = StepOptions()) -> nn.Cell:
    """The strategy as a train-step cell, built as ms.Model would build it: with its update cell when
    overflowed updates are dropped, else a TrainOneStepCell whose sens is the scale (1 for none)."""
    if not strategy.drops_overflow:
        return NoDropTrainStep(loss_net, optimizer, strategy.scale, options)
    return LossScaleTrainStep(loss_net, optimizer, strategy.update_cell(), options, strategy.measures_amax)
