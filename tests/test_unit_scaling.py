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
                             "num_channel, image_size; model=gpt and model=mlp have it"),
    (["model=mlp", "model.scaling=units"],
     "model.scaling=units: use standard or unit (docs/unit_scaling.md)"),
    (["workload=gpt_python", "model.scaling=unit", "model.dropout=0.1"], "model.dropout=0.1 with "
     "model.scaling=unit: the unit-scaled cells have no dropout; set model.dropout=0.0"),
])
def test_unit_scaling_that_cannot_be_is_one_line(tmp_path, args, says):
    assert_refused(run_cli(*args, cwd=tmp_path), says, tmp_path)


def test_the_locator_replays_an_overflow_of_the_unit_scaled_mlp(train_run):
    # dynamic's 2^24 overflows at once; the replay's taps sit around layers with a bprop of their own
    summary, rows, _ = train_run("model=mlp", "dataset=digits", "model.scaling=unit", "amp=O2",
                                 "loss_scale=dynamic", "train.max_steps=2")
    assert summary["overflow_steps"] == [1, 2]
    assert summary["first_nonfinite"]["step"] == 1 and rows[0]["first_nonfinite_layer"].startswith("layers.")


# --- the unit-scaled GPT (model=gpt model.scaling=unit) ----------------------------------------------


def _close(have, want, rtol=1e-5, atol=1e-6):
    have = have.asnumpy() if hasattr(have, "asnumpy") else have
    np.testing.assert_allclose(have, want, rtol=rtol, atol=atol)


def test_the_gpts_layer_norm_lookup_and_embedding_add_follow_the_library(pynative):
    ms = pynative
    from lsexp.models.unit import UnitEmbeddingAdd, UnitLayerNorm, UnitLookup

    rng = np.random.default_rng(4)
    x, g = rng.normal(size=(3, 5, 8)).astype(np.float32), rng.normal(size=(3, 5, 8)).astype(np.float32)
    norm = UnitLayerNorm(8)
    gamma, beta = rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32)
    norm.gamma.set_data(ms.Tensor(gamma))
    norm.beta.set_data(ms.Tensor(beta))
    _close(norm(ms.Tensor(x)), ref.layer_norm(x, (8,), gamma, beta), rtol=1e-4, atol=1e-5)
    dx, (dgamma, dbeta) = _grads(ms, norm, x, g)
    want = ref.layer_norm_backward(x, (8,), gamma, beta, g)
    for have, key in ((dx, "input"), (dgamma, "weight"), (dbeta, "bias")):
        _close(have, want[key], rtol=1e-4, atol=1e-5)

    table = rng.normal(size=(11, 8)).astype(np.float32)
    ids = rng.integers(0, 11, (3, 5)).astype(np.int32)
    lookup = UnitLookup(11)
    dtable = ms.grad(lambda t: (lookup(t, ms.Tensor(ids)) * ms.Tensor(g)).sum())(ms.Tensor(table))
    _close(dtable, ref.embedding_backward(ids, table, g)["weight"])

    tokens, positions = x, rng.normal(size=(5, 8)).astype(np.float32)
    add = UnitEmbeddingAdd()
    _close(add(ms.Tensor(tokens), ms.Tensor(positions)), ref.add(tokens, positions, constraint=None))
    dtok, dpos = ms.grad(lambda a, b: (add(a, b) * ms.Tensor(g)).sum(), grad_position=(0, 1))(
        ms.Tensor(tokens), ms.Tensor(positions))
    want = ref.add_backward(tokens, positions, g, constraint=None)
    _close(dtok, want["input"])
    _close(dpos, want["other"])


def _reference_attention(x, w_qkv, w_o, nhead, g):
    """_modules.py MHSA's projections around functional.scaled_dot_product_attention (causal, with the
    derived factor), forward and back, from the transcription's functions."""
    batch, length, width = x.shape
    head, f = width // nhead, ref.causal_attention_scale(length)
    qkv = ref.linear(x, w_qkv, None)
    q, k, v = qkv.reshape(batch, length, 3, nhead, head).transpose(2, 0, 3, 1, 4)
    o = ref.scaled_dot_product_attention(q, k, v, is_causal=True, scale_factor=f)
    merged = o.transpose(0, 2, 1, 3).reshape(batch, length, width)
    y = ref.linear(merged, w_o, None)
    back_o = ref.linear_backward(merged, w_o, None, g)
    g_o = back_o["input"].reshape(batch, length, nhead, head).transpose(0, 2, 1, 3)
    back = ref.scaled_dot_product_attention_backward(q, k, v, g_o, is_causal=True, scale_factor=f)
    g_qkv = np.stack([back["query"], back["key"], back["value"]]).transpose(1, 3, 0, 2, 4)
    back_qkv = ref.linear_backward(x, w_qkv, None, g_qkv.reshape(batch, length, 3 * width))
    return y, {"input": back_qkv["input"], "qkv": back_qkv["weight"], "out": back_o["weight"]}


