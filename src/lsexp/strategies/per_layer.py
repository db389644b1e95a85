"""loss_scale=per_layer's global part, as a MindSpore loss-scale manager; the per-layer rule is the taps'
(lsexp.taps.adaptive)."""

from __future__ import annotations

from mindspore.amp import FixedLossScaleManager


class PerLayerLossScaleManager(FixedLossScaleManager):
    """The global part of loss_scale=per_layer: FixedLossScaleManager(init_scale) with overflowed updates
    skipped. The per-layer keys are the taps' (lsexp.taps.adaptive.AdaLossTransform)."""

    def __init__(self, init_scale: float = 1.0, scale_upper_bound: float = 16.0,
                 accum_upper_bound: float = 1024.0, n_uf_threshold: float = 1e-3):
        super().__init__(init_scale, drop_overflow_update=True)
        self.scale_upper_bound, self.accum_upper_bound = scale_upper_bound, accum_upper_bound
        self.n_uf_threshold = n_uf_threshold
