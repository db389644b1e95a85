"""loss_scale=adaptive_window: MindFormers' adaptive loss scaling (AdaptiveLossScaleUpdateCell in
mindformers/wrapper/adaptive_loss_scale.py), for MindSpore 2.10, which MindFormers 2.1.0 no longer
installs beside.

It is MindSpore's dynamic rule (back off on overflow, grow after `scale_window` clean steps, never
below 1) with a window that adapts: the windows run from `min_scale_window` to `max_scale_window`
(window_list below); every third growth moves to the next, longer window, and a third overflow with
no growth between them drops the window to 1, from which the next third growth climbs back to the
shortest. Every overflow skips the update. The state machine is written once, as tables built from
MindFormers' statements and tensor arithmetic over them, so it runs inside the compiled step:

- as an update cell (AdaptiveLossScaleUpdateCell, MindFormers' name), which the
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


# A step is one of three events for the window rule: neither, a growth (a clean window ended without an
# overflow), or an overflow.
NOTHING, GROWTH, OVERFLOW = 0, 1, 2


def _code(index: int, up: int, down: int) -> int:
    """(list_index, up count, down count) as one number: index -1 (window 1) to the last, counts 0 to 3."""
    return ((index + 1) * COUNT_MODULUS + up) * COUNT_MODULUS + down


def transitions(windows: List[int]):
    """MindFormers' window rule as tables, built by running its statements (construct's, in its order)
    for every state and event: next_code[code * 3 + event] and window_of[code]. The window is a function
    of list_index alone (1 at index -1), so (index, up, down) is the whole state besides the steps."""
    last = len(windows) - 1
    codes = (last + 2) * COUNT_MODULUS * COUNT_MODULUS
    next_code, window_of = np.zeros(codes * 3, np.int32), np.zeros(codes, np.int32)
    for index in range(-1, last + 1):
        for up in range(COUNT_MODULUS):
            for down in range(COUNT_MODULUS):
                code = _code(index, up, down)
                window_of[code] = 1 if index == -1 else windows[index]
                for event in (NOTHING, GROWTH, OVERFLOW):
                    i, u, d = index, up, down
                    if event == GROWTH:
                        u, d = (u + 1) % COUNT_MODULUS, 0
                    if u == MOVES and i != last:
                        i, u = i + 1, 0
                    if event == OVERFLOW:
                        d = (d + 1) % COUNT_MODULUS
                    if event == OVERFLOW and d == MOVES and i not in (-1, 0):
                        i, d, u = -1, 0, 0
                    next_code[code * 3 + event] = _code(i, u, d)
    return next_code, window_of


class _AdaptiveWindowState:
    """The scaler's state as Parameters (so checkpoints carry it): MindFormers' scale_window,
    current_iterator_step and last_overflow_iterator_step by their names, and its list_index and
    up/down counts as one code, which the rule's tables move. On a step bound by kernel launches, a
    table lookup is one kernel where the rule's comparisons and selects were one each."""

    def _init_state(self, scale_factor, scale_window, max_scale_window, min_scale_window):
        windows = window_list(max_scale_window, min_scale_window)
        index = start_index(windows, scale_window)
        next_code, window_of = transitions(windows)
        self.next_code, self.window_of = Tensor(next_code), Tensor(window_of)
        # the scale's multiplier and floor by event; MindFormers multiplies by P.Reciprocal(scale_factor)
        # on overflow, not a division, and never goes below 1 there
        inverse = np.float32(1) / np.float32(scale_factor)
        self.multiplier = Tensor(np.array([1, scale_factor, inverse], np.float32))
        self.floor = Tensor(np.array([0, 0, 1], np.float32))
        self.events, self.overflow_event, self.step = _int(3), _int(OVERFLOW), _int(1)

        def state(value, name):
            return Parameter(_int(value), name=name, requires_grad=False)

        self.scale_window = state(windows[index], "scale_window")
        self.window_code = state(_code(index, 0, 0), "window_code")
        self.cur_iter = state(1, "current_iterator_step")
        self.last_overflow_iter = state(0, "last_overflow_iterator_step")

    def _next_scale(self, scale, overflow):
        """Returns the next scale and assigns the window state, as MindFormers' construct does."""
        should_inc = self.scale_window <= self.cur_iter - self.last_overflow_iter
        event = ops.select(overflow, self.overflow_event, ops.cast(should_inc, mstype.int32))
        last = ops.select(event > 0, self.cur_iter, self.last_overflow_iter)
        # ops.gather, one kernel each, where indexing with a tensor adds a bounds and a sign check
        code = ops.gather(self.next_code, self.window_code * self.events + event, 0)
        new_scale = ops.maximum(scale * ops.gather(self.multiplier, event, 0),
                                ops.gather(self.floor, event, 0))
        new_scale = ops.depend(new_scale, ops.assign(self.last_overflow_iter, last))
        new_scale = ops.depend(new_scale, ops.assign_add(self.cur_iter, self.step))
        new_scale = ops.depend(new_scale, ops.assign(self.window_code, code))
        return ops.depend(new_scale, ops.assign(self.scale_window, ops.gather(self.window_of, code, 0)))


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
