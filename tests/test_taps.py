"""Per-layer taps (lsexp.taps): the locator names where an inf or NaN arose, the layer telemetry equals a
direct count on the gradients PyNative gives for the same weights, batch and scale, and a model's layers
are found, or refused in one line."""

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_cfg, run_cli

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
BYO = ["model._target_=my_pkg.MyNet", "+model.depth=3", "dataset._target_=my_pkg.make_data",
       "dataset.num_samples=128"]
# (workload overrides, a layer in the middle of the network)
MODELS = {
    "lenet5": ([], "fc1"),
    "mlp": (["model=mlp", "dataset=digits"], "layers.3"),
    "resnet": (["model=resnet", "model.depth=8", "dataset=digits"], "stages.1"),
    "transformer_sequence": (["workload=transformer_sequence"], "layers.0"),
    "transformer_text": (["workload=transformer_text"], "layers.1"),
    "byo": (BYO, "features.2"),
    "gpt": (["workload=gpt_python", "dataset.max_bytes=200000", "dataset.seq_len=32",
             "dataset.batch_size=16"], "blocks.0"),
}
FAST = {("lenet5", "forward", "cell"), ("mlp", "backward", "functional"), ("byo", "backward", "cell")}


def _cases():
    for model in MODELS:
        for where in ("forward", "backward"):
            for engine in ("cell", "functional"):
                marks = () if (model, where, engine) in FAST else (pytest.mark.slow,)
                yield pytest.param(model, where, engine, marks=marks, id=f"{model}-{where}-{engine}")


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)


@pytest.mark.parametrize("model,where,engine", list(_cases()))
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_the_locator_names_exactly_the_injected_layer_and_pass(train_run, examples_on_path, model, where,
                                                               engine):
    overrides, layer = MODELS[model]
    # a scale that no step of these 8 overflows by itself, so that step 7 is the only one
    summary, rows, _ = train_run(*overrides, "amp=O2", "loss_scale=dynamic",
                                 "loss_scale.init_loss_scale=1024", f"engine={engine}",
                                 f"inject.layer={layer}", f"inject.pass={where}",
                                 "inject.overflow_steps=[7]", "train.max_steps=8")
    first = summary["first_nonfinite"]
    assert (first["step"], first["layer"], first["pass"]) == (7, layer, where)
    assert summary["overflow_steps"] == [7]
    for row in rows:
        expected = (layer, where) if row["step"] == 7 else ("", "")
        assert (row["first_nonfinite_layer"], row["first_nonfinite_pass"]) == expected, row["step"]
    if where == "forward":  # the layer's input was finite, its output not
        assert math.isfinite(first["amax_in"]) and math.isinf(first["amax_out"])
    else:  # the gradient arrived at the layer's output non-finite, every later layer's was finite
        assert math.isinf(first["amax_in"])


def _as_the_compiled_step_computes(cell, x, output):
    """A layer's forward output as the compiled step computes it on CPU, from the input PyNative gave it.
    The one layer of these runs whose output differs is a float16 Dense: graph mode's CPU backend has no
    float16 MatMul, so it runs MatMul and BiasAdd as float32 kernels on the float16 input, weight and bias
    and rounds once, after the bias; PyNative runs each op by itself, so the product rounds to float16 and
    then its sum with the bias again. Here: MindSpore's float32 MatMul and BiasAdd, then one cast."""
    import mindspore as ms
    from mindspore import nn, ops

    if output.dtype != np.float16:  # float32 (O0): the same kernels in the same order
        return output
    assert isinstance(cell, nn.Dense) and not cell.activation_flag and x.ndim == 2, \
        f"no graph-order reference for a float16 {type(cell).__name__}"

    def f32(t):  # as amp rounds it to float16, then as the CPU backend widens it for the kernel
        return ops.cast(ops.cast(t, ms.float16), ms.float32)

    y = ops.matmul(f32(ms.Tensor(x)), f32(cell.weight).T)
    if cell.has_bias:
        y = ops.bias_add(y, f32(cell.bias))
    return ops.cast(y, ms.float16).asnumpy()


