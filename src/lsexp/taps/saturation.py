"""device.overflow_mode=saturation, emulated at the taps: every tapped layer's forward output and the
gradient flowing back into it pass lsexp.formats.saturation's rule (inf as the type's largest value with
its sign, NaN as 0), and the tap reports whether it changed a value, which the train step adds into its
emulated float-status register.

The chip saturates each operation; this saturates each layer's output and incoming gradient, and the
train step each parameter's gradient. An inf that arises inside a layer and is consumed there (a NaN made
of it, say) is seen only as what it makes of the layer's output (docs/saturation.md)."""

from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import dtype as mstype
from mindspore import ops

from lsexp.formats.saturation import host_saturates, nonfinite_np, saturate, saturate_np, saturated
from lsexp.taps.cells import Transform

# Below this many values a tensor saturates in MindSpore ops on CPU too: a host kernel's call costs more
# than their pass over a small tensor, and less than their float16 pass over a large one
# (docs/saturation.md, "What it costs").
HOST_FROM = 2**14


class Saturation(Transform):
    """Saturates what `inner` (inject.layer's transform, or none) makes of the layer's output and of the
    gradient flowing into it; status(): 1 when it saturated a value, either way. On CPU a large float16
    or float32 tensor saturates, and raises the flag, in a host kernel (a MindSpore pyfunc on the
    tensor's bits): MindSpore's CPU kernels walk float16 one value at a time."""

    def __init__(self, inner: Optional[Transform] = None, host: Optional[bool] = None):
        super().__init__()
        self.inner = inner if inner is not None else Transform()
        self.host = ms.get_context("device_target") == "CPU" if host is None else host
        self.host_from = HOST_FROM
        if self.host:
            self.flag = ops.Custom(nonfinite_np, out_shape=lambda y, dout: (1,),
                                   out_dtype=lambda y, dout: mstype.float32, func_type="pyfunc")
            self.rule = ops.Custom(saturate_np, out_shape=lambda x: x, out_dtype=lambda x: x,
                                   func_type="pyfunc")

    def _on_host(self, x):
        return self.host and host_saturates(x.dtype) and x.size >= self.host_from

    def _saturate(self, x):
        if self._on_host(x):
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
        if self._on_host(y) and self._on_host(dout):
            return self.flag(y, dout).reshape(())
        return saturated(y, dout)
