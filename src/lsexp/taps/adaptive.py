"""Adaptive loss scaling per layer through the taps (loss_scale=per_layer): the rule each layer's tap
applies to the gradient its backward pass receives.

The rule is AdaLoss's "approx_range" (kumasento/gradient-scaling at 0ca4354,
ada_loss/chainer_impl/ada_loss_chainer.py, get_loss_scale_by_approx_range and
bound_loss_scale_by_heuristics; ada_loss/core.py, get_power_of_two_scale). For a layer whose weight W
(out x in, the sums of the backward g @ W of length fan_in = out; out x kh x kw for a convolution's)
receives g, carrying the scale `prev`:

    sigma = sqrt((std(g)^2 + mean(g)^2) (std(W)^2 + mean(W)^2)) sqrt(fan_in / 2)
    scale = max(u_min / (T sigma), 1), capped at (u_max / fan_in) / max|extremes of g times extremes of W|
    scale = min(scale, accum_upper_bound / prev, scale_upper_bound), then 2^floor(log2(scale))

with u_min = 6e-8 and u_max = 65504 (float16's), T = sqrt(2) erfinv(n_uf_threshold), and scale 1 when
sigma is 0. The float types are the reference's under numpy 1.x: statistics in float32, the products of
statistics in float64 (host_rule). The gradient the layer's backward receives is g * scale, carrying
prev * scale; the layer's weight gradient is computed from it and unscaled by prev * scale in the step
(lsexp.engines.body). docs/per_layer.md says where this differs from the reference.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from mindspore import Tensor, ops
from mindspore import dtype as mstype

from lsexp.formats.spec import FP16_MAX
from lsexp.taps.cells import LinkedTransform

U_MIN = np.float32(6.0e-8)  # AdaLoss.get_u_min("float16")
U_MAX = np.float32(FP16_MAX)  # AdaLoss.get_u_max("float16")


def threshold(n_uf: float) -> float:
    """sqrt(2) erfinv(n_uf): |x| of a unit normal stays below it with probability n_uf."""
    return NormalDist().inv_cdf(0.5 * (n_uf + 1))


def as_bound(value: float) -> np.float64:
    """A bound as AdaLoss holds it: a float16 array (its scale dtype), read back through float32."""
    return np.float64(np.float32(np.float16(value)))


def fan_in_of(shape) -> int:
    """The length of the sums in the layer's backward product with W: out for a Dense weight (out x in),
    out x kh x kw for a convolution's (out x in x kh x kw)."""
    return int(shape[0]) if len(shape) == 2 else int(shape[0] * shape[2] * shape[3])


def host_rule(g: np.ndarray, w: np.ndarray, carried, init_scale: float, scale_upper: np.float64,  # noqa: PLR0913
              accum_upper: np.float64, t: float) -> np.ndarray:
    """[the layer's scale, the scale the gradient then carries]; carried 0: the chain's last layer, whose
    gradient carries init_scale. A gradient with an inf or NaN (a step that overflowed, and is skipped)
    gives NaN: numpy's warnings about it would only repeat the overflow."""
    with np.errstate(all="ignore"):
        return _rule(g, w, carried, init_scale, scale_upper, accum_upper, t)


def _rule(g, w, carried, init_scale, scale_upper, accum_upper, t):  # noqa: PLR0913
    prev = np.float64(np.float32(carried)) or np.float64(init_scale)
    g32, w32 = g.astype(np.float32), w.astype(np.float32)
    g_mu, g_sigma, w_mu, w_sigma = g32.mean(), g32.std(), w32.mean(), w32.std()
    variance = (np.float64(g_sigma) ** 2 + np.float64(g_mu) ** 2) * (np.float64(w_sigma) ** 2
                                                                    + np.float64(w_mu) ** 2)
    sigma = np.float32(np.sqrt(variance))
    if sigma == 0:
        scale = np.float32(1.0)
    else:
        fan_in = float(np.float32(fan_in_of(w.shape)))
        # of the float32 copies: the same values (the widening is exact), and numpy's float16 max is slow
        g_max, g_min, w_max, w_min = g32.max(), g32.min(), w32.max(), w32.min()
        o_max = np.abs(np.array([g_max * w_max, g_min * w_min, g_max * w_min, g_min * w_max])).max()
        scale = np.float64(U_MIN) / (t * (np.float64(sigma) * np.sqrt(0.5 * fan_in)))
        scale = max(scale, np.float64(1.0))
        scale = np.float32(min(scale, (np.float64(U_MAX) / fan_in) / np.float64(o_max)))
    scale = np.float32(min(scale_upper, min(accum_upper / prev, np.float64(scale))))
    scale = np.float64(2.0) ** np.float64(np.floor(np.log2(scale)))
    return np.array([scale, prev * scale], np.float32)


