"""Unit scaling (lsexp.models.unit, model.scaling=unit): each cell's forward and backward against the
numpy transcription of the authors' library (tests/helpers/unit_scaling_reference.py), and the paper's
promise measured on the MLP itself at initialisation: every layer's activations, weights and gradients
with a standard deviation within [0.5, 2] over 256 unit-normal samples."""

import numpy as np
import pytest

from conftest import run_cli
from helpers import unit_scaling_reference as ref
from helpers.refusal import assert_refused


@pytest.fixture()
def pynative():
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    yield ms
    ms.set_context(mode=ms.GRAPH_MODE)


def _grads(ms, cell, x, g):
    """(d<x, g>/dx ... ) of cell at x for the gradient g flowing into its output: (input, *parameters)."""
    params = cell.trainable_params()
    return ms.grad(lambda t: (cell(t) * ms.Tensor(g)).sum(), grad_position=0, weights=params)(ms.Tensor(x))


def test_unit_dense_and_relu_follow_the_library_forward_and_back(pynative):
    ms = pynative
    from lsexp.models.unit import UnitDense, UnitReLU

    rng = np.random.default_rng(0)
    x, g = rng.normal(size=(32, 48)).astype(np.float32), rng.normal(size=(32, 16)).astype(np.float32)
    dense = UnitDense(48, 16)
    w = rng.normal(size=(16, 48)).astype(np.float32)
    b = rng.normal(size=16).astype(np.float32)
    dense.weight.set_data(ms.Tensor(w))
    dense.bias.set_data(ms.Tensor(b))
    np.testing.assert_allclose(dense(ms.Tensor(x)).asnumpy(), ref.linear(x, w, b), rtol=1e-5, atol=1e-6)
    dx, (dw, db) = _grads(ms, dense, x, g)
    want = ref.linear_backward(x, w, b, g)
    for have, key in ((dx, "input"), (dw, "weight"), (db, "bias")):
        np.testing.assert_allclose(have.asnumpy(), want[key], rtol=1e-5, atol=1e-6)

    relu = UnitReLU()
    np.testing.assert_allclose(relu(ms.Tensor(x)).asnumpy(), ref.relu(x), rtol=1e-6)
    dx = ms.grad(lambda t: (relu(t) * ms.Tensor(x)).sum())(ms.Tensor(x))
    np.testing.assert_allclose(dx.asnumpy(), ref.relu_backward(x, x)["input"], rtol=1e-6)


def test_the_unit_cross_entropy_gradient_is_the_librarys_under_lsexps_mean_loss(pynative):
    ms = pynative
    from lsexp.models.loss import SoftmaxCrossEntropy
    from lsexp.models.unit import UnitCrossEntropyGrad

    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=(8, 10)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int32)
    head, loss = UnitCrossEntropyGrad(10), SoftmaxCrossEntropy()
    onehot = ms.Tensor(np.eye(10, dtype=np.float32)[labels])  # lsexp's labels, as the data sets give them
    value, grad = ms.value_and_grad(lambda t: loss(head(t), onehot))(ms.Tensor(logits))
    assert float(value.asnumpy()) == pytest.approx(ref.softmax_cross_entropy(logits, labels), rel=1e-6)
    np.testing.assert_allclose(grad.asnumpy(), ref.softmax_cross_entropy_backward(logits, labels)["input"],
                               rtol=1e-5, atol=1e-6)


READOUT_WEIGHT_GRADIENT = "layers.5 (UnitDense) weight gradient"


def _mlp_stds(ms) -> dict:
    """The standard deviation of every layer's output, weight, weight gradient and input gradient of the
    unit-scaled MLP at initialisation, over 256 unit-normal samples with random labels."""
    from lsexp.models.loss import SoftmaxCrossEntropy
    from lsexp.models.mlp import MLP

    ms.set_seed(0)
    net = MLP(num_class=10, num_channel=1, image_size=16, hidden_units=(256, 128), scaling="unit")
    rng = np.random.default_rng(2)
    out = ms.Tensor(rng.normal(size=(256, 1, 16, 16)).astype(np.float32))
    labels = ms.Tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)])
    cells, loss, stds = list(net.layers), SoftmaxCrossEntropy(), {}
    for i, cell in enumerate(cells):
        def tail(t, rest=tuple(cells[i:])):
            for c in rest:
                t = c(t)
            return loss(t, labels)

        # the gradient flowing into this cell's input, and into its parameters
        grads = ms.grad(tail, grad_position=0, weights=cell.trainable_params())(out)
        name = f"layers.{i} ({type(cell).__name__})"
        if i:  # the input of the first cell is the data
            stds[f"{name} input gradient"] = float(grads[0].asnumpy().std())
        for p, gp in zip(cell.trainable_params(), grads[1]):
            if p.name.endswith("weight"):
                stds[f"{name} weight"] = float(p.asnumpy().std())
                stds[f"{name} weight gradient"] = float(gp.asnumpy().std())
        out = cell(out)
        if type(cell).__name__ != "Flatten":
            stds[f"{name} output"] = float(out.asnumpy().std())
    return stds


def test_the_unit_scaled_mlp_is_unit_scaled_at_initialisation(pynative):
    stds = _mlp_stds(pynative)
    assert len(stds) >= 3 * 3 + 4  # three Dense: weight, its gradient, output; and the gradients between
    outside = {k: v for k, v in stds.items() if not 0.5 <= v <= 2 and k != READOUT_WEIGHT_GRADIENT}
    assert not outside, outside


@pytest.mark.xfail(strict=True, reason="the read-out's weight gradient measures 3.24: the ReLU's output has "
                   "mean 0.83, and the logits' shared offset makes the batch's gradients coherent "
                   "(docs/unit_scaling.md); not yet mended")
def test_the_unit_scaled_mlps_read_out_weight_gradient_is_unit_scaled_at_initialisation(pynative):
    assert 0.5 <= _mlp_stds(pynative)[READOUT_WEIGHT_GRADIENT] <= 2


@pytest.mark.parametrize("args,says", [
    (["model.scaling=unit"], "model.scaling=unit: LeNet5Config has no key 'scaling'; its keys are num_class, "
                             "num_channel, image_size; model=mlp has it"),
    (["model=mlp", "model.scaling=units"],
     "model.scaling=units: use standard or unit (docs/unit_scaling.md)"),
])
def test_unit_scaling_that_cannot_be_is_one_line(tmp_path, args, says):
    assert_refused(run_cli(*args, cwd=tmp_path), says, tmp_path)


def test_the_locator_replays_an_overflow_of_the_unit_scaled_mlp(train_run):
    # dynamic's 2^24 overflows at once; the replay's taps sit around layers with a bprop of their own
    summary, rows, _ = train_run("model=mlp", "dataset=digits", "model.scaling=unit", "amp=O2",
                                 "loss_scale=dynamic", "train.max_steps=2")
    assert summary["overflow_steps"] == [1, 2]
    assert summary["first_nonfinite"]["step"] == 1 and rows[0]["first_nonfinite_layer"].startswith("layers.")
