"""The step body both engines' train steps share: the step counter, overflow injection inside the
compiled step, what is done around the update (the learning rate the step uses, clipping of the
unscaled gradients, a schedule that moves on skipped steps), the taps', a precision recipe's and
saturation's parts of the step, and one small stats vector per step (lsexp.engines.stats), so recording
costs the single host sync that reading the loss needs anyway."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import all_finite

from lsexp.engines.stats import present
from lsexp.formats.spec import FP16_MAX, FP16_TINY
from lsexp.saturation import saturate_at

_poison = ops.MultitypeFuncGraph("lsexp_poison")


@_poison.register("Tensor", "Tensor")
def _poison_grad(factor, grad):
    return grad * ops.cast(factor, ops.dtype(grad))


_flatten = ops.MultitypeFuncGraph("lsexp_flatten")


@_flatten.register("Tensor")
def _flatten_grad(grad):
    if grad.dtype != mstype.float32:  # decided when the graph compiles: float32 gradients need no cast
        grad = ops.cast(grad, mstype.float32)
    return grad.reshape((-1,))


_saturate_as = ops.MultitypeFuncGraph("lsexp_saturate")


@_saturate_as.register("Number", "Tensor")
def _saturate_grad(largest, grad):
    return saturate_at(grad, largest)


@dataclass(frozen=True)
class StepOptions:
    """What the train step does beside the strategy, as lsexp.training.build decides it from the run's
    plan. Under data parallel every rank compiles the same graph: a rank that injects nothing (inject.rank
    picks another) still carries the injection table (inject_graph). With accumulation, inject_steps count
    micro-batches: micro-batch m (1-based, across the run) is the ((m - 1) % k + 1)-th of optimizer step
    ceil(m / k)."""

    inject_steps: tuple = ()  # the steps whose gradients this rank poisons
    last_step: int = 0
    native_check: bool = False  # the device's own overflow status, not amp.all_finite
    telemetry: bool = False  # telemetry.grads
    histogram: bool = False  # telemetry.histogram_steps: the step keeps its gradients
    inject_graph: bool = False  # some rank injects: every rank's graph carries the injection table
    accumulate_steps: int = 1
    micro_batch: int = 0  # dataset.batch_size: one micro-batch's samples
    # around the update: the unscaled gradients' global norm is clipped to clip_grad_norm; without
    # optimizer_divides the optimizer takes no loss_scale (AdamWeightDecay, Lamb), so gradients that would
    # reach it scaled (fixed_nodrop) are divided by the scale in the step first; with advance_schedule
    # (lr_schedule.on_skip=advance) the step moves the schedule's own counter (the `step` Parameter of
    # lsexp.schedules.cells.OnOwnCounter, the optimizer's learning_rate) every step
    clip_grad_norm: Optional[float] = None
    optimizer_divides: bool = True
    advance_schedule: bool = False
    probes: tuple = ()  # the taps' probe Parameters (telemetry=layers)
    layer_factor: Any = None  # inject.layer's factor Parameter, or None
    keep_weights: bool = False  # telemetry.locate: an overflowed step that updates keeps its weights
    advance: tuple = ()  # the delayed scales of a precision recipe, advanced before each forward pass
    # device.overflow_mode=saturation: the taps' status probes (lsexp.taps.cells.Taps.status_probes),
    # whether the overflow check reads the emulated flag (device.status_check), where a non-finite
    # parameter gradient saturates (amp.dtype's largest value), and the saturation rule's kernels for it
    # (lsexp.saturation.Kernels' rule_as(grad_largest), run on every gradient, every step: on CPU
    # cheaper than the branch that runs MindSpore ops only on a step that needs them; None: that branch)
    # loss_scale=per_layer: the taps' record probes (lsexp.taps.cells.Taps.record_probes), and per weight
    # (name, index) of the record whose carried scale its gradient carries (lsexp.taps.chain); the step
    # multiplies each gradient by the global scale over that one, so that the engine's unscale is right
    records: tuple = ()
    unscale_by: tuple = ()
    saturation: bool = False
    status_probes: tuple = ()
    status_check: bool = False
    grad_largest: Optional[float] = None
    grad_rule: Optional[object] = None


def _world() -> int:
    from mindspore.communication import GlobalComm, get_group_size

    return get_group_size() if GlobalComm.INITED else 1


class StepBody:
    """The step body shared by both train-step cells: what they do beside the strategy."""

    def _init_step(self, options: StepOptions, keep_weights: bool, measure_amax: bool = False):
        """Everything the step does beside the strategy, from its options; keep_weights as the engine
        allows (a step that skips overflowed updates has nothing to keep)."""
        o = options
        self._init_counter(o)
        self._init_taps(o, keep_weights)
        self._init_precision(o.advance)
        self._init_snapshot(o.histogram)
        self._init_update(o, measure_amax)
        self.columns = present(self)  # the names of the step's statistics, in its vector's order

    def _init_counter(self, o: StepOptions):
        """The step counter, injection's table, and the micro-batches of accumulation."""
        inject_steps, last_step, accumulate_steps = o.inject_steps, o.last_step, o.accumulate_steps
        self.native_check = o.native_check
        # train.accumulate_steps: the step's batch is k micro-batches of micro_batch samples each
        self.k, self.micro_batch = accumulate_steps, o.micro_batch
        self.one_kth = Tensor(1.0 / accumulate_steps, mstype.float32)
        self.telemetry = o.telemetry
        self.tiny = Tensor(FP16_TINY, mstype.float32)
        self.fp16_max = Tensor(FP16_MAX, mstype.float32)
        self.hyper_map = ops.HyperMap()
        # A Parameter, so it is saved with the checkpoint and a resumed run keeps counting. Only
        # injection needs it inside the step; otherwise the host sets it before each save.
        self.lsexp_step = Parameter(Tensor(0, mstype.int32), name="lsexp_step", requires_grad=False)
        steps = sorted(set(inject_steps))
        # Data parallel ranks must compile the same graph, so that their gradient all-reduces line up:
        # a rank that injects nothing still carries the (all-false) injection table then.
        self.inject = bool(steps) or o.inject_graph
        table = np.zeros(last_step * accumulate_steps + 2, dtype=np.bool_)  # by micro-batch
        table[steps] = True
        self.inject_table = Tensor(table)
        self.inf = Tensor(float("inf"), mstype.float32)
        self.one = Tensor(1.0, mstype.float32)
        self.zero = Tensor(0.0, mstype.float32)

    def _init_taps(self, o: StepOptions, keep_weights: bool):
        """lsexp.taps' side of the step. The probes: the taps' probe Parameters, whose gradients, taken with
        the weights', carry each layer's statistics out (telemetry=layers); they follow the step's other
        stats. layer_factor: inject.layer's factor, set before the forward pass (the weight gradients are
        then not poisoned). keep_weights: a step that applies every update keeps the weights it started
        from when it overflows, so that the locator can replay it. And saturation's status probes."""
        probes, layer_factor = o.probes, o.layer_factor
        self.n_weights = len(self.weights)
        self.probes = len(probes)
        self.saturation = o.saturation
        statuses = list(o.status_probes) if self.saturation else []
        self.status_check = self.saturation and o.status_check
        self.grad_largest = o.grad_largest if self.saturation else None
        self.grad_rule = o.grad_rule if self.saturation else None
        self.records = len(o.records)
        owner = dict(o.unscale_by)
        self.unscale_by = tuple(owner[w.name] for w in self.weights) if self.records else ()
        extra = list(probes) + statuses + list(o.records)
        self.grad_params = ParameterTuple(list(self.weights) + extra) if extra else self.weights
        self.layer_inject = layer_factor is not None
        if self.layer_inject:
            self.layer_factor = layer_factor
            self.inject = False
        self.keep = keep_weights
        if keep_weights:
            self.shadow = ParameterTuple([Parameter(Tensor(w.asnumpy()), name=f"lsexp_shadow.{w.name}",
                                                    requires_grad=False) for w in self.weights])

    def _init_precision(self, advance=()):
        """lsexp.precision's side of the step: the delayed scales it advances, once, before each forward
        pass (the forward pass runs twice in a step that takes its loss and then its gradient)."""
        names = [(p, p.name) for cell in advance for p in cell.get_parameters()]
        self.delayed_scales = nn.CellList(list(advance), auto_prefix=False)
        for p, name in names:  # held by the network too: the network's names are the checkpoint's
            p.name = name
        self.n_advance = len(advance)
        # TE's reduce_amax: under data parallel the recorded amaxes are reduced to their maximum over the
        # ranks, in one collective before the forward pass (a collective inside it would interleave with
        # others in an order the ranks need not share), so that every rank's scales are the same
        self.amax_reduce, self.own_row = None, None
        if advance and _world() > 1:
            import mindspore as ms
            from mindspore.communication import get_group_size, get_rank

            if ms.get_context("device_target") == "CPU":  # its AllReduce sums: a row each rank fills alone
                self.own_row = Tensor((np.arange(get_group_size()) == get_rank()).reshape(-1, 1))
                self.amax_reduce = ops.AllReduce()
            else:
                self.amax_reduce = ops.AllReduce(ops.ReduceOp.MAX)

    def _begin(self, inputs):
        """Before the forward pass: the delayed scales' update from the last step's amaxes, and
        inject.layer's step counter and factor (the layer's tap reads it)."""
        if self.n_advance:
            first = inputs[0]
            if self.amax_reduce is None:
                for i in range(self.n_advance):
                    first = ops.depend(first, self.delayed_scales[i].advance())
            else:
                recorded = ops.stack([self.delayed_scales[i].recorded() for i in range(self.n_advance)])
                if self.own_row is not None:
                    rows = ops.where(self.own_row, recorded.reshape((1, -1)), 0.0)
                    recorded = self.amax_reduce(rows).max(0)
                else:
                    recorded = self.amax_reduce(recorded)
                for i in range(self.n_advance):
                    first = ops.depend(first, self.delayed_scales[i].advance(recorded[i]))
            inputs = (first,) + inputs[1:]
        if self.layer_inject:
            step = self.lsexp_step + 1
            first = ops.depend(inputs[0], ops.assign(self.lsexp_step, step))
            factor = ops.select(self.inject_table[step], self.inf, self.one)
            first = ops.depend(first, ops.assign(self.layer_factor, factor))
            return (first,) + inputs[1:]
        return inputs

    def _split(self, grads, scale=None):
        """(weight gradients, the probes' statistics as one vector or None, the status probes' gradients).
        Under loss_scale=per_layer each weight gradient is brought from the scale its layer's record says
        it carries to the global `scale`, and the records follow the statistics."""
        n, end = self.n_weights, self.n_weights + self.probes
        layers = ops.concat(grads[n:end]) if self.probes else None
        statuses = grads[end:len(grads) - self.records]
        weights = grads[:n]
        if self.records:
            records = grads[len(grads) - self.records:]
            weights = self._rescaled(weights, records, scale)
            flat = ops.concat(records)
            layers = flat if layers is None else ops.concat((layers, flat))
        return weights, layers, statuses

    def _rescaled(self, grads, records, scale):
        # one factor per layer, shared by its weight and bias: on a step bound by kernel launches
        scale = ops.cast(scale, mstype.float32).reshape(())
        factors = ()
        for r in records:
            factors = factors + (scale / r[1],)
        out = ()
        for i in range(self.n_weights):
            factor = factors[self.unscale_by[i]]
            if grads[i].dtype != mstype.float32:  # decided when the graph compiles
                factor = ops.cast(factor, grads[i].dtype)
            out = out + (grads[i] * factor,)
        return out

    def _saturate(self, grads, statuses):
        """(gradients, emulated float-status flag or None): under device.overflow_mode=saturation each
        gradient saturated as the float16 (or bfloat16) operation that made it would have saturated it,
        and the flag raised when that or a tap (statuses: their status probes' gradients) saturated a
        value. The check reads the flag instead of the values with device.status_check."""
        if not self.saturation:
            return grads, None
        nonfinite = ops.logical_not(all_finite(grads))
        hit = nonfinite
        if statuses:
            hit = ops.logical_or(hit, ops.addn(statuses) > 0)
        if self.grad_rule is not None:
            grads = self.hyper_map(self.grad_rule, grads)
        elif nonfinite:  # a kernel per gradient, only on a step that needs it
            grads = self.hyper_map(ops.partial(_saturate_as, self.grad_largest), grads)
        return grads, hit

    def _checked(self, values_overflow, flag):
        """The overflow the step acts on: the flag under saturation with its status check, else the
        values' own."""
        if self.status_check:
            return flag
        return values_overflow

    def _status(self, flag) -> dict:
        return {"float_status": ops.cast(flag, mstype.float32)} if self.saturation else {}

    def _keep_weights(self, overflow, anchor):
        if self.keep:
            if overflow:
                anchor = ops.depend(anchor, self.hyper_map(ops.assign, self.shadow, self.weights))
        return anchor

    def _init_update(self, o: StepOptions, measure_amax: bool = False):
        self.measure_amax = measure_amax
        self.clip = o.clip_grad_norm is not None
        self.clip_norm = Tensor(o.clip_grad_norm or 1.0, mstype.float32)
        self.advance = o.advance_schedule
        self.step_one = Tensor([1], mstype.int32)

    def _lr(self):
        """The learning rate this step's update uses, or would use if it is skipped: read before the
        optimizer runs, at the step the optimizer will pass its schedule."""
        lr = self.optimizer.learning_rate
        if self.optimizer.dynamic_lr:
            lr = lr(self.optimizer.global_step)
        return ops.cast(lr, mstype.float32).reshape(())

    def _clip(self, grads, carried, take_off):
        """(norm, factor): the global norm of gradients still scaled by `carried`, unscaled, and the one
        factor that clips them, ops.clip_by_global_norm's clip_norm / max(norm, clip_norm), divided by
        `carried` too when take_off: the unscale and the clip are then one multiply per gradient, which
        on an executor-bound step is most of what clipping costs. Written out because the step records
        the norm; whether it clipped is the host's comparison of that norm with clip_norm."""
        flat = ops.concat(self.hyper_map(_flatten, grads))
        norm = ops.sqrt((flat * flat).sum()) / carried
        factor = self.clip_norm / ops.maximum(norm, self.clip_norm)
        return norm, factor / carried if take_off else factor

    def _amax_and_finite(self, grads, carried=None):
        """(amax, finite): the largest magnitude of gradients still scaled by `carried` (None: unscaled
        already), unscaled, and whether every gradient is finite, from one pass over the concatenated
        gradients. A NaN counts as infinite (max alone skips it), so the amax answers amp.all_finite's
        question too, at a third of its kernels on a step bound by kernel launches."""
        flat = ops.abs(ops.concat(self.hyper_map(_flatten, grads)))
        amax = ops.nan_to_num(flat, nan=float("inf"), posinf=float("inf")).max()
        finite = amax < self.inf
        if carried is None:
            return amax, finite
        return amax / ops.cast(carried, mstype.float32).reshape(()), finite

    def _times(self, factor, grads):
        return self.hyper_map(ops.partial(_poison, factor), grads)

    def _schedule_moved(self, loss):
        if self.advance:
            loss = ops.depend(loss, ops.assign_add(self.optimizer.learning_rate.step, self.step_one))
        return loss

    def _accumulate(self, inputs, sens):
        """(mean loss, mean gradients) of the step's k micro-batches, one forward and backward pass
        each, in order; an injected step poisons its own micro-batch's gradients. Their sum divided
        by k: k micro-batches of b give the gradients of one batch of k*b."""
        step = self.lsexp_step + 1
        if self.inject:
            sens = ops.depend(sens, ops.assign(self.lsexp_step, step))
        loss_sum, grads_sum = self.zero, None
        for i in range(self.k):
            lo = i * self.micro_batch
            micro = ()
            for t in inputs:
                micro = micro + (t[lo:lo + self.micro_batch],)
            loss, grads = self._micro_step(sens, *micro)
            if self.inject:
                grads = self._times(ops.select(self.inject_table[(step - 1) * self.k + i + 1], self.inf,
                                               self.one), grads)
            loss_sum = loss_sum + ops.cast(loss, mstype.float32)
            grads_sum = grads if grads_sum is None else self.hyper_map(ops.add, grads_sum, grads)
        return loss_sum * self.one_kth, self._times(self.one_kth, grads_sum)

    def _advance_and_inject(self, grads):
        if self.inject and self.k == 1:  # accumulation injects by micro-batch, in _accumulate
            step = self.lsexp_step + 1
            grads = ops.depend(grads, ops.assign(self.lsexp_step, step))
            factor = ops.select(self.inject_table[step], self.inf, self.one)
            grads = self.hyper_map(ops.partial(_poison, factor), grads)
        return grads

    def _init_snapshot(self, histogram: bool):
        """telemetry.histogram_steps: the step keeps its gradients, as backprop made them, flattened in a
        Parameter the host reads after a histogram step (one device copy a step, no graph of its own)."""
        self.snap = histogram
        if histogram:
            size = sum(int(np.prod(w.shape)) for w in self.weights)
            self.grad_snapshot = Parameter(Tensor(np.zeros(size, np.float32)), name="lsexp_grad_snapshot",
                                           requires_grad=False)

    def _observe(self, scaled_grads, scale, loss):
        """(telemetry.grads' statistics by name or {}, loss ordered after the snapshot of histogram
        steps)."""
        if not (self.telemetry or self.snap):
            return {}, loss
        flat = ops.concat(self.hyper_map(_flatten, scaled_grads))
        if self.snap:
            loss = ops.depend(loss, ops.assign(self.grad_snapshot, flat))
        return (self._grad_telemetry(flat, scale) if self.telemetry else {}), loss

    def _grad_telemetry(self, flat, scale):
        """The gradients as backprop computed them (flattened), scaled by `scale`: their unscaled global
        norm, the fractions of elements that float16 would flush to zero, that overflow it, that are zero,
        and the powers of two between the largest of them and float16's largest value.
        At O2/O3 these are the gradients float16 layers produced; at O0 a what-if for float16."""
        size = ops.cast(ops.size(flat), mstype.float32)
        magnitude = ops.abs(flat)
        zero = ops.cast(magnitude == 0, mstype.float32).sum() / size
        under = ops.cast(ops.logical_and(magnitude > 0, magnitude < self.tiny), mstype.float32).sum() / size
        over = (
            ops.cast(ops.logical_not(magnitude <= self.fp16_max), mstype.float32).sum() / size
        )  # inf, nan too
        norm = ops.sqrt((flat * flat).sum()) / ops.cast(scale, mstype.float32).reshape(())
        headroom = ops.log2(self.fp16_max / magnitude.max())
        return {"grad_norm": norm, "underflow_fraction": under, "overflow_fraction": over,
                "zero_fraction": zero, "headroom_log2": headroom}

    def _first(self, loss, overflow, scale, skipped, params_finite, lr) -> dict:
        """The statistics every step reports (lsexp.engines.stats), as float32 scalars. Every op here is
        a kernel launch on an executor-bound CPU step: cast only what is not float32."""
        return {"loss": ops.cast(loss, mstype.float32).reshape(()),
                "overflow": ops.cast(overflow, mstype.float32), "loss_scale": scale.reshape(()),
                "skipped": ops.cast(skipped, mstype.float32),
                "params_finite": ops.cast(params_finite, mstype.float32), "lr": lr}

    def _stats(self, got, layers=None):
        """The step's one vector: its statistics by name in lsexp.engines.stats' order, then the taps'."""
        if self.telemetry:  # after the update, which the loss depends on
            flat = ops.concat(self.hyper_map(_flatten, ops.depend(self.weights, got["loss"])))
            got["weight_norm"] = ops.sqrt((flat * flat).sum())
        stats = ops.stack([got[name] for name in self.columns])
        if layers is not None:
            stats = ops.concat((stats, layers))
        return stats
