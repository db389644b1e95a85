"""Eight-bit recipes (precision=..., lsexp.precision): a quantised product computes with exactly the values
lsexp.formats gives for its input, weight and gradient; every recipe trains under every loss_scale
option; the delayed scales are Parameters that a checkpoint carries, so that resume is exact; bad
precision.* is one line, exit 2, nothing written; with no recipe the network is what it was."""

import numpy as np
import pytest

from conftest import compose_cfg, run_cli
from helpers.scalers import configure

RECIPES = ["fp8_delayed", "fp8_current", "mxfp8", "hif8_current"]


def _scaled_reference(x, fmt, fmt_max):
    """Current scaling: x * (max / amax), cast with saturation, times 1 / scale (float32 throughout)."""
    from lsexp.formats import quantize

    x = np.asarray(x, np.float32)
    scale = np.float32(fmt_max) / np.float32(np.abs(x).max())
    return quantize(x * scale, fmt, saturate=True) * (np.float32(1) / scale)


@pytest.mark.parametrize("host", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["numpy kernels", "mindspore ops"])
@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8", "hif8_current"])
def test_a_quantised_dense_computes_with_the_formats_values_forward_and_back(recipe, host):
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from lsexp.formats import quantize
    from lsexp.precision.recipes import QuantizedProduct

    configure()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = compose_cfg(f"precision={recipe}", "amp=O2").precision
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 64)) * 3).astype(np.float32)
    dense = nn.Dense(64, 32, has_bias=False)
    w = dense.weight.asnumpy()
    q = QuantizedProduct(dense, "fc", cfg, host)
    dy = (rng.standard_normal((8, 32)) * 1e-3).astype(np.float32)

    def loss(x):
        return (q(x) * Tensor(dy)).sum()

    y = q(Tensor(x)).asnumpy()
    dx = ms.grad(loss)(Tensor(x)).asnumpy()
    if recipe == "mxfp8":
        xq, wq, dyq = quantize(x, "mx_e4m3", rounding="even"), quantize(w, "mx_e4m3", rounding="even"), \
            quantize(dy, "mx_e5m2", rounding="even")
    else:
        fwd, bwd = ("hif8", "hif8") if recipe == "hif8_current" else ("e4m3", "e5m2")
        from lsexp.formats import FORMATS

        xq, wq = _scaled_reference(x, fwd, FORMATS[fwd].max), _scaled_reference(w, fwd, FORMATS[fwd].max)
        dyq = _scaled_reference(dy, bwd, FORMATS[bwd].max)
    np.testing.assert_allclose(y, xq @ wq.T, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx, dyq @ wq, rtol=1e-6, atol=1e-9)
    # and they are not the unquantised ones
    assert not np.allclose(y, x @ w.T, rtol=1e-4, atol=0)
    assert ops.isfinite(Tensor(dx)).all()
    configure()


