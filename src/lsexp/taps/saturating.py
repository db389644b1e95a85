"""device.overflow_mode=saturation, emulated at the taps: every tapped layer's forward output and the
gradient flowing back into it pass lsexp.saturation's rule (inf as the type's largest value with
its sign, NaN as 0), and the tap reports whether it changed a value, which the train step adds into its
emulated float-status register.

The chip saturates each operation; this saturates each layer's output and incoming gradient, and the
train step each parameter's gradient. An inf that arises inside a layer and is consumed there (a NaN made
of it, say) is seen only as what it makes of the layer's output (docs/saturation.md)."""

from __future__ import annotations

from typing import Optional

import mindspore as ms

from lsexp.native import built
from lsexp.saturation import FALLBACK, KERNELS, Kernels, native_saturates, saturate, saturated
from lsexp.taps.cells import Transform


class SaturatingTransform(Transform):
    """Saturates what `inner` (inject.layer's transform, or none) makes of the layer's output and of the
    gradient flowing into it; status(): 1 when it saturated a value, either way. On CPU a float16,
    bfloat16 or float32 tensor saturates, and raises the flag, in lsexp's native kernels (KERNELS, as
    MindSpore aot operators), and a tap's backward saturates and flags in one of them; elsewhere, or
    where they cannot be built, in MindSpore ops. native: force the choice (tests, benchmarks)."""

    def __init__(self, inner: Optional[Transform] = None, native: Optional[bool] = None):
        super().__init__()
        self.inner = inner if inner is not None else Transform()
        if native is None:
            native = ms.get_context("device_target") == "CPU"
        lib = built(KERNELS, FALLBACK) if native else None
        self.native = lib is not None
        if self.native:
            kernels = Kernels(lib)
            self.rule, self.flag, self.rule_flag = kernels.rule, kernels.flag, kernels.rule_flag

    def _on_kernels(self, x):
        return self.native and native_saturates(x.dtype)

    def _saturate(self, x):
        if self._on_kernels(x):
            return self.rule(x)
        return saturate(x)

    def forward(self, y):
        return self._saturate(self.inner.forward(y))

    def backward(self, dout, state):
        return self._saturate(self.inner.backward(dout, state))

    def state(self):
        return self.inner.state()

    def replay(self, y, state):
        return self._saturate(self.inner.replay(y, state))

    def status(self, y, dout, state):
        y, dout = self.inner.replay(y, state), self.inner.backward(dout, state)
        if self._on_kernels(y) and self._on_kernels(dout):
            return self.flag(y, dout).reshape(())
        return saturated(y, dout)

    def backward_status(self, y, dout, state):
        y, dout = self.inner.replay(y, state), self.inner.backward(dout, state)
        if self._on_kernels(y) and self._on_kernels(dout):
            out, flag = self.rule_flag(y, dout)
            return out, flag.reshape(())
        return saturate(dout), saturated(y, dout)
