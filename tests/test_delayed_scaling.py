"""lsexp's delayed scaling (lsexp.precision.delayed), run as one compiled MindSpore graph step after step,
gives bit for bit the scales and amax history of Transformer Engine's fused delayed-scaling update, as
transcribed in tests/helpers/te_delayed_scaling.py: over 200 steps of amaxes with zeros (history not
advanced), an inf and a NaN (scale kept; "max" skipping the NaN), tiny amaxes whose quotient overflows to
float32's largest, for both amax algorithms, margins 0 and 2, E4M3's and E5M2's maxima, short windows and
TE's default of 1024."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from helpers import te_delayed_scaling
from lsexp.precision.delayed import DelayedScaling

STEPS = 200
ZEROS, INF, NAN = (0, 37, 38, 121), 60, 90


def scripted_amaxes() -> np.ndarray:
    """Steps 0-139 spread over 2^-20..2^20 with exact zeros, an inf and a NaN at fixed steps; 140-159 grow
    to 2^18, 160-189 decay to 2^-125, and 190-199 stay at 2^-124..2^-123, where 448 / amax overflows."""
    rng = np.random.default_rng(0)
    mantissa = rng.uniform(1.0, 2.0, STEPS)
    amaxes = 2.0 ** rng.uniform(-20.0, 20.0, STEPS)
    amaxes[140:160] = mantissa[140:160] * 2.0 ** np.linspace(-20.0, 18.0, 20)
    amaxes[160:190] = mantissa[160:190] * 2.0 ** np.linspace(18.0, -125.0, 30)
    amaxes[190:] = mantissa[190:] * 2.0**-124
    amaxes[list(ZEROS)] = 0.0
    amaxes[INF], amaxes[NAN] = np.inf, np.nan
    amaxes = amaxes.astype(np.float32)
    assert np.all((amaxes[np.isfinite(amaxes) & (amaxes > 0)] >= 2.0**-126))  # no subnormals
    return amaxes


def assert_bits_equal(got, want, what):
    """Equal bit for bit; any NaN equals any NaN."""
    got, want = np.atleast_1d(np.asarray(got, np.float32)), np.atleast_1d(np.asarray(want, np.float32))
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}: {got[bad[:5]]} != {want[bad[:5]]}"


class Step(nn.Cell):
    """A train step's use of the state: quantise with the scale as it is, then update with the amax."""

    def __init__(self, state: DelayedScaling):
        super().__init__()
        self.state = state

    def construct(self, amax):
        used = self.state.scale * 1.0
        new = self.state.update(ops.depend(amax, used))
        return used, new


@pytest.fixture
def graph_mode():
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=mode)


@pytest.mark.parametrize("algo, margin, history_len, fp8_max", [
    ("max", 0, 16, 448.0),
    ("max", 0, 16, 57344.0),
    ("max", 2, 16, 448.0),
    ("max", 2, 16, 57344.0),
    ("most_recent", 0, 16, 448.0),
    ("most_recent", 0, 16, 57344.0),
    ("most_recent", 2, 16, 448.0),
    ("most_recent", 2, 16, 57344.0),
    ("max", 0, 1024, 448.0),  # TE's default window: the inf never leaves it
    ("max", 2, 2, 57344.0),
    ("max", 0, 1, 448.0),
])
def test_compiled_update_gives_transformer_engines_scales_and_history_bit_for_bit(
        graph_mode, algo, margin, history_len, fp8_max):
    amaxes = scripted_amaxes()
    state = DelayedScaling("layer.input", fp8_max, margin, history_len, algo)
    step = Step(state)
    used, new = [], []
    for a in amaxes:
        u, n = step(Tensor(a))
        used.append(u.asnumpy())
        new.append(n.asnumpy())

    want_used = te_delayed_scaling.scales(amaxes, fp8_max, margin, history_len, algo)
    reference = te_delayed_scaling.DelayedScaling(fp8_max, margin, history_len, algo)
    for a in amaxes:
        reference.record(a)
        reference.update()
    assert_bits_equal(used, want_used, "scale used")
    assert_bits_equal(new, want_used[1:] + [reference.scale], "scale written")
    assert_bits_equal(state.scale.asnumpy(), reference.scale, "scale Parameter")
    assert_bits_equal(state.amax_history.asnumpy(), reference.amax_history, "amax_history Parameter")
    # the script reaches the rules it is meant to: a kept scale after a zero, FLT_MAX from tiny amaxes
    assert want_used[1] == 1.0
    if algo == "most_recent" or history_len == 1:
        assert want_used[-1] == te_delayed_scaling.FLT_MAX


