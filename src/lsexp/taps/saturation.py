"""device.overflow_mode=saturation, emulated at the taps: every tapped layer's forward output and the
gradient flowing back into it pass lsexp.formats.saturation's rule (inf as the type's largest value with
its sign, NaN as 0), and the tap reports how many values it changed, which the train step sums into its
emulated float-status register.

The chip saturates each operation; this saturates each layer's output and incoming gradient, and the
train step each parameter's gradient. An inf that arises inside a layer and is consumed there (a NaN made
of it, say) is seen only as what it makes of the layer's output (docs/saturation.md)."""

from __future__ import annotations

from typing import Optional

import mindspore as ms
import numpy as np
from mindspore import dtype as mstype
from mindspore import ops

from lsexp.formats.saturation import saturate, saturated
from lsexp.taps.cells import Transform


def saturated_host(y: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """saturated(y, dout) counted on the host: the body of the CPU step's one kernel per tap (a MindSpore
    pyfunc), which on a step bound by kernel launches costs less than the seven MindSpore kernels of the
    same flag, as the taps' statistics do (lsexp.taps.cells.exit_stats_host)."""
    return np.array([not (np.isfinite(y).all() and np.isfinite(dout).all())], np.float32)


class Saturation(Transform):
    """Saturates what `inner` (inject.layer's transform, or none) makes of the layer's output and of the
    gradient flowing into it; status(): how many values it saturated, both ways."""

    def __init__(self, inner: Optional[Transform] = None, host: Optional[bool] = None):
        super().__init__()
        self.inner = inner if inner is not None else Transform()
        self.host = ms.get_context("device_target") == "CPU" if host is None else host
        if self.host:
            self.flag = ops.Custom(saturated_host, out_shape=lambda y, dout: (1,),
                                   out_dtype=lambda y, dout: mstype.float32, func_type="pyfunc")

    def forward(self, y):
        return saturate(self.inner.forward(y))

    def backward(self, dout, state):
        return saturate(self.inner.backward(dout, state))

    def state(self):
        return self.inner.state()

    def replay(self, y, state):
        return saturate(self.inner.replay(y, state))

    def status(self, y, dout, state):
        y, dout = self.inner.replay(y, state), self.inner.backward(dout, state)
        if self.host:
            return self.flag(y, dout).reshape(())
        return saturated(y, dout)