def _pynative_layer_grads(cfg, scale: float):
    """{layer: (gradient at its input, at its output)}, {layer: forward output} and {layer: forward output
    as the compiled step computes it (_as_the_compiled_step_computes)}, for the first batch of cfg's run at
    its initial weights, computed eagerly with hooks: outside the compiled step."""
    import mindspore as ms
    from mindspore import nn

    from lsexp.models.loss import SoftmaxCrossEntropy
    from lsexp.taps.layers import layer_names
    from lsexp.training.build import load_data, network

    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = network(cfg)
        names = layer_names(net)
        cells = dict(net.cells_and_names())
        grads, outputs, inputs = {}, {}, {}

        def forward_hook(cell, ins, output, name):
            outputs[name], inputs[name] = output.asnumpy(), ins[0].asnumpy()

        for name in names:
            cells[name].register_backward_hook(
                lambda cell, g_in, g_out, name=name: grads.__setitem__(
                    name, (g_in[0].asnumpy() if g_in[0] is not None else None, g_out[0].asnumpy())))
            cells[name].register_forward_hook(
                lambda cell, ins, output, name=name: forward_hook(cell, ins, output, name))
        amp = ms.amp.auto_mixed_precision(net, cfg.amp.level, dtype=ms.float16)
        loss_net = nn.WithLossCell(amp, SoftmaxCrossEntropy())
        data = load_data(cfg)
        x, y = next(iter(data.batches(cfg.dataset, 0, 0)))
        x, y = ms.Tensor(np.asarray(x)), ms.Tensor(np.asarray(y))
        weights = loss_net.trainable_params()
        ms.grad(lambda a, b: loss_net(a, b) * ms.Tensor(scale, ms.float32), grad_position=None,
                weights=weights)(x, y)
        # after the step: the weights it did not change, the reference's ops outside its gradient
        compiled = {name: _as_the_compiled_step_computes(cells[name], inputs[name], outputs[name])
                    for name in names}
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    return names, grads, outputs, compiled


def _layers_csv(run_dir):
    with open(run_dir / "layers.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("strategy", [
    "fixed_drop",
    # the update is applied: the replay takes the weights the step kept from before it
    pytest.param("fixed_nodrop", marks=pytest.mark.slow),
])
def test_a_natural_overflow_is_located_where_the_eager_gradients_first_overflow(train_run, strategy):
    overrides = ("model=mlp", "dataset=digits", "amp=O2", f"loss_scale={strategy}",
                 "loss_scale.loss_scale=16777216")
    summary, rows, _ = train_run(*overrides, "train.max_steps=2")
    first = summary["first_nonfinite"]
    assert first["step"] == 1 and rows[0]["overflow"] == 1
    names, grads, outputs, _ = _pynative_layer_grads(compose_cfg(*overrides), 16777216.0)
    assert all(np.isfinite(outputs[n]).all() for n in names), "no forward output overflows at this scale"
    expected = None
    for name in reversed(names):  # backward: the last layer first
        g_in, g_out = grads[name]
        if not np.isfinite(g_out).all() or (g_in is not None and not np.isfinite(g_in).all()):
            expected = name
            break
    assert expected is not None
    assert (first["layer"], first["pass"]) == (expected, "backward")
    arrived = np.abs(grads[expected][1].astype(np.float32))
    assert first["amax_in"] == float(np.nan_to_num(arrived, nan=np.inf, posinf=np.inf).max())


