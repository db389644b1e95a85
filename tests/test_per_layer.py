"""loss_scale=per_layer against the numpy transcription of its reference (tests/helpers/ada_loss_reference.py,
kumasento/gradient-scaling at 0ca4354): the rule inside a compiled MindSpore graph, on the host and in
MindSpore ops, over scripted gradients and weights; the scales of a chain composed as the reference
composes them; and real runs of the MLP, whose layers.csv carries every layer's scale."""

import csv

import numpy as np
import pytest

from conftest import run_cli
from helpers import ada_loss_reference as R
from helpers.refusal import assert_refused
from helpers.scalers import configure


def _rule_cell(host: bool, **keys):
    from mindspore import nn

    from lsexp.taps.adaptive import AdaLossTransform

    rule = dict(init_scale=1.0, scale_upper_bound=16.0, accum_upper_bound=1024.0, n_uf_threshold=1e-3)
    rule.update(keys)

    class Rule(nn.Cell):
        def __init__(self):
            super().__init__()
            self.t = AdaLossTransform(**rule, host=host)

        def construct(self, g, w, carried):
            dout, carried_out, record = self.t.backward_linked(g, 0, w, carried)
            return dout, carried_out, record

    return Rule()


def _scripted():
    """(name, g, W, prev): gradients of float16 at magnitudes where the rule picks 1, a middling scale, the
    16 cap, the accumulated cap, the overflow cap; an all-zero gradient; a zero weight."""
    rs = np.random.RandomState(7)
    w = (rs.standard_normal((64, 32)) * 0.05).astype(np.float16)
    cases = []
    for name, g_std, prev in [("one", 1e-2, 1.0), ("middling", 2e-6, 1.0), ("capped at 16", 1e-8, 1.0),
                              ("accumulated cap", 1e-7, 256.0), ("accumulated cap below 1", 1e-7, 2048.0),
                              ("middling, carried", 3e-7, 4.0)]:
        cases.append((name, (rs.standard_normal((16, 64)) * g_std).astype(np.float16), w, prev))
    big_w = (rs.standard_normal((64, 32)) * 30).astype(np.float16)
    # a small spread with one large element: the spread asks for a scale the product bound refuses
    g = np.full((16, 64), 1e-6, np.float16)
    g[0, 0] = 40.0
    g[1, 1] = -40.0
    cases.append(("overflow cap", g, big_w, 1.0))
    cases.append(("zero gradient", np.zeros((16, 64), np.float16), w, 2.0))
    cases.append(("zero weight", cases[1][1], np.zeros((64, 32), np.float16), 1.0))
    # a convolution's: fan_in is out x kh x kw
    cases.append(("convolution", (rs.standard_normal((4, 8, 6, 6)) * 4e-7).astype(np.float16),
                  (rs.standard_normal((8, 3, 3, 3)) * 0.1).astype(np.float16), 1.0))
    return cases


@pytest.mark.parametrize("host", [True, False], ids=["host", "ops"])
def test_the_rule_in_the_step_equals_the_transcription_case_for_case(host):
    import mindspore as ms

    configure()
    cell = _rule_cell(host)
    seen = set()
    for name, g, w, prev in _scripted():
        expected = R.get_loss_scale(g, w, prev_scale=np.array(prev, np.float16))
        dout, carried, record = cell(ms.Tensor(g), ms.Tensor(w), ms.Tensor(np.float32(prev)))
        got = float(record.asnumpy()[0])
        assert got == expected, (name, got, expected)
        assert float(carried.asnumpy()) == float(record.asnumpy()[1]) == prev * expected, name
        np.testing.assert_array_equal(dout.asnumpy(), (g * np.float16(expected)).astype(np.float16), name)
        seen.add(expected)
    # the cases reach every branch of the rule: 1, a middling power of two, the caps
    assert {1.0, 16.0, 4.0, 0.5} <= seen, seen


def test_the_chain_s_last_layer_carries_the_global_scale_alone():
    import mindspore as ms

    configure()
    _, g, w, _ = _scripted()[1]
    cell = _rule_cell(True, init_scale=64.0)
    _, carried, record = cell(ms.Tensor(g), ms.Tensor(w), ms.Tensor(np.float32(0.0)))
    expected = R.get_loss_scale(g, w, prev_scale=np.array(64.0, np.float16))
    assert float(record.asnumpy()[0]) == expected and float(carried.asnumpy()) == 64.0 * expected