def test_state_is_two_unlearned_float32_parameters_named_for_the_checkpoint():
    state = DelayedScaling("blocks.0.fc1.weight", 448.0, 0, 16, "max")
    params = {p.name: p for p in state.get_parameters()}
    assert sorted(params) == ["lsexp_fp8.blocks.0.fc1.weight.amax_history",
                              "lsexp_fp8.blocks.0.fc1.weight.scale"]
    assert not state.trainable_params()
    history, scale = state.amax_history, state.scale
    assert history.dtype == ms.float32 and history.shape == (16,) and not history.asnumpy().any()
    assert scale.dtype == ms.float32 and scale.shape == () and scale.asnumpy() == 1.0


def test_unknown_amax_algorithm_is_refused():
    with pytest.raises(ValueError, match="amax_compute_algo"):
        DelayedScaling("x", 448.0, 0, 16, "mean")



class _Network(nn.Cell):
    """One product's use of two delayed scales, as lsexp.precision.recipes' TensorScale and QuantizedProduct
    make it, with the amaxes given: the input's scale read, then its amax recorded depending on that read;
    the gradient's scale read, and the product's output passed through the real GradientQuantizer, whose
    bprop notes the amax of the gradient arriving there. That gradient is grad_amax: the output is
    multiplied by it, and the step's sensitivity is 1. As a loss's gradient does, it comes after the
    forward pass (here by a depend on the product's output), and so after the step's advance(): without
    that, nothing orders the bprop's write of the noted amax after advance()'s read of the last one.
    Returns (that output, the two scales read)."""

    def __init__(self, forward: DelayedScaling, gradient):
        super().__init__(auto_prefix=False)
        self.forward_state = forward
        self.q_grad = gradient
        self.w = Parameter(Tensor(np.float32(1.0)), name="w")

    def construct(self, x, amax, grad_amax):
        scale = self.forward_state.scale * 1.0
        recorded = self.forward_state.record(ops.depend(amax, scale))
        y = ops.depend(x * scale, recorded) * self.w
        grad_scale = self.q_grad.history.scale * 1.0
        return self.q_grad(y, grad_scale) * ops.depend(grad_amax, y), scale, grad_scale


class _TrainStep(nn.Cell):
    """The order lsexp's cell engine calls the states in (lsexp.engines.cell's construct with
    lsexp.engines.body's _begin, single process): each state's advance() made a dependency of the
    first input, then the forward pass for the loss, then GradOperation over it with a sensitivity made
    from the loss, and its bprop (note()). The gradient's forward pass does not run record() a second time:
    MindSpore 2.10 runs a forward pass's side effects once a step (measured with an AssignAdd), so a
    record() that added instead of taking the maximum would pass here; train.accumulate_steps > 1, one
    record() per micro-batch, is not driven here."""

    def __init__(self, network: _Network, states):
        super().__init__(auto_prefix=False)
        self.network = network
        self.delayed_scales = nn.CellList(list(states), auto_prefix=False)
        self.n_advance = len(states)
        self.weights = ParameterTuple([network.w])
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, x, amax, grad_amax):
        first = x
        for i in range(self.n_advance):
            first = ops.depend(first, self.delayed_scales[i].advance())
        loss, scale, grad_scale = self.network(first, amax, grad_amax)
        sens = (ops.ones_like(loss), ops.zeros_like(scale), ops.zeros_like(grad_scale))
        grads = self.grad(self.network, self.weights)(first, amax, grad_amax, sens)
        return ops.depend(scale, grads[0]), grad_scale


