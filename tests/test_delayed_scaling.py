"""lsexp's delayed scaling (lsexp.precision.delayed), run as one compiled MindSpore graph step after step,
gives bit for bit the scales and amax history of Transformer Engine's fused delayed-scaling update, as
transcribed in tests/helpers/te_delayed_scaling.py: over 200 steps of amaxes with zeros (history not
advanced), an inf and a NaN (scale kept; "max" skipping the NaN), tiny amaxes whose quotient overflows to
float32's largest, for both amax algorithms, margins 0 and 2, E4M3's and E5M2's maxima, short windows and
TE's default of 1024."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

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
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
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
