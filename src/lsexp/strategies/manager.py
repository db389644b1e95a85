"""The LossScaleManager of a scaler whose state lives in the compiled step (dynamic_hysteresis, megatron,
adaptive_window, amax_history): like MindSpore's DynamicLossScaleManager it holds the numbers and hands
out an update cell (cell engine) or a mindspore.amp.LossScaler (functional engine), both built from the
same first scale and options. Overflowed updates are always dropped."""

from __future__ import annotations

from mindspore import nn
from mindspore.amp import LossScaleManager


class InStepUpdateCell(nn.Cell):
    """The update cell of such a scaler: it holds the first scale, as DynamicLossScaleUpdateCell does,
    and builds the scaler's state Parameters with the subclass's _init_state(**options)."""

    def __init__(self, loss_scale_value, **options):
        super().__init__()
        self.loss_scale_value = loss_scale_value
        self._init_state(**options)

    def get_loss_scale(self):
        return self.loss_scale_value


class InStepLossScaleManager(LossScaleManager):
    """A subclass names its UPDATE_CELL and LOSS_SCALER, each taking (first scale, **options), and takes
    the keys as its reference names them in its own __init__."""

    UPDATE_CELL = None
    LOSS_SCALER = None

    def __init__(self, loss_scale: float, **options):
        self.first_scale = loss_scale
        self.options = options

    def get_loss_scale(self):
        return self.first_scale

    def get_drop_overflow_update(self):
        return True

    def update_loss_scale(self, overflow):
        raise NotImplementedError("the scale lives in the compiled step: use get_update_cell() or "
                                  "get_loss_scaler()")

    def get_update_cell(self):
        return self.UPDATE_CELL(self.first_scale, **self.options)

    def get_loss_scaler(self):
        return self.LOSS_SCALER(self.first_scale, **self.options)
