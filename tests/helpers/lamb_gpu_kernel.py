"""MindSpore's GPU kernel of the fused Lamb primitive, transcribed to numpy float32, as the reference for
lsexp.optimizers.lamb.CpuLamb. Read from mindspore-ai/mindspore:
- mindspore/ccsrc/plugin/device/gpu/kernel/cuda_impl/cuda_ops/lamb_impl.cu at
  58b38e0ce2e96000be0da47cadd594bba7b9919d (ApplyLambEralyKernel, ApplyLambAfterNormKernel, float);
- mindspore/ccsrc/plugin/device/gpu/kernel/nn/lamb_gpu_kernel.h at
  7cf3697fa6b6356172f276f321eb9be8c0da95b9 (LambGpuKernelMod::Launch, CalcTrustRatio).
global_step is the kernel's input, which nn.Lamb has already incremented (1 on the first update); decay
is weight_decay where nn.Lamb's decay_flag is set, else 0.
"""

import numpy as np

f32 = np.float32


def lamb_step(var, m, v, grad, lr, beta1, beta2, epsilon, decay, global_step):
    """(var, m, v) after one launch, all float32 arrays."""
    beta1, beta2, epsilon, decay, lr = f32(beta1), f32(beta2), f32(epsilon), f32(decay), f32(lr)
    # ApplyLambEralyKernel
    next_m = beta1 * m + (f32(1) - beta1) * grad
    next_v = beta2 * v + (f32(1) - beta2) * grad ** 2
    next_mm = next_m / (f32(1) - beta1 ** f32(global_step))
    next_vv = next_v / (f32(1) - beta2 ** f32(global_step))
    g_hat_var = next_mm / np.sqrt(next_vv + epsilon) + decay * var
    update = next_mm / (np.sqrt(next_vv) + epsilon) + decay * var
    # CalcTrustRatio: cudnn's NORM2 reductions of var and g_hat_var
    w_norm = np.sqrt(np.sum(var.astype(np.float64) ** 2)).astype(f32)
    g_norm_hat = np.sqrt(np.sum(g_hat_var.astype(np.float64) ** 2)).astype(f32)
    trust_ratio = (w_norm / g_norm_hat if g_norm_hat > 0 else f32(1)) if w_norm > 0 else f32(1)
    if trust_ratio < 0 or np.isnan(trust_ratio):
        trust_ratio = f32(0)
    elif trust_ratio > 10:
        trust_ratio = f32(10)
    # ApplyLambAfterNormKernel
    return var - trust_ratio * lr * update, next_m, next_v
