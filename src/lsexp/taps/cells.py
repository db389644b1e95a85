"""The tap cells: a layer wrapped so that, inside the compiled step, one cell sees its forward output
and the gradient flowing back into it.

Both are seen by a cell with a custom `bprop` after the layer (`_Exit`). Its forward applies the
transform's `forward` to the output; its `bprop` applies `backward` to the gradient and returns, as the
gradient of a zero "probe" Parameter it takes as a second input, a vector of statistics (lsexp.taps.STATS).
A train step that takes the gradient with respect to the probes too gets the statistics out of the
backward pass with the gradients, at no host sync of their own; one that does not leaves the statistics
unused, and the graph compiler drops them. A second such cell before the layer (`_Entry`) measures the
gradient the layer passes back to its input.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype

from lsexp.formats.cast import amax
from lsexp.formats.spec import FP16_MAX, FP16_TINY
from lsexp.taps import ENTRY_STATS, EXIT_STATS, RECORD, STATS

_FLOATS = (mstype.float16, mstype.float32, mstype.bfloat16, mstype.float64)


class Transform(nn.Cell):
    """What a tap does to the values that pass it; the identity unless a subclass says otherwise. Both
    methods run inside the compiled step, in graph mode: write them in MindSpore ops.

    forward(y): the layer's output, as the rest of the network receives it.
    backward(dout, state): the gradient flowing into that output, as the layer's own backward receives it.
    state(): a tensor read in the forward pass and handed to backward. A Parameter the step sets must be
    read here: a bprop reads a Parameter out of the step's order of side effects, so it may see the value
    it had before the step set it.
    replay(y, state): forward(y) again, from the state the forward pass read; status() runs it.
    status(y, dout, state): a float32 scalar the tap hands the step as its status probe's gradient (an
    emulated status register: how many values the transform changed, going forward and coming back);
    y and dout as they reached the tap, before the transform.
    backward_status(y, dout, state): (backward(dout, state), status(y, dout, state)), which the tap's
    exit asks for at once, so that a transform can answer both in one kernel.
    """

    def forward(self, y):
        return y

    def backward(self, dout, state):
        return dout

    def state(self):
        return ops.zeros((), mstype.float32)

    def replay(self, y, state):
        return self.forward(y)

    def status(self, y, dout, state):
        return ops.zeros((), mstype.float32)

    def backward_status(self, y, dout, state):
        return self.backward(dout, state), self.status(y, dout, state)


class LinkedTransform(Transform):
    """A transform whose backward needs what a layer-wise rule needs and a chain of layers can hand it: the
    layer's weight, and the scale the incoming gradient already carries (the product of the scales of the
    layers after it, threaded back from tap to tap by lsexp.taps.chain.LinkedChain). Its tap records
    lsexp.taps.RECORD per step (the record probe's gradient).

    backward_linked(dout, state, weight, carried): (the gradient the layer's own backward receives, the
    scale that gradient carries, the record). carried is 0 at the last layer of the chain: nothing after
    it scaled the gradient, which carries the step's global scale alone (start_scale()).
    weight_of(layer): the Parameter backward_linked reads."""

    def backward_linked(self, dout, state, weight, carried):
        raise NotImplementedError

    def weight_of(self, layer):
        return layer.weight


class Chain(Transform):
    """Several transforms, applied in order going forward and in reverse order coming back."""

    def __init__(self, transforms: Sequence[Transform]):
        super().__init__()
        self.transforms = nn.CellList(list(transforms))
        self.count = len(transforms)

    def forward(self, y):
        for t in self.transforms:
            y = t.forward(y)
        return y

    def backward(self, dout, state):
        for i in range(self.count - 1, -1, -1):
            dout = self.transforms[i].backward(dout, state[i])
        return dout

    def state(self):
        states = ()
        for t in self.transforms:
            states = states + (t.state(),)
        return states

    def replay(self, y, state):
        for i in range(self.count):
            y = self.transforms[i].replay(y, state[i])
        return y

    def status(self, y, dout, state):
        # each transform's, on the values as they reach it: going forward in order, coming back in reverse
        ys = ()
        for i in range(self.count):
            ys = ys + (y,)
            y = self.transforms[i].replay(y, state[i])
        total = ops.zeros((), mstype.float32)
        for i in range(self.count - 1, -1, -1):
            total = total + self.transforms[i].status(ys[i], dout, state[i])
            dout = self.transforms[i].backward(dout, state[i])
        return total


# A value's magnitude as the unsigned integer of its bits is ordered as the magnitude is, with inf above
# every finite value and NaN above inf: one integer pass answers amax (NaN as inf) and every count.
_BITS = {np.dtype(np.float16): (np.uint16, 0x7FFF, 0x7C00, 0x0001, 0x7BFF),
         np.dtype(np.float32): (np.uint32, 0x7FFFFFFF, 0x7F800000, 0x33800000, 0x477FE000)}


def _magnitude_bits(a: np.ndarray):
    unsigned, mask, inf, tiny, top = _BITS[a.dtype]
    return a.view(unsigned) & unsigned(mask), unsigned, inf, tiny, top


def _amax_np(a: np.ndarray) -> np.float32:
    bits, unsigned, inf, _, _ = _magnitude_bits(a)
    top = bits.max() if bits.size else unsigned(0)
    return np.float32(np.inf) if top >= inf else np.float32(np.array(top, unsigned).view(a.dtype))


def exit_stats_host(out: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """EXIT_STATS of a layer's output and the gradient flowing into it, counted on the host: the body of
    the CPU step's one kernel per tap (a MindSpore pyfunc), which on CPU costs less than the eleven
    MindSpore kernels of the same statistics (exit_stats). Quotients round once, in float32."""
    bits, _, inf, tiny, top = _magnitude_bits(dout)
    size = np.float32(bits.size)
    zero = bits.size - np.count_nonzero(bits)
    below = np.count_nonzero(bits < tiny)  # the zeros too
    over = np.count_nonzero(bits > top)  # inf and NaN
    return np.array([_amax_np(out), _amax_np(dout), np.float32(below - zero) / size, np.float32(zero) / size,
                     np.float32(over) / size], np.float32)


def exit_stats(out, dout, tiny, fp16_max):
    """EXIT_STATS in MindSpore ops, for targets where a pyfunc kernel cannot run; one magnitude, NaN as
    inf, for every statistic."""
    m = ops.nan_to_num(ops.abs(ops.cast(dout, mstype.float32)), nan=float("inf"), posinf=float("inf"))
    size = m.size  # counts are exact in float32 below 2^24; each quotient rounds once, as numpy's
    zero = size - ops.cast(ops.count_nonzero(m), mstype.float32)
    below = ops.cast(m < tiny, mstype.float32).sum()  # the zeros too
    return ops.stack([
        amax(out),
        m.max(),
        (below - zero) / size,
        zero / size,
        ops.cast(m > fp16_max, mstype.float32).sum() / size,  # inf and NaN
    ])


def _zeros_like(state):
    """The state's gradient: a Chain's state is a tuple of its transforms' states."""
    if isinstance(state, tuple):
        out = ()
        for s in state:
            out = out + (ops.zeros_like(s),)
        return out
    return ops.zeros_like(state)


def _host_counts(device_target: str) -> bool:
    return device_target == "CPU"


class _Exit(nn.Cell):
    def __init__(self, transform: Transform, host_counts: bool, observe: bool = True):
        super().__init__()
        self.transform = transform
        self.observe = observe
        self.unobserved = Tensor(np.zeros(len(EXIT_STATS), np.float32))
        self.tiny = Tensor(FP16_TINY, mstype.float32)
        self.fp16_max = Tensor(FP16_MAX, mstype.float32)
        self.host_counts = host_counts
        if host_counts:
            self.counts = ops.Custom(exit_stats_host, out_shape=lambda out, dout: (len(EXIT_STATS),),
                                     out_dtype=lambda out, dout: mstype.float32, func_type="pyfunc")

    def construct(self, y, state, probe, status_probe):
        return self.transform.forward(y)

    def _stats(self, out, dout):
        if self.host_counts:
            # the host's kernel reads float16 and float32 bits; another float type is widened first
            if out.dtype not in (mstype.float16, mstype.float32):
                out = ops.cast(out, mstype.float32)
            if dout.dtype not in (mstype.float16, mstype.float32):
                dout = ops.cast(dout, mstype.float32)
            return self.counts(out, dout)
        return exit_stats(out, dout, self.tiny, self.fp16_max)

    def bprop(self, y, state, probe, status_probe, out, dout):
        dout, status = self.transform.backward_status(y, dout, state)
        # as the output's own type: PyNative checks it, graph mode casts to it anyway
        stats = self._stats(out, dout) if self.observe else self.unobserved
        return ops.cast(dout, y.dtype), _zeros_like(state), stats, status


class _LinkedExit(_Exit):
    """_Exit for a LinkedTransform: it passes the chain's link on (a zero scalar going forward, the scale
    the gradient carries coming back) and hands the transform the layer's weight."""

    def construct(self, y, state, probe, status_probe, record_probe, link, weight):  # noqa: PLR0913
        return self.transform.forward(y), link

    def bprop(self, y, state, probe, status_probe, record_probe, link, weight, out, dout):  # noqa: PLR0913
        dy, carried = dout
        dy, carried_out, record = self.transform.backward_linked(dy, state, weight, carried)
        stats = self._stats(out[0], dy) if self.observe else self.unobserved
        return (ops.cast(dy, y.dtype), _zeros_like(state), stats, ops.zeros((), mstype.float32), record,
                carried_out, ops.zeros_like(weight))


class _Entry(nn.Cell):
    """Before the layer: ENTRY_STATS and a 1, which tells a measured entry from the zero gradient of one
    never called (an integer input). Only the locator's replay asks for them."""

    def construct(self, x, probe):
        return x

    def bprop(self, x, probe, out, dout):
        # concat, not stack: the graph compiler loses a Stack made here when the layer has a bprop of its
        # own (the unit-scaled MLP's UnitDense), "the func graph is empty"
        return ops.cast(dout, x.dtype), ops.concat([amax(x).reshape(1), amax(dout).reshape(1),
                                                    ops.ones((1,), mstype.float32)])


class Tap(nn.Cell):
    """`layer`, called as it was, between an _Entry and an _Exit. Its Parameters keep their names."""

    def __init__(self, layer: nn.Cell, name: str, transform: Optional[Transform] = None,
                 host_counts: Optional[bool] = None, observe: bool = True):
        super().__init__(auto_prefix=False)
        self.layer = layer
        if host_counts is None:
            host_counts = _host_counts(ms.get_context("device_target"))
        # observe=False: a tap that only transforms, whose statistics nothing reads, counts none
        self.observe = observe
        transform = transform if transform is not None else Transform()
        self.is_linked = isinstance(transform, LinkedTransform)
        self.exit = (_LinkedExit if self.is_linked else _Exit)(transform, host_counts, observe)
        if self.is_linked:
            self.lsexp_record = Parameter(Tensor(np.zeros(len(RECORD), np.float32)),
                                          name=f"lsexp_tap.{name}.record", requires_grad=False)
        self.entry = _Entry()
        self.tap_name = name
        self.lsexp_probe_out = Parameter(Tensor(np.zeros(len(EXIT_STATS), np.float32)),
                                         name=f"lsexp_tap.{name}.out", requires_grad=False)
        self.lsexp_probe_in = Parameter(Tensor(np.zeros(len(ENTRY_STATS) + 1, np.float32)),
                                        name=f"lsexp_tap.{name}.in", requires_grad=False)
        self.lsexp_status = Parameter(Tensor(np.float32(0.0)), name=f"lsexp_tap.{name}.status",
                                      requires_grad=False)

    def construct(self, x, *args, **kwargs):
        # decided when the graph compiles; an integer input has no gradient
        if self.observe and x.dtype in _FLOATS:
            x = self.entry(x, self.lsexp_probe_in)
        y = self.layer(x, *args, **kwargs)
        return self.exit(y, ops.stop_gradient(self.exit.transform.state()), self.lsexp_probe_out,
                         self.lsexp_status)

    def linked(self, x, link):
        """(the layer's output, the link): a LinkedTransform's tap, as lsexp.taps.chain.LinkedChain calls
        it."""
        if self.observe and x.dtype in _FLOATS:
            x = self.entry(x, self.lsexp_probe_in)
        y = self.layer(x)
        weight = ops.stop_gradient(self.exit.transform.weight_of(self.layer))
        return self.exit(y, ops.stop_gradient(self.exit.transform.state()), self.lsexp_probe_out,
                         self.lsexp_status, self.lsexp_record, link, weight)


_EXIT_AT = [STATS.index(k) for k in EXIT_STATS]
_ENTRY_AT = [STATS.index(k) for k in ENTRY_STATS]


class Taps:
    """The taps installed in one network: their names in execution order and their probes."""

    def __init__(self, taps: List[Tap]):
        self.taps = taps
        self.names = [t.tap_name for t in taps]

    def probes(self, entry: bool = True) -> list:
        """The probes whose gradients carry the statistics: the exits' (EXIT_STATS), then with entry the
        entries' (ENTRY_STATS and a 1)."""
        out = [t.lsexp_probe_out for t in self.taps]
        return out + [t.lsexp_probe_in for t in self.taps] if entry else out

    def record_probes(self) -> list:
        """The probes whose gradients carry each LinkedTransform's RECORD, in the taps' order."""
        return [t.lsexp_record for t in self.taps if t.is_linked]

    def status_probes(self) -> list:
        """The probes whose gradients carry each transform's status() (device.overflow_mode=saturation)."""
        return [t.lsexp_status for t in self.taps]

    def table(self, grads, entry: bool = True) -> np.ndarray:
        """The statistics as a (layers, STATS) array, from the probes' gradients in probes()'s order. A
        statistic not measured is NaN: ENTRY_STATS without entry, or where the layer's input was integer.
        A measured amax is never NaN (a NaN counts as inf)."""
        n = len(self.taps)
        out = np.full((n, len(STATS)), np.nan)
        out[:, _EXIT_AT] = np.stack([np.asarray(g, dtype=np.float64).reshape(-1) for g in grads[:n]])
        if entry:
            for i, g in enumerate(grads[n:2 * n]):
                *values, measured = np.asarray(g, dtype=np.float64).reshape(-1)
                if measured == 1:
                    out[i, _ENTRY_AT] = values
        return out


def install(net: nn.Cell, names: Sequence[str], layers: dict,
            transform_for: Callable[[str], Optional[Transform]] = lambda name: None,
            host_counts: Optional[bool] = None, observe: bool = True) -> Taps:
    """Wrap each named layer of `net` in a Tap, in place. `layers`: name -> the layer cell, as found in
    the model before amp wrapped or rewrote it; each is looked up in `net` by identity, else by name.
    host_counts: the exits count on the host (a pyfunc kernel) or in MindSpore ops; None: on the host
    where the device target is CPU. observe=False: the taps only transform; they measure nothing."""
    parents = {}
    for path, cell in net.cells_and_names():
        for attr, child in cell.name_cells().items():
            parents[id(child)] = (cell, attr)
            parents.setdefault(("path", f"{path}.{attr}" if path else attr), (cell, attr))
    taps = []
    for name in names:
        layer = layers[name]
        where = parents.get(id(layer))
        if where is None:  # amp O1 rewrites the network: the layer at the same path, under a wrapper
            where = next((v for k, v in parents.items() if isinstance(k, tuple)
                          and (k[1] == name or k[1].endswith("." + name))), None)
            if where is None:
                raise KeyError(name)
            layer = where[0].name_cells()[where[1]]
        parent, attr = where
        kept = [(p, p.name) for p in layer.get_parameters()]
        tap = Tap(layer, name, transform_for(name), host_counts, observe)
        if isinstance(parent, (nn.SequentialCell, nn.CellList)):
            parent[int(attr)] = tap
        else:
            setattr(parent, attr, tap)
        for p, pname in kept:  # the wrapper would put its own attribute names into theirs
            p.name = pname
        # and the parent its path into the probes'
        tap.lsexp_probe_out.name, tap.lsexp_probe_in.name = f"lsexp_tap.{name}.out", f"lsexp_tap.{name}.in"
        tap.lsexp_status.name = f"lsexp_tap.{name}.status"
        if tap.is_linked:
            tap.lsexp_record.name = f"lsexp_tap.{name}.record"
        taps.append(tap)
    return Taps(taps)


class LayerInjection(Transform):
    """inject.layer: the layer's output (forward) or the gradient flowing into it (backward) times
    `factor`, a Parameter the train step sets, before its forward pass, to inf at inject.overflow_steps
    and to 1 at every other step. A replay of the step reads the same factor."""

    def __init__(self, backward: bool):
        super().__init__()
        self.on_backward = backward
        self.factor = Parameter(Tensor(1.0, mstype.float32), name="lsexp_inject_factor", requires_grad=False)

    def forward(self, y):
        if self.on_backward:
            return y
        return y * ops.cast(self.factor, y.dtype)

    def backward(self, dout, state):
        if self.on_backward:
            return dout * ops.cast(state, dout.dtype)
        return dout

    def state(self):
        return self.factor * 1  # read in the forward pass, in the step's order

    def replay(self, y, state):
        if self.on_backward:
            return y
        return y * ops.cast(state, y.dtype)