def _chain(weights, init_scale):
    """A chain of Dense layers (no bias, no activation) in a SequentialCell, tapped under per_layer and
    threaded, with the loss sum(y * c): the gradient into the last layer is c * init_scale."""
    import mindspore as ms
    from mindspore import nn

    from lsexp.taps.adaptive import AdaLossTransform
    from lsexp.taps.cells import install
    from lsexp.taps.chain import thread

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.SequentialCell([nn.Dense(w.shape[1], w.shape[0], has_bias=False)
                                             for w in weights])

        def construct(self, x):
            return self.layers(x)

    net = Net()
    for dense, w in zip(net.layers, weights):
        dense.weight.set_data(ms.Tensor(w))
    names = [f"layers.{i}" for i in range(len(weights))]
    cells = dict(net.cells_and_names())
    taps = install(net, names, {n: cells[n] for n in names},
                   lambda n: AdaLossTransform(init_scale, 16.0, 1024.0, 1e-3, host=True))
    thread(net, taps.taps)
    return net, taps


def test_a_chain_s_scales_compose_as_the_references_step_for_step():
    """Three float32 Dense layers on values whose products and sums are exact (small integers times
    powers of two), so that the incoming gradients the test derives in numpy are the step's own; three
    steps with different weights and magnitudes. Each layer's scale and carried scale equal
    compose_layer_scales on those gradients, output layer first."""
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor, nn

    configure()
    rs = np.random.RandomState(3)
    seen = set()
    for step, (magnitude, init_scale) in enumerate([(2.0 ** -20, 1.0), (2.0 ** -24, 4.0), (2.0 ** -28, 1.0)]):
        weights = [rs.randint(-3, 4, size=shape).astype(np.float32) * np.float32(0.5)
                   for shape in [(8, 6), (8, 8), (4, 8)]]
        x = rs.randint(-2, 3, size=(5, 6)).astype(np.float32)
        c = rs.randint(-3, 4, size=(5, 4)).astype(np.float32) * np.float32(magnitude)
        net, taps = _chain(weights, init_scale)
        params = ParameterTuple(net.trainable_params() + taps.record_probes())

        class Loss(nn.Cell):
            def __init__(self):
                super().__init__()
                self.net = net

            def construct(self, x, c):
                return (self.net(x) * c).sum() * init_scale

        grads = ms.grad(Loss(), grad_position=None, weights=params)(Tensor(x), Tensor(c))
        records = [g.asnumpy() for g in grads[len(weights):]]
        # the gradients each layer receives, output layer first: c * init_scale into the last, then the
        # received gradient times the layer's recorded scale, through its weight (exact here)
        pairs, g = [], c * np.float32(init_scale)
        for w, record in zip(weights[::-1], records[::-1]):
            pairs.append((w, g))
            g = (g * np.float32(record[0])) @ w
        composed = R.compose_layer_scales(pairs, init_scale)
        expected = [(layer.scale, float(layer.cumulative)) for layer in composed]
        assert [tuple(map(float, r)) for r in records[::-1]] == expected, step
        seen.update(s for s, _ in expected)
        # and the weight gradients carry those scales: the step's unscale brings them back exactly
        for i, (w_grad, (_, carried)) in enumerate(zip(grads[:len(weights)], expected[::-1])):
            ups = [c * np.float32(init_scale)]
            for w in weights[:i:-1]:
                ups.append(ups[-1] @ w)
            acts = [x]
            for w in weights[:i]:
                acts.append(acts[-1] @ w.T)
            unscaled = ups[-1].T @ acts[-1] / np.float32(init_scale)
            np.testing.assert_allclose(w_grad.asnumpy() / np.float32(carried),
                                       unscaled, rtol=0, atol=0)
    assert len(seen) >= 3 and 16.0 in seen, seen  # scales of 1, between, and the cap


