"""device.overflow_mode=saturation, emulated at the taps: every tapped layer's forward output and the
gradient flowing back into it pass lsexp.formats.saturation's rule (inf as the type's largest value with
its sign, NaN as 0), and the tap reports how many values it changed, which the train step sums into its
emulated float-status register.

The chip saturates each operation; this saturates each layer's output and incoming gradient, and the
train step each parameter's gradient. An inf that arises inside a layer and is consumed there (a NaN made
of it, say) is seen only as what it makes of the layer's output (docs/saturation.md)."""

from __future__ import annotations

from typing import Optional

from lsexp.formats.saturation import saturate, saturated
from lsexp.taps.cells import Transform


class Saturation(Transform):
    """Saturates what `inner` (inject.layer's transform, or none) makes of the layer's output and of the
    gradient flowing into it; status(): how many values it saturated, both ways."""

    def __init__(self, inner: Optional[Transform] = None):
        super().__init__()
        self.inner = inner if inner is not None else Transform()

    def forward(self, y):
        return saturate(self.inner.forward(y))

    def backward(self, dout, state):
        return saturate(self.inner.backward(dout, state))

    def state(self):
        return self.inner.state()

    def replay(self, y, state):
        return saturate(self.inner.replay(y, state))

    def status(self, y, dout, state):
        return saturated(self.inner.replay(y, state), self.inner.backward(dout, state))
