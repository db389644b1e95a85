"""Where the loss_scale group becomes MindSpore objects: the manager, its update cell, the train step.

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

from typing import Iterable, Optional

import numpy as np
from hydra.utils import instantiate
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import all_finite
from mindspore.nn.wrap.loss_scale import _grad_scale

from lsexp.config import optimizer_loss_scale, strategy

_poison = ops.MultitypeFuncGraph("lsexp_poison")


@_poison.register("Tensor", "Tensor")
def _poison_grad(factor, grad):
    return grad * ops.cast(factor, ops.dtype(grad))


_flatten = ops.MultitypeFuncGraph("lsexp_flatten")


@_flatten.register("Tensor")
def _flatten_grad(grad):
    return ops.cast(grad, mstype.float32).reshape((-1,))


# float16's smallest subnormal and largest finite value: a scaled gradient below the first
# flushes to zero, above the second overflows (Micikevicius et al. 2018).
FP16_TINY, FP16_MAX = 2.0**-24, 65504.0
TELEMETRY = ("grad_norm", "underflow_fraction", "overflow_fraction", "zero_fraction")


class _StepRecorder:
    """Step counter, injection and stats shared by both train-step cells."""

    def _init_recorder(self, inject_steps: Iterable[int], last_step: int, native_check: bool, telemetry: bool,
                       inject_graph: bool = False):
        self.native_check = native_check
        self.telemetry = telemetry
        self.tiny = Tensor(FP16_TINY, mstype.float32)
        self.fp16_max = Tensor(FP16_MAX, mstype.float32)
        self.hyper_map = ops.HyperMap()
        # A Parameter, so it is saved with the checkpoint and a resumed run keeps counting. Only
        # injection needs it inside the step; otherwise the host sets it before each save.
        self.lsexp_step = Parameter(Tensor(0, mstype.int32), name="lsexp_step", requires_grad=False)
        steps = sorted(set(inject_steps))
        # Data parallel ranks must compile the same graph, so that their gradient all-reduces line up:
        # a rank that injects nothing still carries the (all-false) injection table then.
        self.inject = bool(steps) or inject_graph
        table = np.zeros(last_step + 2, dtype=np.bool_)
        table[steps] = True
        self.inject_table = Tensor(table)
        self.inf = Tensor(float("inf"), mstype.float32)
        self.one = Tensor(1.0, mstype.float32)
        self.zero = Tensor(0.0, mstype.float32)

    def _advance_and_inject(self, grads):
        if self.inject:
            step = self.lsexp_step + 1
            grads = ops.depend(grads, ops.assign(self.lsexp_step, step))
            factor = ops.select(self.inject_table[step], self.inf, self.one)
            grads = self.hyper_map(ops.partial(_poison, factor), grads)
        return grads

    def _grad_telemetry(self, scaled_grads, scale):
        """The gradients as backprop computed them, scaled by `scale`: their unscaled global norm and
        the fractions of elements that float16 would flush to zero, that overflow it, that are zero.
        At O2/O3 these are the gradients float16 layers produced; at O0 a what-if for float16."""
        flat = ops.concat(self.hyper_map(_flatten, scaled_grads))
        size = ops.cast(ops.size(flat), mstype.float32)
        magnitude = ops.abs(flat)
        zero = ops.cast(magnitude == 0, mstype.float32).sum() / size
        under = ops.cast(ops.logical_and(magnitude > 0, magnitude < self.tiny), mstype.float32).sum() / size
        over = ops.cast(ops.logical_not(magnitude <= self.fp16_max), mstype.float32).sum() / size  # inf, nan too
        norm = ops.sqrt((flat * flat).sum()) / ops.cast(scale, mstype.float32).reshape(())
        return [norm, under, over, zero]

    def _stats(self, loss, overflow, scale, skipped, params_finite, telemetry=()):
        # Every op here is a kernel launch on an executor-bound CPU step: cast only what is not float32.
        return ops.stack([ops.cast(loss, mstype.float32).reshape(()), ops.cast(overflow, mstype.float32),
                          scale.reshape(()), ops.cast(skipped, mstype.float32),
                          ops.cast(params_finite, mstype.float32), *telemetry])


class LossScaleTrainStep(_StepRecorder, nn.TrainOneStepWithLossScaleCell):
    """nn.TrainOneStepWithLossScaleCell with a CPU-capable overflow check; used for drop and dynamic."""

    def __init__(self, network, optimizer, scale_sense, *, inject_steps=(), last_step=0, native_check=False,
                 telemetry=False, inject_graph=False):
        super().__init__(network, optimizer, scale_sense)
        self._init_recorder(inject_steps, last_step, native_check, telemetry, inject_graph)
        self.scale_used = Parameter(Tensor(1.0, mstype.float32), name="lsexp_scale_used", requires_grad=False)
        self.dynamic = not isinstance(scale_sense, nn.FixedLossScaleUpdateCell)  # a fixed scale never changes

    def scale_now(self) -> float:
        return float(self.scale_sense.asnumpy())

    def get_overflow_status(self, status, compute_output):
        if self.native_check:
            return super().get_overflow_status(status, compute_output)
        return ops.logical_not(all_finite(compute_output))

    def construct(self, *inputs):
        # The body of TrainOneStepWithLossScaleCell.construct, plus injection and stats.
        weights = self.weights
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        scale_used = scaling_sens
        if self.dynamic:
            # The update cell assigns the scale in place, and the graph compiler folds a plain copy back
            # into the Parameter: an assign is a side effect, kept in program order before the update's.
            scale_used = ops.assign(self.scale_used, scaling_sens)
        scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, weights)(*inputs, scaling_sens_filled)
        telemetry = self._grad_telemetry(grads, scale_used) if self.telemetry else []
        grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        # Injected before the reducer (DistributedGradReducer under data parallel, else identity),
        # and checked after it: one rank's poisoned gradient reaches every rank's overflow decision.
        grads = self._advance_and_inject(grads)
        grads = self.grad_reducer(grads)
        cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        # Only finite gradients are applied here, so the parameters stay finite unless the loss
        # itself blows up, which the loss shows: no per-step pass over the parameters.
        return self._stats(loss, cond, scale_used, overflow, self.one, telemetry)


class NoDropTrainStep(_StepRecorder, nn.TrainOneStepCell):
    """What ms.Model builds for FixedLossScaleManager(drop_overflow_update=False): a TrainOneStepCell
    whose sens is the loss scale, with the optimizer's own loss_scale dividing the gradients; and,
    with sens 1, what it builds without a manager (loss_scale=none). The update is always applied;
    the overflow flag is only recorded."""

    def __init__(self, network, optimizer, sens, *, inject_steps=(), last_step=0, native_check=False,
                 telemetry=False, inject_graph=False):
        super().__init__(network, optimizer, sens)
        self._init_recorder(inject_steps, last_step, native_check, telemetry, inject_graph)
        self.scale = Tensor(sens, mstype.float32)

    def scale_now(self) -> float:
        return float(self.sens)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        telemetry = self._grad_telemetry(grads, self.scale) if self.telemetry else []
        grads = self._advance_and_inject(grads)
        grads = self.grad_reducer(grads)
        overflow = ops.logical_not(all_finite(grads))
        loss = ops.depend(loss, self.optimizer(grads))
        # An overflowed update is applied here, so check what it did to the parameters.
        params_finite = all_finite(ops.depend(self.weights, loss))
        return self._stats(loss, overflow, self.scale, self.zero, params_finite, telemetry)


def build_optimizer(cfg, params) -> nn.Optimizer:
    """The optimizer group, with the loss_scale the strategy requires (see config.optimizer_loss_scale)."""
    return instantiate(cfg.optimizer, params=params, loss_scale=optimizer_loss_scale(cfg), _convert_="all")


def injection(cfg, last_step: int, native_check: bool, rank: int) -> dict:
    """The recorder's options shared by both engines' train steps. Under data parallel, inject.rank
    picks the one rank whose gradients are poisoned."""
    steps = list(cfg.inject.overflow_steps)
    mine = steps if cfg.inject.get("rank") is None or cfg.inject.rank == rank else []
    return dict(inject_steps=mine, last_step=last_step, native_check=native_check,
                telemetry=cfg.telemetry.grads, inject_graph=bool(steps))


def build_train_step(cfg, loss_net: nn.Cell, optimizer: nn.Optimizer, last_step: int,
                     native_check: bool, rank: int = 0) -> nn.Cell:
    """engine=cell: the loss_scale group as a train-step cell, built as ms.Model would build it."""
    kwargs = injection(cfg, last_step, native_check, rank)
    if strategy(cfg) == "none":  # ms.Model without a manager: TrainOneStepCell, sens 1
        return NoDropTrainStep(loss_net, optimizer, 1.0, **kwargs)
    manager = instantiate(cfg.loss_scale)  # FixedLossScaleManager / DynamicLossScaleManager / lsexp.hysteresis
    if strategy(cfg) == "fixed_nodrop":
        return NoDropTrainStep(loss_net, optimizer, manager.get_loss_scale(), **kwargs)
    return LossScaleTrainStep(loss_net, optimizer, manager.get_update_cell(), **kwargs)


def loss_scale_now(step_cell: nn.Cell) -> Optional[float]:
    """The scale the next step will use (each engine's train step knows where it keeps it)."""
    return step_cell.scale_now()