def _layers(folder):
    with open(folder / "layers.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("engine, layers", [("cell", False), ("functional", True)])
def test_a_real_mlp_run_records_every_layers_scale_and_trains(train_run, engine, layers):
    summary, rows, out = train_run("model=mlp", "dataset=digits", "amp=O2", "loss_scale=per_layer",
                                   f"engine={engine}", "train.max_steps=12", "inject.overflow_steps=[5]",
                                   f"telemetry.layers={str(layers).lower()}")
    assert summary["steps"] == 12 and summary["final_loss"] < float(rows[0]["loss"])
    assert [int(r["overflow"]) for r in rows] == [int(i == 5) for i in range(1, 13)]
    assert summary["skipped_steps"] == 1  # skipped, as fixed_drop skips it
    table = _layers(out)
    assert [r["layer"] for r in table[:3]] == ["layers.1", "layers.3", "layers.5"] and len(table) == 36
    assert (out / "layer_scales.png").stat().st_size > 0
    # the layers' statistics beside the scales with telemetry.layers, and only then
    assert ("underflow_fraction" in table[0]) == layers == (out / "layers.png").exists()
    for step in range(12):
        mine = table[3 * step:3 * step + 3]
        carried = 1.0  # init_scale
        for r in mine[::-1]:  # output layer first, as the backward pass meets them
            scale = float(r["layer_scale"])
            assert scale in {2.0 ** k for k in range(-10, 5)}, r
            carried *= scale
            assert float(r["carried_scale"]) == carried, r
        assert carried <= 1024


def test_per_layer_in_float32_trains_exactly_as_no_scale(train_run):
    """In float32 every power-of-two scale is exact, and so is its unscale: the histories are equal, loss for
    loss. A wrong unscale (a layer's weight gradient left scaled, or divided twice) would show at once: the
    layers' scales here are above 1."""
    common = ["model=mlp", "dataset=digits", "amp=O0", "train.max_steps=8"]
    scaled, rows, out = train_run(*common, "loss_scale=per_layer")
    _, plain, _ = train_run(*common, "loss_scale=none")
    assert max(float(r["layer_scale"]) for r in _layers(out)) > 1
    assert [r["loss"] for r in rows] == [r["loss"] for r in plain]


def _received(cfg, weights, x, labels, scales_by_layer, init_scale=1.0):
    """Per Dense of the MLP, output layer first: (its float32 weight, the gradient its backward received in
    the step, carrying the scales after it). The gradient is MindSpore's own, of the loss with respect to
    the layer's output in the same network, in PyNative; times a power of two, as the step scales it."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from lsexp.models.loss import loss_cell
    from lsexp.training.build import network

    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = network(cfg)
        ms.load_param_into_net(net, {k: ms.Parameter(Tensor(v), name=k) for k, v in weights.items()})
        cells = list(net.layers)
        loss = loss_cell()
        out, carried = [], init_scale
        for k in (5, 3, 1):
            head, tail = nn.SequentialCell(cells[:k + 1]), nn.SequentialCell(cells[k + 1:])
            y = head(Tensor(x))
            g = ms.grad(lambda t: loss(tail(t), Tensor(labels)))(y).asnumpy() * np.float32(carried)
            out.append((net.trainable_params()[k - 1], g))  # layers.k.weight
            carried *= scales_by_layer[f"layers.{k}"]
        return [(p.asnumpy(), g) for p, g in out], carried
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def test_a_real_runs_scales_are_the_transcription_on_that_steps_weights_and_gradients(train_run):
    """Two float32 steps of the MLP: each layer's scale in layers.csv equals the transcription's rule on the
    weight the step started from and the gradient that layer received, with the scale it carried."""
    import mindspore as ms

    from conftest import compose_cfg
    from lsexp.training.build import load_data

    common = ["model=mlp", "dataset=digits", "amp=O0", "loss_scale=per_layer"]
    _, _, out = train_run(*common, "train.max_steps=2")
    _, _, first = train_run(*common, "train.max_steps=1", "train.checkpoint=true")
    cfg = compose_cfg(*common)
    batches = load_data(cfg).batches(cfg.dataset, 0, 0)
    table = _layers(out)
    from lsexp.training.build import network

    start = {p.name: p.asnumpy() for p in network(cfg).trainable_params()}
    saved = ms.load_checkpoint(str(first / "checkpoint.ckpt"))
    after = {k: v.asnumpy() for k, v in saved.items() if k in start}
    assert any(not np.array_equal(after[k], start[k]) for k in start)
    for step, weights in ((1, start), (2, after)):
        x, labels = next(batches)
        rows = {r["layer"]: r for r in table if r["step"] == str(step)}
        scales = {name: float(r["layer_scale"]) for name, r in rows.items()}
        layers, _ = _received(cfg, weights, x.asnumpy(), labels.asnumpy(), scales)
        prev = np.float16(1.0)
        for (w, g), name in zip(layers, ("layers.5", "layers.3", "layers.1")):
            mine = R.get_loss_scale(g, w, prev_scale=np.array(prev))
            assert scales[name] == mine, (step, name, scales[name], mine)
            prev = np.float16(prev * np.float16(mine))
            assert float(rows[name]["carried_scale"]) == float(prev)
    assert max(float(r["layer_scale"]) for r in table) > 1  # the rule did more than pick 1


def test_the_locator_names_the_layer_of_a_per_layer_overflow(train_run):
    # a global scale of 10^7 on the loss: its gradient overflows float16 where it enters the read-out,
    # before any layer's scale; the replay runs on a copy whose taps measure, with the step's rule
    summary, rows, _ = train_run("model=mlp", "dataset=digits", "amp=O2", "loss_scale=per_layer",
                                 "loss_scale.init_scale=10000000", "train.max_steps=2")
    assert summary["overflow_steps"] == [1, 2] and summary["skipped_steps"] == 2
    assert (rows[0]["first_nonfinite_layer"], rows[0]["first_nonfinite_pass"]) == ("layers.5", "backward")


def test_per_layer_scales_the_unit_scaled_mlp_too(train_run):
    # its layers have a bprop of their own, beside the taps' (the compiler once lost a primitive there)
    summary, rows, out = train_run("model=mlp", "dataset=digits", "model.scaling=unit", "amp=O2",
                                   "loss_scale=per_layer", "train.max_steps=6")
    assert summary["final_loss"] < float(rows[0]["loss"]) and len(_layers(out)) == 18


@pytest.mark.slow
def test_a_per_layer_run_resumed_from_its_checkpoint_continues_exactly(train_run):
    """Every step computes its scales afresh from its own gradients, so a resumed run needs no scaler state:
    its losses and its layers' scales are the uninterrupted run's."""
    common = ["model=mlp", "dataset=digits", "amp=O2", "loss_scale=per_layer", "train.checkpoint=true"]
    _, whole, out = train_run(*common, "train.max_steps=10")
    _, first, half = train_run(*common, "train.max_steps=5")
    _, rest, resumed = train_run(*common, "train.max_steps=10", f"train.resume={half / 'checkpoint.ckpt'}")
    assert [r["loss"] for r in first + rest] == [r["loss"] for r in whole]
    straight = [(r["step"], r["layer_scale"]) for r in _layers(out) if int(r["step"]) > 5]
    assert [(r["step"], r["layer_scale"]) for r in _layers(resumed)] == straight


@pytest.mark.parametrize("args,says", [
    (["workload=gpt_python", "loss_scale=per_layer"],
     "loss_scale=per_layer with model._target_=lsexp.models.gpt.GPT: its layers are not the cells of one "
     "nn.SequentialCell, through which each layer's scale is handed back (lsexp.taps.chain); use a model "
     "whose layers are one chain, such as model=mlp (docs/per_layer.md)"),
    (["model=mlp", "dataset=digits", "loss_scale=per_layer", "train.mode=pynative"],
     "loss_scale=per_layer with train.mode=pynative: the taps are in the compiled step; "
     "set train.mode=graph"),
    (["model=mlp", "dataset=digits", "loss_scale=per_layer", "loss_scale.scale_upper_bound=0"],
     "loss_scale.scale_upper_bound=0.0: must be a finite number >= 1 (a scale below 1 would shrink the "
     "gradient it is there to save); e.g. 16"),
    (["model=mlp", "dataset=digits", "loss_scale=per_layer", "loss_scale.accum_upper_bound=-4"],
     "loss_scale.accum_upper_bound=-4.0: must be a finite number >= 1"),
    (["model=mlp", "dataset=digits", "loss_scale=per_layer", "train.accumulate_steps=2"],
     "loss_scale=per_layer with train.accumulate_steps=2: each micro-batch's gradients would carry scales "
     "of their own; set train.accumulate_steps=1"),
    (["model=mlp", "dataset=digits", "loss_scale=per_layer", "parallel=data"],
     "loss_scale=per_layer with parallel=data: each rank's scales would come from its own shard's "
     "gradients; use parallel=none"),
    (["model=mlp", "dataset=digits", "amp=O2", "loss_scale=per_layer", "precision=fp8_current"],
     "loss_scale=per_layer with precision.recipe=current: the recipe's quantised gradients would meet scales "
     "it does not know; use precision=none"),
    (["model=mlp", "dataset=digits", "amp=O2", "amp.dtype=bfloat16", "loss_scale=per_layer"],
     "loss_scale=per_layer with amp.dtype=bfloat16: the rule's limits are float16's (6e-8 to 65504, "
     "AdaLoss's u_min and u_max); use amp.dtype=float16, or loss_scale=none for bfloat16's range"),
])
def test_per_layer_that_cannot_be_is_one_line(tmp_path, args, says):
    assert_refused(run_cli(*args, cwd=tmp_path), says, tmp_path)