@pytest.mark.parametrize("algo, margin, history_len", [("max", 0, 16), ("most_recent", 2, 16)])
def test_the_train_steps_record_note_and_advance_give_transformer_engines_scales_step_for_step(
        graph_mode, algo, margin, history_len):
    """The scripted amaxes through the calls training makes, compiled once, 200 steps: an input's
    (record() in the forward pass, E4M3) and a gradient's (note() in GradientQuantizer's bprop, E5M2), each
    advance()d before the next step's forward pass. Every step's scales, as the forward pass read them and
    as the Parameters hold them after the step, and both histories equal TE's, bit for bit. A gradient's
    amax is noted only when finite (an overflowed gradient is the loss scale's to skip): TE's is fed 0 at
    the inf and the NaN."""
    from types import SimpleNamespace

    from lsexp.precision.recipes import GradientQuantizer

    amaxes = scripted_amaxes()
    grad_amaxes = amaxes[::-1].copy()  # the gradient's history goes through the same values the other way
    kept = np.where(np.isfinite(grad_amaxes), grad_amaxes, np.float32(0.0))
    cfg = SimpleNamespace(margin=margin, amax_history_len=history_len, amax_compute_algo=algo)
    forward = DelayedScaling("layer.input", te_delayed_scaling.E4M3_MAX, margin, history_len, algo)
    gradient = GradientQuantizer("delayed", "e5m2", name="layer.grad", cfg=cfg)
    backward = gradient.history
    step = _TrainStep(_Network(forward, gradient), [forward, backward])

    te_forward = te_delayed_scaling.DelayedScaling(te_delayed_scaling.E4M3_MAX, margin, history_len, algo)
    te_backward = te_delayed_scaling.DelayedScaling(te_delayed_scaling.E5M2_MAX, margin, history_len, algo)
    one = Tensor(np.float32(1.0))
    for t, (a, g, k) in enumerate(zip(amaxes, grad_amaxes, kept)):
        scale, grad_scale = step(one, Tensor(a), Tensor(g))
        want_scale, want_grad_scale = te_forward.scale, te_backward.scale
        before_record = te_backward.amax_history.copy()  # between updates: slot 0 is 0
        te_forward.record(a)
        te_backward.record(k)
        what = f"step {t}"
        # the scales the step quantised with, read in the forward pass, and the Parameters after it
        assert_bits_equal(scale.asnumpy(), want_scale, f"{what}: input scale read")
        assert_bits_equal(grad_scale.asnumpy(), want_grad_scale, f"{what}: gradient scale read")
        assert_bits_equal(forward.scale.asnumpy(), want_scale, f"{what}: input scale Parameter")
        assert_bits_equal(backward.scale.asnumpy(), want_grad_scale, f"{what}: gradient scale Parameter")
        # the input's amax recorded in slot 0; the gradient's held aside until the next advance
        assert_bits_equal(forward.amax_history.asnumpy(), te_forward.amax_history, f"{what}: input history")
        assert_bits_equal(backward.amax_history.asnumpy(), before_record, f"{what}: gradient history")
        assert_bits_equal(backward.pending.asnumpy(), k, f"{what}: gradient amax noted")
        te_forward.update()
        te_backward.update()
    # the script reaches the rules it is meant to along this path too
    assert np.count_nonzero(te_forward.amax_history[1:]) == history_len - 1  # a full window
    if algo == "most_recent":
        assert te_forward.scale == te_delayed_scaling.FLT_MAX  # from the tiny amaxes
