"""bfloat16 on a CPU (lsexp.amp.emulated): MindSpore 2.10's CPU kernels lack bfloat16 for MatMul, Conv2D,
Gather, ReLU and more, so amp.dtype=bfloat16 computes each cell amp casts in float32 on values rounded to
bfloat16 at its boundary. Checked against a numpy forward pass that rounds with ml_dtypes at the same
boundaries, on every built-in model through a compiled forward and backward pass, and through the
command, whose casts.csv says which operators emulate bfloat16."""

import csv

import numpy as np
import pytest

from conftest import run_cli
from helpers.refusal import assert_refused

ml_dtypes = pytest.importorskip("ml_dtypes")


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _amp(level="O2"):
    from types import SimpleNamespace

    return SimpleNamespace(level=level, dtype="bfloat16", get=lambda key: None)


@pytest.fixture()
def graph_cpu():
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    yield ms


def test_the_mlp_in_bfloat16_is_float32_arithmetic_rounded_at_every_cell(graph_cpu, tmp_path):
    ms = graph_cpu
    from lsexp.amp.lists import with_amp
    from lsexp.models.mlp import MLP

    ms.set_seed(0)
    net = MLP(num_class=10, num_channel=1, image_size=8, hidden_units=(32, 16))
    weights = [(p.name, p.asnumpy()) for p in net.trainable_params()]
    x = np.random.default_rng(0).normal(0, 3, (4, 1, 8, 8)).astype(np.float32)
    plain = net(ms.Tensor(x)).asnumpy()
    out = with_amp(net, _amp(), tmp_path)(ms.Tensor(x)).asnumpy()

    # the reference: the input, every cell's input and output rounded to bfloat16, float32 in between
    h = _bf16(_bf16(x).reshape(4, -1))
    w = dict(weights)
    for i, last in ((1, False), (3, False), (5, True)):
        h = _bf16(_bf16(h) @ w[f"layers.{i}.weight"].T + w[f"layers.{i}.bias"])
        if not last:
            h = _bf16(np.maximum(h, 0))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, _bf16(out))  # what leaves the network is a bfloat16 value
    # float32's own sums may round the other way at a bfloat16 tie: within one bfloat16 step
    np.testing.assert_allclose(out, h, rtol=2.0**-7, atol=0)
    assert np.mean(out == h) > 0.9
    assert not np.array_equal(out, plain)  # and not float32's: the rounding happened
    np.testing.assert_allclose(out, plain, rtol=0.05, atol=1e-3)
    assert [p.name for p in net.trainable_params()] == [name for name, _ in weights]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lenet5", "mlp", "resnet", "transformer", "gpt"])
def test_every_built_in_model_trains_a_step_in_bfloat16_at_o2_on_cpu(graph_cpu, tmp_path, model):
    ms = graph_cpu
    from mindspore import nn

    from lsexp.amp.lists import with_amp
    from lsexp.models.gpt import GPT
    from lsexp.models.lenet5 import LeNet5
    from lsexp.models.mlp import MLP
    from lsexp.models.resnet import ResNet
    from lsexp.models.transformer_encoder import Transformer

    rng = np.random.default_rng(0)
    images = rng.normal(0, 1, (4, 1, 32, 32)).astype(np.float32)
    tokens = rng.integers(0, 50, (4, 16)).astype(np.int32)
    net, x = {
        "lenet5": (LeNet5, images), "mlp": (MLP, images),
        "resnet": (lambda: ResNet(num_channel=1, depth=8), images),
        "transformer": (lambda: Transformer(vocab_size=50, max_len=16, num_class=10), tokens),
        "gpt": (lambda: GPT(vocab_size=50, max_len=16), tokens),
    }[model]
    net = with_amp(net(), _amp(), tmp_path)

    class Loss(nn.Cell):
        def __init__(self, network):
            super().__init__()
            self.network = network
            self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

        def construct(self, x, y):
            logits = self.network(x)
            return self.loss(logits[:, -1, :10] if logits.ndim == 3 else logits, y)

    y = ms.Tensor(np.arange(4, dtype=np.int32))
    loss, grads = ms.value_and_grad(Loss(net), None, net.trainable_params())(ms.Tensor(x), y)
    assert np.isfinite(loss.asnumpy())
    assert all(np.isfinite(g.asnumpy()).all() for g in grads)
    assert any(np.abs(g.asnumpy()).sum() > 0 for g in grads)
    out = net(ms.Tensor(x)).asnumpy()
    np.testing.assert_array_equal(out, _bf16(out))


def test_the_default_experiment_runs_in_bfloat16_at_o2_and_says_so_in_casts_csv(tmp_path):
    out = run_cli("amp=O2", "amp.dtype=bfloat16", "loss_scale=none", "train.epochs=1", "tracking=none",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "run" / "casts.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # every operator of LeNet5 computes in float32 on bfloat16 values: Conv2D and MatMul among them
    assert {r["op"] for r in rows} >= {"Conv2D", "MatMul", "ReLU", "MaxPool", "Flatten"}
    assert {(r["dtype"], r["emulates"]) for r in rows} == {("float32", "bfloat16")}
    assert {r["cell"] for r in rows} == {"conv1", "conv2", "fc1", "fc2", "fc3", "relu", "max_pool2d",
                                         "flatten"}


def test_bfloat16_where_amp_casts_operator_by_operator_names_the_kernel_mindspore_lacks(tmp_path):
    assert_refused(
        run_cli("amp=auto", "amp.dtype=bfloat16", "loss_scale=none", cwd=tmp_path),
        "amp.dtype=bfloat16: MindSpore 2.10.0's CPU kernels have no bfloat16 Conv2D, which "
        "model._target_=lsexp.models.lenet5.LeNet5 needs at amp.level=auto; use amp=O2 or O3 (lsexp emulates "
        "bfloat16 there on a CPU), amp.dtype=float16 with a loss_scale, or a GPU or Ascend device", tmp_path)