@pytest.mark.parametrize("overrides,scale", [
    (("model=mlp", "dataset=digits", "amp=O2", "loss_scale=fixed_drop", "loss_scale.loss_scale=1024"),
     1024.0),
    # O0: float32 gradients, counted by float16's limits, at a scale of 1 where some flush
    pytest.param(("amp=O0", "loss_scale=none"), 1.0, marks=pytest.mark.slow),
])
def test_layer_telemetry_equals_a_direct_count_on_the_eager_gradients(train_run, overrides, scale):
    summary, rows, run_dir = train_run(*overrides, "telemetry=layers", "train.max_steps=2")
    table = [r for r in _layers_csv(run_dir) if r["step"] == "1"]
    names, grads, _, compiled = _pynative_layer_grads(compose_cfg(*overrides), scale)
    assert [r["layer"] for r in table] == names
    tiny, top = np.float32(2.0**-24), np.float32(65504.0)
    for row in table:
        g = np.abs(grads[row["layer"]][1].astype(np.float32))
        size = np.float32(g.size)
        expected = {  # exactly: the forward output as the compiled step rounds it, the activation gradient
            "out_amax": np.abs(compiled[row["layer"]].astype(np.float32)).max(),
            "grad_amax": g.max(),
            "underflow_fraction": np.float32(((g > 0) & (g < tiny)).sum()) / size,
            "zero_fraction": np.float32((g == 0).sum()) / size,
            "overflow_fraction": np.float32((~(g <= top)).sum()) / size,
        }
        bad = [(row["layer"], key, row[key], value) for key, value in expected.items()
               if np.float32(row[key]) != value]
        assert not bad, bad
        assert float(row["loss_scale"]) == scale
    if scale == 1.0:
        assert any(float(r["underflow_fraction"]) > 0 for r in table), "at scale 1 some gradients flush"
    worst = rows[0]
    assert worst["layer_underflow_fraction_max"] == max(float(r["underflow_fraction"]) for r in table)
    assert (run_dir / "layers.png").stat().st_size > 0
    assert set(summary["layers"]) == set(names)


def test_layers_prints_the_tap_names_of_a_model_of_your_own(tmp_path):
    out = run_cli("layers", *BYO, cwd=tmp_path, env={"PYTHONPATH": EXAMPLES})
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert names == ["features.0", "features.2", "features.4", "head"]
    assert list(tmp_path.iterdir()) == []


NO_LAYERS = '''
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class Flat(nn.Cell):
    """A linear classifier written with its own Parameter: no sub-cell to tap."""

    def __init__(self, num_class, num_channel, image_size):
        super().__init__()
        self.w = Parameter(Tensor(np.zeros((num_channel * image_size * image_size, num_class), np.float32)))

    def construct(self, x):
        return ops.matmul(x.reshape(x.shape[0], -1), self.w)
'''


