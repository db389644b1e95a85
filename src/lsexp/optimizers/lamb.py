"""nn.Lamb on CPU. MindSpore 2.10's nn.Lamb runs its fused Lamb primitive, which has kernels for GPU and
Ascend only ("Unsupported op [Lamb] on CPU" when the step compiles). CpuLamb is nn.Lamb with that one
primitive written out in MindSpore ops, as its GPU kernel computes it:
mindspore/ccsrc/plugin/device/gpu/kernel/cuda_impl/cuda_ops/lamb_impl.cu (ApplyLambEraly, ApplyLambLater)
and mindspore/ccsrc/plugin/device/gpu/kernel/nn/lamb_gpu_kernel.h (CalcTrustRatio). Everything else is
nn.Lamb's own: its parameters, moments, global_step, groups and learning rate.

Two details of that kernel are kept as they are, because equal to it is the point: the trust ratio's
denominator is the norm of m / sqrt(v + eps) + decay * w (eps inside the root), while the update is
m / (sqrt(v) + eps) + decay * w; and the ratio is 1 where either norm is 0, 0 where it is nan, and at
most 10.
"""

from __future__ import annotations

from mindspore import dtype as mstype
from mindspore import nn, ops

_cpu_lamb = ops.MultitypeFuncGraph("lsexp_cpu_lamb")


@_cpu_lamb.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                    "Tensor", "Bool", "Bool")
def _lamb(beta1, beta2, eps, global_step, lr, weight_decay, param, m, v, gradient, decay_flag, optim_filter):
    if not optim_filter:
        return gradient
    decay = weight_decay if decay_flag else ops.zeros_like(weight_decay)
    decay = ops.cast(decay, mstype.float32)
    step = ops.cast(global_step, mstype.float32)
    var = ops.cast(param, mstype.float32)
    grad = ops.cast(gradient, mstype.float32)
    next_m = beta1 * ops.cast(m, mstype.float32) + (1 - beta1) * grad
    next_v = beta2 * ops.cast(v, mstype.float32) + (1 - beta2) * (grad * grad)
    next_mm = next_m / (1 - ops.pow(beta1, step))
    next_vv = next_v / (1 - ops.pow(beta2, step))
    g_hat = next_mm / ops.sqrt(next_vv + eps) + decay * var
    update = next_mm / (ops.sqrt(next_vv) + eps) + decay * var
    w_norm = ops.sqrt((var * var).sum())
    g_hat_norm = ops.sqrt((g_hat * g_hat).sum())
    one = ops.ones_like(w_norm)
    ratio = ops.select(w_norm > 0, ops.select(g_hat_norm > 0, w_norm / g_hat_norm, one), one)
    ratio = ops.select(ops.logical_or(ops.isnan(ratio), ratio < 0), ops.zeros_like(ratio),
                       ops.minimum(ratio, one * 10))
    next_param = var - ratio * ops.cast(lr, mstype.float32) * update
    next_param = ops.depend(next_param, ops.assign(m, ops.cast(next_m, m.dtype)))
    next_param = ops.depend(next_param, ops.assign(v, ops.cast(next_v, v.dtype)))
    return ops.assign(param, ops.cast(next_param, param.dtype))


class CpuLamb(nn.Lamb):
    """nn.Lamb whose update is the ops above instead of the fused primitive; nn.Lamb.construct otherwise."""

    def construct(self, gradients):
        weight_decay = self.get_weight_decay()
        lr = self.get_lr()
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        gradients = self.gradients_centralization(gradients)
        lamb, b1, b2, eps, t = _cpu_lamb, self.beta1, self.beta2, self.eps, self.global_step
        params, m, v, flags, filters = (self.params, self.moments1, self.moments2, self.decay_flags,
                                        self.optim_filter)
        # spelled out as nn.Lamb spells it: graph mode takes neither a partial of a partial nor *args here
        if self.is_group:
            if self.is_group_lr:
                result = self.hyper_map(ops.partial(lamb, b1, b2, eps, t), lr, weight_decay, params, m, v,
                                        gradients, flags, filters)
            else:
                result = self.hyper_map(ops.partial(lamb, b1, b2, eps, t, lr), weight_decay, params, m, v,
                                        gradients, flags, filters)
        else:
            result = self.hyper_map(ops.partial(lamb, b1, b2, eps, t, lr, weight_decay), params, m, v,
                                    gradients, flags, filters)
        if self.use_parallel:
            result = ops.depend(result, self.broadcast_params(result))
        return result
