"""The reference loss_scale=adaptive_window is checked against: MindFormers' AdaptiveLossScaleUpdateCell,
transcribed statement for statement in numpy from mindformers/wrapper/adaptive_loss_scale.py as the
mindformers 2.1.0 wheel on PyPI ships it (sha256
c6132eb8ec8341e69703250059d8168d82fb7113b5d9f518a5d7417191d87770,
identical to mindspore-lab/mindformers at commit 10564834f16d0cb7a6637af764ba06e91d04afd3). mindformers
2.1.0 requires mindspore~=2.11.0, so it cannot be installed beside lsexp's MindSpore 2.10.

Each F.assign in `construct` is one assignment here, in the same order: in graph mode a Parameter read
after an assign sees the assigned value, so later statements read the updated counters, as below. The
scale is float32 and multiplied by float32(1 / scale_factor) on overflow, as P.Reciprocal computes it.
"""

from typing import List, Sequence, Tuple

import numpy as np

WINDOW_INTERVAL, WINDOW_FACTOR = 100, 2  # fixed in AdaptiveLossScaleUpdateCell.__init__


def get_window_list(max_scale_window, min_scale_window, window_interval=WINDOW_INTERVAL,
                    window_factor=WINDOW_FACTOR) -> List[int]:
    """_get_window_list, its Python list."""
    window_list = [int(max_scale_window)]
    while max_scale_window > min_scale_window:
        if max_scale_window > window_interval:
            max_scale_window = int(max_scale_window / window_factor / window_interval) * window_interval
        elif max_scale_window == window_interval:
            max_scale_window = max_scale_window / window_factor
        else:
            max_scale_window = max_scale_window - min_scale_window / window_factor
        window_list.append(int(max_scale_window))
    window_list.reverse()
    return window_list


def get_list_index(window_list: Sequence[int], scale_window) -> int:
    """_get_list_index: a scale_window not in the list starts at index 0 (with a warning there)."""
    return window_list.index(scale_window) if scale_window in window_list else 0


class AdaptiveLossScaleUpdateCell:
    def __init__(self, loss_scale_value, scale_factor, scale_window, max_scale_window=1000,
                 min_scale_window=20):
        if max_scale_window <= 0 or min_scale_window <= 0 or max_scale_window <= min_scale_window:
            raise ValueError("max_scale_window must exceed min_scale_window, both > 0")
        self.window_list = get_window_list(max_scale_window, min_scale_window)
        self.window_list_len = len(self.window_list) - 1
        self.list_index = get_list_index(self.window_list, scale_window)
        self.scale_window = int(self.window_list[self.list_index])
        self.window_up_count = 0
        self.window_down_count = 0
        self.scale_factor = np.float32(scale_factor)
        self.loss_scale_value = loss_scale_value
        self.cur_iter = 1
        self.last_overflow_iter = 0

    def construct(self, loss_scale: np.float32, overflow: bool) -> np.float32:
        """Returns the assigned loss_scale."""
        reciprocal = np.float32(1) / self.scale_factor
        loss_scale_on_overflow = max(loss_scale * reciprocal, np.float32(1.0)) if overflow else loss_scale
        should_inc = self.scale_window <= self.cur_iter - self.last_overflow_iter
        if overflow or should_inc:
            self.last_overflow_iter = self.cur_iter
        update_scale_cond = should_inc and not overflow
        scaled_loss_scale = loss_scale_on_overflow * self.scale_factor
        loss_scale = scaled_loss_scale if update_scale_cond else loss_scale_on_overflow
        self.cur_iter += 1
        if update_scale_cond:
            self.window_up_count = (self.window_up_count + 1) % 4
            self.window_down_count = 0
        window_up_cond = self.window_up_count == 3 and self.list_index != self.window_list_len
        if window_up_cond:
            self.list_index += 1
            self.window_up_count = 0
        cur_list_index = 0 if self.list_index == -1 else self.list_index
        if window_up_cond:
            self.scale_window = self.window_list[cur_list_index]
        if overflow:
            self.window_down_count = (self.window_down_count + 1) % 4
        window_down = overflow and self.window_down_count == 3
        down_check = self.list_index != -1 and self.list_index != 0
        if window_down and down_check:
            self.scale_window = 1
            self.list_index = -1
            self.window_down_count = 0
            self.window_up_count = 0
        return np.float32(loss_scale)

    def state(self) -> Tuple[int, int, int, int, int, int]:
        return (self.scale_window, self.list_index, self.window_up_count, self.window_down_count,
                self.cur_iter,
                self.last_overflow_iter)


def scale_and_window_columns(flags: Sequence[int], *, loss_scale_value, scale_factor, scale_window,
                             max_scale_window, min_scale_window) -> Tuple[List[float], List[int]]:
    """The scale each step uses and the window in force at that step, for these overflow flags."""
    cell = AdaptiveLossScaleUpdateCell(loss_scale_value, scale_factor, scale_window, max_scale_window,
                                       min_scale_window)
    scale, scales, windows = np.float32(loss_scale_value), [], []
    for flag in flags:
        scales.append(float(scale))
        windows.append(int(cell.scale_window))
        scale = cell.construct(scale, bool(flag))
    return scales, windows