@pytest.mark.slow
# one Transformer block, not two: every cell a recipe wraps is in one, and each option's compile is most of
# this test's time; 1024 sequences leave 25 steps' worth to train on and one eval batch (its 1638 sequences
# in seven batches were a third of each run)
@pytest.mark.parametrize("workload", [["model=mlp", "dataset=digits"],
                                      ["workload=transformer_sequence", "model.num_layers=1",
                                       "dataset.num_samples=1024"]],
                         ids=["mlp", "transformer"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_trains_twenty_steps_under_every_loss_scale_option(train_run, recipe, workload):
    from lsexp.config import paths

    # per_layer refuses a recipe, in one line (tests/test_per_layer.py)
    options = sorted(p.stem for p in (paths.conf_dir() / "loss_scale").glob("*.yaml"))
    options = [o for o in options if o != "per_layer"]
    if workload[0] != "model=mlp":
        # The options' train steps are the model's own: what a recipe meets of each option, every pair on
        # the MLP shows. The Transformer adds its own cells to wrap, which one step of each kind meets: a
        # scale that changes and drops (dynamic, with the locator), every update applied with the
        # optimizer's loss_scale (fixed_nodrop), a scale from the measured amax (amax_history)
        options = ["amax_history", "dynamic", "fixed_nodrop"]
    for option in options:
        # The locator replays an overflowed step through a second compiled graph, the same for every
        # option: it runs (and is checked) under `dynamic`, whose 2^24 overflows at once, and is off for
        # the others, whose compiles were most of this test's time (docs/testing.md)
        locate = option == "dynamic"
        summary, rows, _ = train_run(*workload, "amp=O2", f"loss_scale={option}", f"precision={recipe}",
                                     "train.max_steps=20", f"telemetry.locate={str(locate).lower()}")
        assert summary["steps"] == 20 and np.isfinite(summary["final_loss"]), option
        if workload[0] == "model=mlp" and option in ("dynamic", "fixed_drop", "fixed_nodrop"):
            # a dropping or a non-dropping scale: the recipe trains under both, not only runs
            assert summary["final_loss"] < float(rows[0]["loss"]), option
        if locate:
            assert summary["overflow_steps"], "dynamic's 2^24 overflows in float16"
            assert summary["first_nonfinite"]["step"] == summary["overflow_steps"][0]
            assert rows[summary["overflow_steps"][0] - 1]["first_nonfinite_pass"] in ("forward", "backward")


@pytest.mark.slow
def test_delayed_scales_are_checkpointed_and_resume_is_exact(train_run):
    import mindspore as ms

    common = ["model=mlp", "dataset=digits", "amp=O2", "loss_scale=dynamic", "precision=fp8_delayed",
              "precision.amax_history_len=4", "train.checkpoint=true"]
    whole, rows, out = train_run(*common, "train.max_steps=12")
    _, first, half = train_run(*common, "train.max_steps=6")
    saved = ms.load_checkpoint(str(half / "checkpoint.ckpt"))
    scales = {k: v.asnumpy() for k, v in saved.items() if k.startswith("lsexp_fp8.")}
    assert scales and any(k.endswith(".scale") for k in scales)
    assert any(k.endswith(".amax_history") and v.shape == (4,) for k, v in scales.items())
    assert not all(float(v) == 1.0 for k, v in scales.items() if k.endswith(".scale"))  # they moved
    _, resumed, _ = train_run(*common, "train.max_steps=12", f"train.resume={half / 'checkpoint.ckpt'}")
    assert [r["loss"] for r in first + resumed] == [r["loss"] for r in rows]


def test_with_no_recipe_the_network_is_unchanged():
    configure()
    from lsexp.precision.recipes import QuantizedProduct, install
    from lsexp.training.build import network, with_precision
    from lsexp.training.plan import plan_of

    cfg = compose_cfg("model=mlp", "dataset=digits", "amp=O2")
    net = network(cfg)
    before = [p.name for p in net.get_parameters()]
    with_precision(cfg, plan_of(cfg), net)
    assert [p.name for p in net.get_parameters()] == before
    assert not any(isinstance(c, QuantizedProduct) for _, c in net.cells_and_names())
    wrapped = install(net, compose_cfg("precision=fp8_delayed").precision)
    assert set(wrapped) == {"layers.1", "layers.3", "layers.5"}
    names = [p.name for p in net.get_parameters()]
    assert names[:len(before)] == before or set(before) <= set(names)
    assert {n for n in names if n.startswith("lsexp_fp8.")} == {
        f"lsexp_fp8.{layer}.{tensor}.{what}" for layer in wrapped for tensor in ("input", "weight")
        for what in ("amax_history", "scale")} | {
        f"lsexp_fp8.{layer}.grad.{what}" for layer in wrapped
        for what in ("amax_history", "scale", "pending")}


@pytest.mark.parametrize("override, message", [
    ("precision.recipe=fp9", "precision.recipe=fp9: no such recipe; use one of none, delayed, current, mx"),
    ("precision.fp8_format=E3M4", "precision.fp8_format=E3M4: no such format; use one of HYBRID, E4M3, E5M2, "
                                  "HIF8"),
    ("precision.margin=-1", "precision.margin=-1: must be >= 0"),
    ("precision.amax_history_len=0", "precision.amax_history_len=0: must be >= 1 step"),
    ("precision.amax_compute_algo=mean", "precision.amax_compute_algo=mean: use one of max, most_recent"),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_bad_delayed_keys_are_one_line_exit_2_and_nothing_written(tmp_path, override, message):
    out = run_cli("precision=fp8_delayed", "amp=O2", override, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides, message", [
    (["precision=mxfp8", "amp=O2", "precision.block_size=16"],
     "precision.block_size=16: OCP MX v1.0 defines blocks of 32 elements only"),
    (["precision=fp8_current", "amp=O0"],
     "precision=current with amp.level=O0: nothing runs in low precision"),
    (["precision=fp8_current", "amp=O2", "model._target_=my_pkg.NoProducts", "dataset=digits"],
     "the model has no nn.Dense or nn.Conv2d for the recipe to quantise"),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_other_bad_precision_input_is_one_line_exit_2_and_nothing_written(tmp_path, overrides, message):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "my_pkg.py").write_text(
        "from mindspore import nn, ops, Parameter, Tensor\nimport numpy as np\n"
        "class NoProducts(nn.Cell):\n"
        "    def __init__(self, num_class=10, num_channel=1, **kw):\n"
        "        super().__init__()\n"
        "        self.w = Parameter(Tensor(np.ones((num_channel, num_class), np.float32)))\n"
        "    def construct(self, x):\n"
        "        return ops.matmul(x.mean(axis=(2, 3)), self.w)\n")
    work = tmp_path / "work"
    work.mkdir()
    out = run_cli(*overrides, cwd=work, env={"PYTHONPATH": str(tmp_path / "pkg")})
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert list(work.iterdir()) == []


@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_each_quantised_tensors_counts_reach_precision_csv_summary_and_mlflow(tmp_path):
    """The counts are the cast's: the first step's layers.1 weight is the model's initial weight (in
    float16 under O2), whose flushed fraction lsexp.formats gives directly."""
    import csv
    import json

    import mlflow

    from lsexp.formats import quantize
    from lsexp.training.build import network

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli("model=mlp", "dataset=digits", "amp=O2", "loss_scale=dynamic",
                  "loss_scale.init_loss_scale=1024", "precision=fp8_current", "train.max_steps=3",
                  f"tracking.uri={uri}", "hydra.run.dir=run", "train.progress=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "run" / "precision.csv")))
    tensors = {f"layers.{i}.{t}" for i in (1, 3, 5) for t in ("input", "weight", "grad")}
    assert {r["tensor"] for r in rows} == tensors and len(rows) == 3 * len(tensors)
    w = network(compose_cfg("model=mlp", "dataset=digits")).layers[1].weight.asnumpy()
    w = w.astype(np.float16).astype(np.float32)
    scale = np.float32(448.0) / np.abs(w).max()
    q = quantize(w * scale, "e4m3", saturate=True) * (np.float32(1) / scale)
    first = next(r for r in rows if r["step"] == "1" and r["tensor"] == "layers.1.weight")
    assert float(first["scale"]) == pytest.approx(float(scale), rel=1e-6)
    assert float(first["flushed_fraction"]) == np.count_nonzero((w != 0) & (q == 0)) / w.size
    assert float(first["saturated_fraction"]) == 0.0  # current scaling: the amax meets the format's largest
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["precision"]) == tensors
    mlflow.set_tracking_uri(uri)
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    assert "fp8_flushed_fraction_max" in run.data.metrics and run.data.params["precision.recipe"] == "current"
    artifacts = [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "telemetry")]
    assert "telemetry/precision.csv" in artifacts