@pytest.mark.parametrize("args,says", [
    (["inject.layer=fc9", "inject.overflow_steps=[2]"],
     "inject.layer=fc9: model._target_=lsexp.models.lenet5.LeNet5 has no such layer; use one of conv1, "
     "conv2, fc1, fc2, fc3"),
    (["inject.layer=fc1", "inject.pass=sideways", "inject.overflow_steps=[2]"],
     "inject.pass=sideways: use forward"),
    pytest.param(["inject.layer=fc1"], "inject.layer=fc1 without inject.overflow_steps",
                 marks=pytest.mark.slow),
    (["telemetry=layers", "model._target_=flat.Flat"], "telemetry.layers=true with model._target_=flat.Flat: "
     "Flat has no sub-cell with parameters to tap; declare them on the model as tap_layers"),
    pytest.param(["inject.layer=w", "inject.overflow_steps=[2]", "model._target_=flat.Flat"],
                 "inject.layer=w with model._target_=flat.Flat: Flat has no sub-cell",
                 marks=pytest.mark.slow),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_bad_tap_options_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    (tmp_path / "flat.py").write_text(NO_LAYERS)
    out = run_cli(*args, "train.max_steps=3", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("lsexp")]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["flat.py"]


def test_a_model_without_layers_trains_with_the_locator_quietly_off(train_run, tmp_path, monkeypatch):
    (tmp_path / "flat.py").write_text(NO_LAYERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    summary, rows, _ = train_run("model._target_=flat.Flat", "loss_scale=dynamic",
                                 "inject.overflow_steps=[1]", "train.max_steps=2")
    assert summary["steps"] == 2
    first = summary["first_nonfinite"]  # an overflow, in no layer one can name
    assert first is not None and first["layer"] is None and first["pass"] == "unlocated"
    assert rows[0]["first_nonfinite_pass"] == "unlocated"
    sys.modules.pop("flat", None)


def test_a_checkpoint_carries_no_tap_scratch_and_resumes_with_taps_off(tmp_path, train_run):
    summary, _, run_dir = train_run("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024",
                                    "inject.layer=fc2",
                                    "inject.pass=backward", "inject.overflow_steps=[2]", "train.max_steps=3",
                                    "train.checkpoint=true")
    import mindspore as ms

    names = set(ms.load_checkpoint(str(run_dir / "checkpoint.ckpt")))
    assert not [n for n in names if n.startswith(("lsexp_tap.", "lsexp_shadow.", "lsexp_inject_factor"))]
    resumed, rows, _ = train_run("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024",
                                 "telemetry.locate=false",
                                 "train.max_steps=5", f"train.resume={run_dir / 'checkpoint.ckpt'}")
    assert resumed["resumed_from_step"] == 3 and [r["step"] for r in rows] == [4, 5]
    assert json.loads((run_dir / "summary.json").read_text())["first_nonfinite"]["layer"] == "fc2"


@pytest.mark.parametrize("level,scale,x_scale", [
    ("O2", 1024.0, 1.0),
    ("O2", 2.0**24, 1.0),  # the gradients overflow: inf and NaN counted
    ("O0", 1.0, 1e-4),  # float32 gradients, some below float16's flush limit
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_the_host_kernel_and_the_mindspore_ops_count_the_same_statistics(level, scale, x_scale):
    """CPU steps count a tap's statistics in one pyfunc kernel; GPU and Ascend steps in MindSpore ops. On
    the same network, weights, batch and scale, in graph mode, both give the same table, bit for bit."""
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor, nn, ops

    from lsexp.taps.cells import install

    rng = np.random.default_rng(0)
    x = Tensor((rng.standard_normal((32, 64)) * x_scale).astype(np.float32))
    y = Tensor(rng.integers(0, 10, 32).astype(np.int32))
    weights = None

    def table(host_counts):
        nonlocal weights
        net = nn.SequentialCell([nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(),
                                 nn.Dense(256, 10)])
        if weights is None:
            weights = [rng.standard_normal(p.shape).astype(np.float32) * 0.5 for p in net.get_parameters()]
        for p, w in zip(net.get_parameters(), weights):
            p.set_data(Tensor(w))
        layers = {name: cell for name, cell in net.cells_and_names() if isinstance(cell, nn.Dense)}
        amp = ms.amp.auto_mixed_precision(net, level, dtype=ms.float16)
        loss_net = nn.WithLossCell(amp, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        taps = install(loss_net, list(layers), layers, host_counts=host_counts)

        class Grads(nn.Cell):
            def __init__(self):
                super().__init__(auto_prefix=False)
                self.net, self.probes = loss_net, ParameterTuple(taps.probes(entry=True))
                self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

            def construct(self, a, b, sens):
                return self.grad(self.net, self.probes)(a, b, sens)

        return taps.table([g.asnumpy() for g in Grads()(x, y, Tensor(scale, ms.float32))], entry=True)

    host, device = table(True), table(False)
    np.testing.assert_array_equal(host, device)
    assert np.isfinite(host).all() == (scale < 2.0**24)
    if level == "O0":
        from lsexp.taps import STATS

        assert (host[:, STATS.index("underflow_fraction")] > 0).any(), "some gradients are below 2^-24"
