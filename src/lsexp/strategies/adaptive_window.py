"""loss_scale=adaptive_window: MindFormers' adaptive loss scaling (AdaptiveLossScaleUpdateCell in
mindformers/wrapper/adaptive_loss_scale.py), for MindSpore 2.10, which MindFormers 2.1.0 no longer
installs beside.

It is MindSpore's dynamic rule (back off on overflow, grow after `scale_window` clean steps, never
below 1) with a window that adapts: the windows run from `min_scale_window` to `max_scale_window`
(window_list below); every third growth moves to the next, longer window, and a third overflow with
no growth between them drops the window to 1, from which the next third growth climbs back to the
shortest. Every overflow skips the update. The state machine is written once as tensor arithmetic,
so it runs inside the compiled step:

- as an update cell (AdaptiveLossScaleUpdateCell, MindFormers' name and Parameter names), which the
  cell engine's train step calls where nn.TrainOneStepWithLossScaleCell calls
  DynamicLossScaleUpdateCell;
- as a mindspore.amp.LossScaler (AdaptiveWindowLossScaler), for the functional engine.
"""

from __future__ import annotations

import logging
from typing import List

import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore import dtype as mstype
from mindspore.amp import DynamicLossScaler
from mindspore.graph.api import jit_class

from lsexp.strategies.manager import InStepLossScaleManager, InStepUpdateCell

# MindFormers fixes both in AdaptiveLossScaleUpdateCell.__init__.
WINDOW_INTERVAL, WINDOW_FACTOR = 100, 2
# MindFormers' counters move modulo 4, and 3 of a kind moves the window.
COUNT_MODULUS, MOVES = 4, 3


def window_list(max_scale_window: int, min_scale_window: int) -> List[int]:
    """The windows MindFormers' _get_window_list builds, shortest first: halving from max_scale_window
    in whole hundreds down to 100, then 50, then steps of min_scale_window / 2 until min_scale_window
    or below. With the defaults (1000, 20): [20, 30, 40, 50, 100, 200, 500, 1000]."""
    windows, window = [int(max_scale_window)], max_scale_window
    while window > min_scale_window:
        if window > WINDOW_INTERVAL:
            window = int(window / WINDOW_FACTOR / WINDOW_INTERVAL) * WINDOW_INTERVAL
        elif window == WINDOW_INTERVAL:
            window = window / WINDOW_FACTOR
        else:
            window = window - min_scale_window / WINDOW_FACTOR
        windows.append(int(window))
    return windows[::-1]


def start_index(windows: List[int], scale_window: int) -> int:
    """MindFormers starts at scale_window's place in the list, or at the shortest window (with a warning)
    when the list does not hold it."""
    if scale_window in windows:
        return windows.index(scale_window)
    logging.getLogger(__name__).warning(
        "loss_scale.scale_window=%s is not one of the windows %s, so the run starts at the shortest, %s, "
        "as MindFormers does", scale_window, windows, windows[0])
    return 0


def _int(value):
    return Tensor(value, mstype.int32)


