"""Where the first inf or NaN of an overflowed step arose: the step replayed through the taps, with the
weights, batch and scale it had, and the first non-finite value named in execution order (every layer's
forward pass, then the backward pass from the last layer to the first), as fairseq's NanDetector does.

Clean steps pay nothing: the replay runs only after a step has reported an overflow, which the host
reads from the step's stats anyway."""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np

from lsexp.taps import STATS

_IN, _OUT, _GRAD, _GRAD_OUT = (STATS.index(k) for k in ("in_amax", "out_amax", "grad_amax", "grad_out_amax"))


def _nonfinite(v: float) -> bool:
    return math.isinf(v)  # a measured amax counts a NaN as inf; NaN is a value not measured


def _value(v: float) -> Optional[float]:
    return None if math.isnan(v) else float(v)


def first_nonfinite(names: List[str], table: np.ndarray) -> Optional[dict]:
    """{layer, pass, amax_in, amax_out} of the first non-finite value in execution order, from a
    (layers, STATS) table; None when every tapped value is finite. Forward: the first layer whose input
    or output is non-finite (amax in and out: of its input and output). Backward, from the last layer: the
    first whose incoming gradient (at its output) or outgoing one (at its input) is non-finite. A value
    not measured (an integer input's) is None."""
    for i, name in enumerate(names):
        if _nonfinite(table[i, _IN]) or _nonfinite(table[i, _OUT]):
            return {"layer": name, "pass": "forward", "amax_in": _value(table[i, _IN]),
                    "amax_out": _value(table[i, _OUT])}
    for i in reversed(range(len(names))):
        if _nonfinite(table[i, _GRAD]) or _nonfinite(table[i, _GRAD_OUT]):
            return {"layer": names[i], "pass": "backward", "amax_in": _value(table[i, _GRAD]),
                    "amax_out": _value(table[i, _GRAD_OUT])}
    return None


class Locator:
    """Replays an overflowed step through taps. With `taps` (the step's own network is tapped, for
    telemetry=layers or inject.layer) the replay runs on `loss_net` itself. Without, `tapped_copy()` builds,
    at the first overflow, a tapped copy of the loss network whose parameters take the step's values before
    each replay: a step that never overflows compiles nothing more than it would without the locator."""

    def __init__(self, loss_net, taps=None, kept=(), tapped_copy=None):
        self.loss_net, self.taps, self.tapped_copy = loss_net, taps, tapped_copy
        self.replay = None
        # (weight, its copy from before the step): a no-drop step's weights from before its applied update
        self.kept = {id(w): copy for w, copy in kept}

    def _build(self):
        import mindspore as ms
        from mindspore import nn, ops

        class _Replay(nn.Cell):
            def __init__(self, network, probes):
                super().__init__(auto_prefix=False)
                self.network = network
                self.probes = ms.ParameterTuple(probes)
                self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

            def construct(self, x, y, sens):
                loss = self.network(x, y)
                sens = ops.ones_like(loss) * ops.cast(sens, loss.dtype)
                return self.grad(self.network, self.probes)(x, y, sens)

        # by position, not name: a wrapper (the gradient probe's) may have prefixed the live names
        live = [p for p in self.loss_net.get_parameters() if "lsexp_" not in p.name]
        if self.taps is not None:
            net, taps = self.loss_net, self.taps
            # the step's own parameters: BatchNorm's moving statistics are put back after the replay's
            # forward, and a no-drop step's weights are swapped for the ones it started from
            self.sources = [(p, self.kept[id(p)]) for p in live if id(p) in self.kept]
            self.restore = [p for p in live if not p.requires_grad or id(p) in self.kept]
        else:
            made = self.tapped_copy()
            if made is None:  # a network without layers: nothing to locate in
                self.replay = False
                return
            net, taps = made
            copy = [p for p in net.get_parameters() if "lsexp_" not in p.name]
            if [p.shape for p in copy] != [p.shape for p in live]:
                raise RuntimeError("the locator's copy of the network differs from the step's")
            self.sources = [(c, self.kept.get(id(p), p)) for c, p in zip(copy, live)]
            # a precision recipe's delayed scales (lsexp.precision), by name: the replay quantises with
            # the scales the step had
            scales = [p for p in self.loss_net.get_parameters() if "lsexp_fp8." in p.name]
            for c in net.get_parameters():
                if c.name.startswith("lsexp_fp8."):
                    self.sources += [(c, p) for p in scales if p.name.endswith(c.name)][:1]
            self.restore = []
        self.taps = taps
        self.replay = _Replay(net, taps.probes(entry=True))
        self.replay.set_train()

    def locate(self, x, y, scale: float) -> Optional[dict]:
        import mindspore as ms

        if self.replay is None:
            self._build()
        if self.replay is False:
            return None
        saved = [(p, p.asnumpy().copy()) for p in self.restore]
        for target, source in self.sources:
            target.set_data(ms.Tensor(source.asnumpy()))
        try:
            grads = [g.asnumpy() for g in self.replay(x, y, ms.Tensor(scale, ms.float32))]
        finally:
            for p, value in saved:
                p.set_data(ms.Tensor(value))
        return first_nonfinite(self.taps.names, self.taps.table(grads, entry=True))
