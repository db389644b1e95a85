"""The reference loss_scale=megatron is checked against: Megatron-LM's DynamicGradScaler.update
(megatron/core/optimizer/grad_scaler.py, read at NVIDIA/Megatron-LM commit
00caa53af30912914981c86f39db123961678bbd), transcribed rule for rule, with the scale a float32 as
Megatron keeps it (a float32 CUDA tensor, multiplied by float32 factors).

It grows on the growth_interval-th clean step in a row and refills the hysteresis tracker only then;
each overflow zeroes the growth tracker and takes one from the hysteresis tracker, and once that is
used up every overflow backs off. No cap.
"""

from typing import List, Sequence

import numpy as np


class DynamicGradScaler:
    def __init__(self, initial_scale: float, min_scale: float, growth_factor: float, backoff_factor: float,
                 growth_interval: int, hysteresis: int):
        self._scale = np.float32(initial_scale)
        self.min_scale = np.float32(min_scale)
        self.growth_factor = np.float32(growth_factor)
        self.backoff_factor = np.float32(backoff_factor)
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self._growth_tracker = 0
        self._hysteresis_tracker = self.hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor


def scale_column(flags: Sequence[int], *, initial_scale, min_scale, growth_factor, backoff_factor,
                 growth_interval, hysteresis) -> List[float]:
    """The scale each step uses, for these overflow flags, under Megatron's key names (lsexp's too)."""
    scaler = DynamicGradScaler(initial_scale, min_scale, growth_factor, backoff_factor, growth_interval,
                               hysteresis)
    column = []
    for flag in flags:
        column.append(float(scaler._scale))
        scaler.update(bool(flag))
    return column