class _AdaptiveWindowState:
    """The scaler's state as Parameters, named as MindFormers names them (so checkpoints carry it), and
    MindFormers' rule over them."""

    def _init_state(self, scale_factor, scale_window, max_scale_window, min_scale_window):
        windows = window_list(max_scale_window, min_scale_window)
        index = start_index(windows, scale_window)
        self.windows = Tensor(np.array(windows), mstype.int32)
        self.last_index = _int(len(windows) - 1)
        self.factor = Tensor(scale_factor, mstype.float32)
        # MindFormers multiplies by P.Reciprocal(scale_factor) on overflow, not a division
        self.inverse = Tensor(np.float32(1) / np.float32(scale_factor), mstype.float32)
        self.min_scale = Tensor(1.0, mstype.float32)
        self.zero, self.step, self.no_index = _int(0), _int(1), _int(-1)
        self.modulus, self.moves = _int(COUNT_MODULUS), _int(MOVES)

        def state(value, name):
            return Parameter(_int(value), name=name, requires_grad=False)

        self.scale_window = state(windows[index], "scale_window")
        self.list_index = state(index, "list_index")
        self.window_up_count = state(0, "scale_window_up_count")
        self.window_down_count = state(0, "scale_window_down_count")
        self.cur_iter = state(1, "current_iterator_step")
        self.last_overflow_iter = state(0, "last_overflow_iterator_step")

    def _next_scale(self, scale, overflow):
        """Returns the next scale and assigns the window state, as MindFormers' construct does. Most steps
        neither overflow nor grow, and only count the step: the rest of the rule runs when one does."""
        should_inc = self.scale_window <= self.cur_iter - self.last_overflow_iter
        new_scale = scale
        if ops.logical_or(overflow, should_inc):
            new_scale = self._move(scale, overflow, should_inc)
        return ops.depend(new_scale, ops.assign_add(self.cur_iter, self.step))

    def _move(self, scale, overflow, should_inc):
        """A step that overflowed or ends a clean window: the scale, and MindFormers' window rule."""
        window, index = self.scale_window, self.list_index
        up, down = self.window_up_count, self.window_down_count
        scale_on_overflow = ops.select(overflow, ops.maximum(scale * self.inverse, self.min_scale), scale)
        grow = ops.logical_and(should_inc, ops.logical_not(overflow))
        new_scale = ops.select(grow, scale_on_overflow * self.factor, scale_on_overflow)
        # every third growth: the next longer window, unless this is the longest
        up = ops.select(grow, ops.floor_mod(up + self.step, self.modulus), up)
        down = ops.select(grow, self.zero, down)
        longer = ops.logical_and(up == self.moves, index != self.last_index)
        index = ops.select(longer, index + self.step, index)
        up = ops.select(longer, self.zero, up)
        place = ops.select(index == self.no_index, self.zero, index)  # from window 1: the shortest
        window = ops.select(longer, self.windows[place], window)
        # a third overflow with no growth between: window 1, unless at the shortest already
        down = ops.select(overflow, ops.floor_mod(down + self.step, self.modulus), down)
        drop = ops.logical_and(ops.logical_and(overflow, down == self.moves),
                               ops.logical_and(index != self.no_index, index != self.zero))
        window = ops.select(drop, self.step, window)
        index = ops.select(drop, self.no_index, index)
        down = ops.select(drop, self.zero, down)
        up = ops.select(drop, self.zero, up)
        new_scale = ops.depend(new_scale, ops.assign(self.last_overflow_iter, self.cur_iter))
        new_scale = ops.depend(new_scale, ops.assign(self.window_up_count, up))
        new_scale = ops.depend(new_scale, ops.assign(self.window_down_count, down))
        new_scale = ops.depend(new_scale, ops.assign(self.list_index, index))
        return ops.depend(new_scale, ops.assign(self.scale_window, window))


class AdaptiveLossScaleUpdateCell(_AdaptiveWindowState, InStepUpdateCell):
    """MindFormers' update cell: called with (scale Parameter, overflow), like
    DynamicLossScaleUpdateCell, and returns the overflow."""

    def __init__(self, loss_scale_value, scale_factor, scale_window, max_scale_window=1000,
                 min_scale_window=20):
        super().__init__(loss_scale_value, scale_factor=scale_factor, scale_window=scale_window,
                         max_scale_window=max_scale_window, min_scale_window=min_scale_window)

    def construct(self, loss_scale, overflow):
        return ops.depend(overflow, ops.assign(loss_scale, self._next_scale(loss_scale, overflow)))


@jit_class
class AdaptiveWindowLossScaler(_AdaptiveWindowState, DynamicLossScaler):
    """The functional API's counterpart: DynamicLossScaler's scale/unscale, MindFormers' adjust."""

    def __init__(self, scale_value, scale_factor, scale_window, max_scale_window=1000, min_scale_window=20):
        super().__init__(scale_value, scale_factor, scale_window)
        del self.counter  # DynamicLossScaler's window counter; the window state replaces it
        self._init_state(scale_factor, scale_window, max_scale_window, min_scale_window)

    def adjust(self, grads_finite):
        ops.assign(self.scale_value, self._next_scale(self.scale_value, ops.logical_not(grads_finite)))
        return True


class AdaptiveLossScaleManager(InStepLossScaleManager):
    """MindFormers' keys, as a mindspore.amp.LossScaleManager like DynamicLossScaleManager."""

    UPDATE_CELL, LOSS_SCALER = AdaptiveLossScaleUpdateCell, AdaptiveWindowLossScaler

    def __init__(self, loss_scale_value: float = 2.0**32, scale_factor: int = 2, scale_window: int = 20,
                 max_scale_window: int = 1000, min_scale_window: int = 20):
        super().__init__(loss_scale_value, scale_factor=scale_factor, scale_window=scale_window,
                         max_scale_window=max_scale_window, min_scale_window=min_scale_window)