def test_the_gpts_causal_attention_follows_the_librarys_projections_and_attention(pynative):
    ms = pynative
    from lsexp.models.unit import UnitCausalSelfAttention

    rng = np.random.default_rng(5)
    x, g = rng.normal(size=(2, 6, 8)).astype(np.float32), rng.normal(size=(2, 6, 8)).astype(np.float32)
    attention = UnitCausalSelfAttention(8, 2, max_len=6)
    w_qkv, w_o = attention.qkv.weight.asnumpy(), attention.out.weight.asnumpy()
    mask = ms.Tensor(np.triu(np.ones((6, 6), dtype=np.bool_), k=1))
    y, want = _reference_attention(x.astype(np.float64), w_qkv, w_o, 2, g)
    _close(attention(ms.Tensor(x), mask), y, rtol=1e-4, atol=1e-5)
    params = attention.trainable_params()
    dx, (dqkv, dout) = ms.grad(lambda t: (attention(t, mask) * ms.Tensor(g)).sum(), grad_position=0,
                               weights=params)(ms.Tensor(x))
    for have, key in ((dx, "input"), (dqkv, "qkv"), (dout, "out")):
        _close(have, want[key], rtol=1e-4, atol=1e-5)


def test_the_gpts_mlp_residuals_and_tied_read_out_follow_the_library(pynative):
    ms = pynative
    from lsexp.models.unit import ResidualAdd, ScaleGrad, UnitGELU, UnitReadout

    rng = np.random.default_rng(6)
    x, g = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(4, 8)).astype(np.float32)
    gelu = UnitGELU()
    _close(gelu(ms.Tensor(x)), ref.gelu(x.astype(np.float64)), rtol=1e-5)
    _close(ms.grad(lambda t: (gelu(t) * ms.Tensor(g)).sum())(ms.Tensor(x)), ref.gelu_backward(x, g)["input"],
           rtol=1e-5)

    tau, skip = 0.01, rng.normal(size=(4, 8)).astype(np.float32)
    split_r, split_s, add = ScaleGrad(tau ** 0.5), ScaleGrad((1 - tau) ** 0.5), ResidualAdd(tau)
    _close(add(ms.Tensor(x), ms.Tensor(skip)), ref.residual_add(x, skip, tau))
    dx = ms.grad(lambda t: (add(split_r(t) * 2.0, split_s(t)) * ms.Tensor(g)).sum())(ms.Tensor(x))
    # residual branch: times 2 (a stand-in for the branch); the add passes each gradient as it is
    back = ref.residual_add_backward(g, tau)
    _close(dx, ref.residual_split_backward(2.0 * back["residual"], back["skip"], tau)["input"])

    table, labels = rng.normal(size=(10, 8)).astype(np.float32), rng.integers(0, 10, 4)
    readout = UnitReadout(8, 10)
    from lsexp.models.loss import SoftmaxCrossEntropy

    onehot, loss = ms.Tensor(np.eye(10, dtype=np.float32)[labels]), SoftmaxCrossEntropy()
    logits = ref.tied_output_projection(x.astype(np.float64), table)
    _close(readout(ms.Tensor(x), ms.Tensor(table)), logits, rtol=1e-5)
    dx, dtable = ms.grad(lambda a, b: loss(readout(a, b), onehot), grad_position=(0, 1))(
        ms.Tensor(x), ms.Tensor(table))
    g_logits = ref.softmax_cross_entropy_backward(logits, labels)["input"]
    want = ref.tied_output_projection_backward(x, table, g_logits)
    _close(dx, want["input"], rtol=1e-5)
    _close(dtable, want["weight"], rtol=1e-5)


FINAL_NORM_GAIN_GRADIENT = "norm.gamma gradient"


