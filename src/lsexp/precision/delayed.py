"""Transformer Engine's delayed scaling in MindSpore ops: a tensor's FP8 scale for the next step, from the
history of its amax (recipe.DelayedScaling with amax_compute_algo "max" or "most_recent"), computed inside
a compiled train step.

The rule is the one transcribed in tests/helpers/te_delayed_scaling.py from TE commit
d0067d0da6cb01811b8072a7d304f0e00344ce2b (the fused ``kernel_bulk`` of delayed_scaling.cu), which the tests
check these ops against bit for bit: record this step's amax into ``amax_history[0]``; if it is not zero,
roll the history by one (slot 0 zeroed, the amax in the last slot) and take the amax as the largest
non-NaN entry ("max") or this step's ("most_recent"); if it is zero, leave the history as it is (amax 0).
The new scale is ``(fp8_max * 2**-margin) / amax`` in float32 when that amax is finite and positive, else
the previous scale; an infinite quotient becomes float32's largest value.

Where MindSpore cannot follow TE: its CPU kernels read a subnormal float32 operand as zero, and flush a
subnormal result to zero, so a subnormal amax counts as zero here (TE uses it as is), and a scale that
would be subnormal (an amax near float32's largest, with a margin of 7 or more for E4M3) comes out 0; so
does a margin that makes fp8_max * 2**-margin subnormal (above 134 for E4M3). The sign of a
NaN is not visible to the ops: a NaN amax is recorded as TE records a positive one (an amax taken of
absolute values has no other).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

FLT_MAX = 3.4028234663852886e38  # float32's largest, exact as a float32 constant
ALGOS = ("max", "most_recent")


def scaled_max(fp8_max: float, margin: int) -> float:
    """TE's ``fp8_dtype_max * std::pow(2.f, -margin)``: exact in Python's double, so the same float32
    wherever it is a normal float32 (below that, MindSpore's CPU kernels read it as zero anyway). Plain
    Python, so that a compiled graph folds it into a constant."""
    return float(fp8_max) * 2.0 ** -int(margin)


def delayed_update(amax_history, scale, amax, fp8_max: float, margin: int, algo: str):
    """(history, scale) after one step whose tensor amax is `amax`, from float32 `amax_history` (length
    L, slot 0 zero between updates, as TE keeps it) and the `scale` that step used. Pure: usable
    eagerly or inside a compiled graph, where fp8_max, margin and algo are constants."""
    if algo not in ALGOS:
        raise ValueError("amax_compute_algo: use one of max, most_recent")
    s_max = scaled_max(fp8_max, margin)
    amax = ops.cast(amax, ms.float32).reshape(())
    length = amax_history.shape[0]
    zero = ops.zeros((), ms.float32)
    # atomicMaxFloat into a slot that holds 0 compares int32 bit patterns: a positive value or a
    # (positive) NaN replaces the 0; -0 and negative values leave it
    last = ops.where((amax > 0) | ops.isnan(amax), amax, zero)
    advance = last != 0  # NaN != 0 too: a NaN takes a history slot
    pieces = [zero.reshape((1,))]
    if length > 2:
        pieces.append(amax_history[2:])
    if length > 1:
        pieces.append(last.reshape((1,)))
    rolled = ops.concat(pieces) if len(pieces) > 1 else pieces[0]
    new_history = ops.where(advance, rolled, amax_history)

    if algo == "most_recent":
        chosen = last
    else:
        # kernel_bulk's fmaxf from 0 over old[1:] and last skips NaN; MindSpore's CPU max is not
        # documented to, so a NaN is made 0 first, which a maximum starting from 0 ignores anyway
        window = ops.concat((amax_history[1:], last.reshape((1,))))
        window = ops.where(ops.isnan(window), zero, window)
        chosen = ops.where(advance, ops.maximum(window.max(), zero), zero)

    usable = ops.isfinite(chosen) & (chosen > 0)
    # TE divides once, correctly rounded (delayed_scaling.cu is not built with fast math). MindSpore's
    # tensor / tensor is that division; a Python float / tensor is not (measured: 448 / 3 came out one
    # ulp high, as 448 * (1/3)), so the numerator is made a tensor.
    numerator = ops.full_like(chosen, s_max)
    new_scale = ops.where(usable, numerator / ops.where(usable, chosen, ops.ones_like(chosen)), scale)
    new_scale = ops.where(ops.isinf(new_scale), ops.full_like(new_scale, FLT_MAX), new_scale)
    return new_history, new_scale


class DelayedScaling(nn.Cell):
    """One tensor's delayed-scaling state, as Parameters saved with the network: ``amax_history``
    (float32, (amax_history_len,), zeros) and ``scale`` (float32 scalar, 1), named
    ``lsexp_fp8.<name>.amax_history`` and ``lsexp_fp8.<name>.scale``. A parent cell that holds this one
    renames them by attribute path (MindSpore's auto_prefix); whoever needs these names sets them back.

    The step quantises with ``scale`` as it is, then calls ``update(amax)`` with that tensor's amax.
    ``update`` returns the new scale with the Parameters' assigns made its dependencies; inside a compiled
    graph the caller must make something the step returns depend on that value (``ops.depend(out,
    ds.update(a))``), or the assigns may be pruned. To use the old scale in the same step, read it first
    and make the update depend on the read (``s = ds.scale * 1.0; after = ds.update(ops.depend(a, s))``),
    so the read is ordered before the assign."""

    def __init__(self, name: str, fp8_max: float, margin: int, amax_history_len: int,
                 amax_compute_algo: str, in_backward: bool = False):
        super().__init__()
        if amax_compute_algo not in ALGOS:
            raise ValueError(f"amax_compute_algo={amax_compute_algo}: use one of max, most_recent")
        if int(amax_history_len) < 1:
            raise ValueError(f"amax_history_len={amax_history_len}: must be at least 1")
        self.fp8_max = float(np.float32(fp8_max))  # TE holds it as a float32
        self.margin = int(margin)
        self.amax_compute_algo = amax_compute_algo
        self.amax_history = Parameter(Tensor(np.zeros(int(amax_history_len), np.float32)),
                                      name=f"lsexp_fp8.{name}.amax_history", requires_grad=False)
        self.scale = Parameter(Tensor(np.float32(1.0)), name=f"lsexp_fp8.{name}.scale", requires_grad=False)
        # a gradient's amax is recorded in a bprop, which may read a Parameter from before the step's own
        # writes (lsexp.taps.cells): it is written alone, read by the next step's advance
        self.in_backward = in_backward
        if in_backward:
            self.pending = Parameter(Tensor(np.float32(0.0)), name=f"lsexp_fp8.{name}.pending",
                                     requires_grad=False)

    def update(self, amax):
        """Record this step's amax and write the next step's history and scale; returns the new scale,
        which the caller must depend on (see the class docstring)."""
        history, scale = delayed_update(self.amax_history, self.scale, amax, self.fp8_max, self.margin,
                                        self.amax_compute_algo)
        done = ops.assign(self.amax_history, history)
        done = ops.depend(ops.assign(self.scale, scale), done)
        return ops.depend(scale, done)

    def record(self, amax):
        """What a pass that quantises the tensor does: TE's atomicMaxFloat of its amax into slot 0, so
        that a forward pass the step runs twice (a loss, then its gradient) records it once. Returns a
        value the caller must depend on."""
        amax = ops.cast(amax, ms.float32).reshape(())
        zero = ops.zeros((), ms.float32)
        # one read of the whole history, ordered after this step's advance(): in graph mode a slice of the
        # Parameter itself (self.amax_history[1:]) reads it as it was when the step began (MindSpore 2.10),
        # and writing that back would undo advance()'s roll, leaving one amax in the window
        history = self.amax_history.value()
        slot = history[0]
        taken = ops.where(ops.isnan(amax) | ops.isnan(slot), amax + slot, ops.maximum(amax, slot))
        slot = ops.where((amax > 0) | ops.isnan(amax), taken, slot)
        kept = history[1:] if history.shape[0] > 1 else None
        history = slot.reshape((1,)) if kept is None else ops.concat((slot.reshape((1,)), kept))
        return ops.depend(zero, ops.assign(self.amax_history, history))

    def note(self, amax):
        """record() for a gradient, from its bprop: the step's one backward pass writes its amax. Only a
        finite one: a gradient that overflowed is the loss scale's to skip, and an inf in the history
        would hold the scale for amax_history_len steps under max (TE, without a loss scale, records
        it). Returns a value the caller must depend on."""
        amax = ops.cast(amax, ms.float32).reshape(())
        kept = ops.where((amax > 0) & ops.isfinite(amax), amax, ops.zeros((), ms.float32))
        return ops.depend(ops.zeros((), ms.float32), ops.assign(self.pending, kept))

    def recorded(self):
        """What the last step recorded, for advance."""
        return self.pending * 1.0 if self.in_backward else self.amax_history[0]

    def advance(self, recorded=None):
        """TE's amax_and_scale_update from what the last step recorded in slot 0 (or `recorded`, that
        amax reduced over the ranks): the train step runs it before its forward pass, once, so that the
        step quantises with the scale it leaves. Returns a value the caller must depend on."""
        return self.update(self.recorded() if recorded is None else recorded)

    def construct(self, amax):
        return self.update(amax)
