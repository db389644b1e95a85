"""The reference loss_scale=dynamic_hysteresis is checked against: DeepSpeed's dynamic loss scaler
(DynamicLossScaler.update_scale in deepspeed/runtime/fp16/loss_scaler.py), transcribed rule for rule
in plain Python, with raise_error_at_min_scale=False, as read at deepspeedai/DeepSpeed commits
18fd4c973de35381257542d2c99177a82a4b525a and 68ee9f83ae9a278ac09e02b3697094673c9896cd (the same
update_scale in both). The one addition is Apex's cap (max_scale), applied where the scale grows;
max_scale=None is DeepSpeed exactly.

Today's DeepSpeed grows when `stable_interval = cur_iter - last_overflow_iter - 1` is positive and a
multiple of scale_window: after scale_window + 1 clean steps, from the start and after an overflow,
then every scale_window. Older releases grew on `(cur_iter - last_overflow_iter) % scale_window == 0`,
one step earlier, which is Megatron's rule (helpers/megatron_grad_scaler.py); docs/strategies.md says
which releases have which.
"""

from typing import List, Optional, Sequence


class DeepSpeedDynamicLossScaler:
    def __init__(self, init_scale: float, scale_factor: float, scale_window: int, min_scale: float,
                 delayed_shift: int, consecutive_hysteresis: bool, max_scale: Optional[float] = None):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.max_scale = max_scale

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
                if self.max_scale is not None:
                    self.cur_scale = min(self.cur_scale, self.max_scale)
        self.cur_iter += 1


def scale_column(flags: Sequence[int], *, init_loss_scale, hysteresis, consecutive_hysteresis, min_loss_scale,
                 max_loss_scale, scale_factor, scale_window) -> List[float]:
    """The scale each step uses, for these overflow flags, under lsexp's key names."""
    scaler = DeepSpeedDynamicLossScaler(init_loss_scale, scale_factor, scale_window, min_loss_scale,
                                        hysteresis, consecutive_hysteresis, max_loss_scale)
    column = []
    for flag in flags:
        column.append(float(scaler.cur_scale))
        scaler.update_scale(bool(flag))
    return column