class AdaLossTransform(LinkedTransform):
    """A layer's tap under loss_scale=per_layer: the gradient its backward receives times the layer's
    scale. host: the rule runs on the host as one kernel (a MindSpore pyfunc, on CPU); else in MindSpore
    ops, in float32 where the host's products of statistics are float64."""

    def __init__(self, init_scale: float, scale_upper_bound: float, accum_upper_bound: float,
                 n_uf_threshold: float, host: bool):
        super().__init__()
        self.host = host
        self.t = threshold(n_uf_threshold)
        self.init_scale = init_scale
        self.scale_upper, self.accum_upper = as_bound(scale_upper_bound), as_bound(accum_upper_bound)
        self.init = Tensor(init_scale, mstype.float32)
        self.u_min, self.u_max = Tensor(U_MIN, mstype.float32), Tensor(U_MAX, mstype.float32)
        self.upper = Tensor(np.float32(self.scale_upper), mstype.float32)
        self.accum = Tensor(np.float32(self.accum_upper), mstype.float32)
        self.one = Tensor(1.0, mstype.float32)
        self.halves, self.to_scalar = ops.Split(0, 2), ops.Reshape()
        if host:
            consts = (init_scale, self.scale_upper, self.accum_upper, self.t)

            def rule(g, w, carried):
                return host_rule(g, w, carried, *consts)

            self.rule = ops.Custom(rule, out_shape=lambda g, w, c: (2,),
                                   out_dtype=lambda g, w, c: mstype.float32, func_type="pyfunc")

    def backward_linked(self, dout, state, weight, carried):
        w = ops.cast(weight, dout.dtype)  # as the layer multiplies by it
        if self.host:
            record = self.rule(dout, w, carried)
        else:
            record = self.rule_ops(dout, w, carried)
        # primitives made here, not by ops.split or record[0]: inside a bprop beside a layer with a bprop of
        # its own (the unit-scaled MLP's UnitDense) the compiler loses a primitive that a functional op
        # makes as it compiles ("the func graph is empty")
        scale, carried_out = self.halves(record)
        return dout * ops.cast(scale, dout.dtype), self.to_scalar(carried_out, ()), record

    def rule_ops(self, g, w, carried):
        prev = ops.select(carried > 0, carried, self.init)
        g32, w32 = ops.cast(g, mstype.float32), ops.cast(w, mstype.float32)
        g_mu, w_mu = g32.mean(), w32.mean()
        g_sq = ((g32 - g_mu) ** 2).mean() + g_mu * g_mu
        w_sq = ((w32 - w_mu) ** 2).mean() + w_mu * w_mu
        sigma = ops.sqrt(g_sq * w_sq)
        fan_in = float(fan_in_of(w.shape))
        g_max, g_min = ops.cast(g.max(), mstype.float32), ops.cast(g.min(), mstype.float32)
        w_max, w_min = w32.max(), w32.min()
        o_max = ops.maximum(ops.maximum(ops.abs(g_max * w_max), ops.abs(g_min * w_min)),
                            ops.maximum(ops.abs(g_max * w_min), ops.abs(g_min * w_max)))
        scale = self.u_min / (self.t * sigma * math.sqrt(0.5 * fan_in))
        scale = ops.minimum(ops.maximum(scale, self.one), (self.u_max / fan_in) / o_max)
        scale = ops.select(sigma > 0, scale, self.one)
        scale = ops.minimum(self.upper, ops.minimum(self.accum / prev, scale))
        scale = ops.pow(2.0, ops.floor(ops.log2(scale)))
        return ops.concat([scale.reshape(1), (prev * scale).reshape(1)])  # concat, as above