def _gpt_stds(ms, batches: int = 8) -> dict:
    """The standard deviation of every sub-cell's output and of the gradient flowing into it, and of every
    weight (its root mean square: a LayerNorm's gain starts at ones) and its gradient, of the unit-scaled
    GPT at initialisation: the workload's batch (32 sequences of 128 tokens, 256 byte values), random
    tokens and next tokens, averaged over `batches` batches (256 sequences). The gradient into an output
    is read as the gradient of a zero added to it by a forward hook; the logits' gradient (the unit
    cross-entropy's, inside the read-out) from the read-out's input."""
    from lsexp.models.gpt import GPT
    from lsexp.models.loss import SoftmaxCrossEntropy

    ms.set_seed(0)
    vocab, length = 256, 128
    net, loss = GPT(vocab, length, scaling="unit"), SoftmaxCrossEntropy()
    cells = {n: c for n, c in net.cells_and_names() if n and not isinstance(c, ms.nn.CellList)}
    outs, order, state = {}, [], {}

    def hook_for(name):
        def hook(cell, inputs, output):
            if name not in outs:
                order.append(name)
            outs[name] = output
            return output if state.get("d") is None else output + state["d"][order.index(name)]
        return hook

    for name, cell in cells.items():
        cell.register_forward_hook(hook_for(name))
    rng, params, stds = np.random.default_rng(7), net.trainable_params(), {}
    for _ in range(batches):
        tokens = ms.Tensor(rng.integers(0, vocab, (32, length)).astype(np.int32))
        labels = ms.Tensor(np.eye(vocab, dtype=np.float32)[rng.integers(0, vocab, (32, length))])
        state["d"] = None
        loss(net(tokens), labels)
        zeros = [ms.Tensor(np.zeros(outs[n].shape, np.float32)) for n in order]

        def f(*d):
            state["d"] = d
            return loss(net(tokens), labels)

        grads = ms.grad(f, grad_position=tuple(range(len(zeros))), weights=params)(*zeros)
        seen = {}
        for name, g in zip(order, grads[0]):
            if name not in ("readout",):  # the read-out's output gradient is the mean loss's, before it
                seen[f"{name} output"] = outs[name].asnumpy().std()
                seen[f"{name} output gradient"] = g.asnumpy().std()
        logits = net.readout.projection(outs["norm"], net.embedding_table)
        logits_grad = ms.grad(lambda z: loss(net.readout.loss_grad(z), labels))(logits)
        seen["logits gradient"] = logits_grad.asnumpy().std()
        for p, g in zip(params, grads[1]):
            if p.name.endswith(("weight", "embedding_table", "gamma")):
                seen[f"{p.name} (rms)"] = np.sqrt((p.asnumpy() ** 2).mean())
                seen[f"{p.name} gradient"] = g.asnumpy().std()
        for key, value in seen.items():
            stds[key] = stds.get(key, 0.0) + float(value) / batches
    return stds


def test_the_unit_scaled_gpt_is_unit_scaled_at_initialisation(pynative):
    stds = _gpt_stds(pynative)
    weights = [k for k in stds if k.endswith("(rms)")]
    assert len(weights) == 2 + 2 * 6 + 1  # two tables, six per block (two gains, four Dense), the last gain
    outside = {k: round(v, 3) for k, v in stds.items() if not 0.5 <= v <= 2 and k != FINAL_NORM_GAIN_GRADIENT}
    assert not outside, outside


@pytest.mark.xfail(strict=True, reason="the final LayerNorm's gain gradient measures 2.66: at initialisation "
                   "it is the logits' temperature direction, the same sign at every token, so the batch's "
                   "terms add up instead of cancelling (docs/unit_scaling.md); the library scales it as here")
def test_the_unit_scaled_gpts_final_gain_gradient_is_unit_scaled_at_initialisation(pynative):
    assert 0.5 <= _gpt_stds(pynative, batches=1)[FINAL_NORM_GAIN_GRADIENT] <= 2


@pytest.mark.slow  # 100 steps, ~16 s
def test_the_unit_scaled_gpt_trains_below_its_corpus_unigram_entropy_in_float32(train_run):
    # experiment=one_scale_or_many_gpt's setup: 16 x 64 bytes from the first 300 kB
    summary, rows, _ = train_run("workload=gpt_python", "model.scaling=unit", "loss_scale=none",
                                 "train.max_steps=100", "dataset.seq_len=64", "dataset.batch_size=16",
                                 "dataset.max_bytes=300000")
    assert summary["steps"] == 100 and summary["overflow_steps"] == []
    assert summary["eval_loss"] < summary["reference_loss"], summary  # 2.95 against 3.14 (docs)


def test_a_unit_scaled_models_gradients_do_not_shrink_with_mean_over_tokens(train_run):
    # the library's cross-entropy takes the batch's mean going forward only: in float16 with no scale, the
    # MLP's gradients at N = 2^24 are the batch's own, not 2^19 times smaller, and nothing flushes
    common = ("model=mlp", "dataset=digits", "model.scaling=unit", "amp=O2", "loss_scale=none",
              "train.max_steps=4", "telemetry=grads")
    _, own, _ = train_run(*common)
    _, large, _ = train_run(*common, "train.mean_over_tokens=16777216")
    assert [r["loss"] for r in large] == [r["loss"] for r in own]
    assert [r["zero_fraction"] for r in large] == [r["zero_fraction"] for r in own]
    assert max(r["zero_fraction"] for r in large) < 0.5
