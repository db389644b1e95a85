"""Gradient telemetry: the in-step statistics against numpy on the same gradients."""

import csv
import math

import numpy as np
import pytest

from conftest import run_cli


def _layers(run_dir):
    with open(run_dir / "grad_layers.csv", newline="") as f:
        return list(csv.DictReader(f))


def _reference(layers, step):
    """Global statistics from the per-layer counts the probe wrote, computed here in numpy."""
    mine = [r for r in layers if int(r["step"]) == step]
    total = sum(int(r["elements"]) for r in mine)
    fractions = {k: sum(int(r[k]) for r in mine) / total for k in ("zero", "underflow", "overflow")}
    norm = math.sqrt(sum(float(r["norm"]) ** 2 for r in mine))
    return fractions, norm


@pytest.mark.parametrize("overrides", [
    # float16 layers at 2^24: real overflows, and what backprop flushed shows as zeros
    ["amp=O2", "loss_scale=dynamic"],
    # float32 at scale 1: the what-if for float16, where small gradients would flush
    ["amp=O0", "loss_scale=none"],
    # BatchNorm in float16; ResNet's convolutions run ~10x slower on some CPUs' oneDNN paths: -m slow
    pytest.param(["amp=O3", "loss_scale=fixed_nodrop", "model=resnet", "model.depth=8", "dataset=digits"],
                 marks=pytest.mark.slow),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_in_step_fractions_equal_numpy_on_the_same_gradients(train_run, overrides):
    summary, rows, run_dir = train_run(*overrides, "telemetry=grads", "telemetry.histogram_steps=[1,6]",
                                       "train.max_steps=8")
    layers = _layers(run_dir)
    assert {int(r["step"]) for r in layers} == {1, 6}
    for step in (1, 6):
        row = rows[step - 1]
        fractions, norm = _reference(layers, step)
        assert float(layers[[int(r["step"]) for r in layers].index(step)]["loss_scale"]) == row["loss_scale"]
        for key in ("zero", "underflow", "overflow"):
            assert row[f"{key}_fraction"] == pytest.approx(fractions[key], rel=1e-6, abs=1e-7), (step, key)
        amax = max(float(r["amax"]) for r in layers if int(r["step"]) == step)
        if row["overflow"]:
            assert math.isnan(row["headroom_log2"]), "no headroom on a step that overflowed"
        else:
            assert row["headroom_log2"] == pytest.approx(math.log2(65504.0 / amax), rel=1e-6, abs=1e-6)
        if math.isfinite(norm):
            assert row["grad_norm"] == pytest.approx(norm, rel=1e-4)
        else:
            assert not math.isfinite(row["grad_norm"])
        assert ((run_dir / f"grad_hist_step{step}.csv").is_file()
                and (run_dir / f"grad_hist_step{step}.png").is_file())
    if "loss_scale=none" in overrides:
        assert rows[0]["underflow_fraction"] > 0, "at scale 1 some LeNet5 gradients are below 2^-24"
    if "amp=O2" in overrides:
        assert rows[0]["overflow_fraction"] > 0 and rows[0]["overflow"] == 1
        # every step that did not overflow kept its largest float16 gradient at or below 65504
        assert math.isnan(rows[0]["headroom_log2"])
        assert all(r["headroom_log2"] >= 0 for r in rows if not r["overflow"])
    elif "amp=O0" in overrides:  # float32 at scale 1: LeNet5's largest gradient is far below float16's
        assert all(r["headroom_log2"] > 10 for r in rows)
    else:  # ResNet-8 at O3 (BatchNorm in float16 too) at a fixed 2^10: every step fits in float16
        assert not any(r["overflow"] for r in rows)
        assert all(r["headroom_log2"] >= 0 for r in rows)


@pytest.mark.parametrize("model", [
    pytest.param(["model=lenet5"], marks=pytest.mark.slow),  # ~20 s: the default suite stays under 10 min
    # BatchNorm's statistics too; ResNet-8 twice with the probe compiled is ~45 s here: -m slow
    pytest.param(["model=resnet", "model.depth=8"], marks=pytest.mark.slow),
])
def test_the_probe_leaves_training_as_it_was(train_run, model):
    # Fetching the gradients at a step must not change the run.
    common = [*model, "dataset=digits", "amp=O2", "loss_scale=dynamic", "train.max_steps=6"]
    _, plain, _ = train_run(*common, "telemetry=grads", "telemetry.histogram_steps=[]")
    _, probed, _ = train_run(*common, "telemetry=grads", "telemetry.histogram_steps=[2,3]")
    assert [list(r) for r in probed] == [list(r) for r in plain]
    # NaN == NaN
    np.testing.assert_equal([list(r.values()) for r in probed], [list(r.values()) for r in plain])


@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_telemetry_reaches_mlflow_as_metrics_and_artifacts(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli("telemetry=grads_layers", "amp=O2", "loss_scale=dynamic", "train.max_steps=12",
                  f"tracking.uri={uri}", "train.progress=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    for key in ("grad_norm", "underflow_fraction", "overflow_fraction", "zero_fraction", "headroom_log2",
                "weight_norm", "layer_underflow_fraction_max", "layer_zero_fraction_max",
                "layer_overflow_fraction_max", "layer_grad_amax_min_log2"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 12, key
    names = {a.path for a in client.list_artifacts(run.info.run_id, "telemetry")}
    # the histogram's PNG drawn by the tracking worker, from the CSVs the job wrote
    assert names == {"telemetry/grad_layers.csv", "telemetry/grad_hist_step1.csv",
                     "telemetry/grad_hist_step1.png", "telemetry/layers.csv", "telemetry/layers.png"}
    # telemetry=layers' per-layer means, which the sweep comparison takes as columns, and the locator's tag:
    # LeNet5's default dynamic scale of 2^24 overflows float16 where the loss gradient enters fc3
    assert {k for k in run.data.metrics if k.startswith("layer.fc1.")} >= {"layer.fc1.underflow_fraction",
                                                                           "layer.fc1.zero_fraction"}
    assert run.data.tags["lsexp.first_nonfinite"] == "fc3/backward@1"


def test_histogram_steps_outside_the_run_are_refused(tmp_path):
    out = run_cli("telemetry=grads", "telemetry.histogram_steps=[0,50]", "train.max_steps=20", cwd=tmp_path)
    assert out.returncode == 2 and list(tmp_path.iterdir()) == []
    assert out.stderr.strip() == ("lsexp: config error: telemetry.histogram_steps=[0, 50]: "
                                  "step(s) [0, 50] are outside this run's steps 1..20; "
                                  "pick steps in that range or raise train.max_steps")



def test_the_weights_norm_is_the_trained_parameters_norm_after_each_update(train_run):
    """weight_norm (telemetry.grads): at the last step, the global norm of the parameters the checkpoint
    holds, which the step's update left; and it moves only on a step that updated."""
    import mindspore as ms

    _, rows, run_dir = train_run("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024",
                                 "inject.overflow_steps=[3]", "telemetry=grads", "train.max_steps=5",
                                 "train.checkpoint=true")
    saved = ms.load_checkpoint(str(run_dir / "checkpoint.ckpt"))
    weights = [saved[n].asnumpy().astype(np.float64).ravel() for n in saved
               if n.split(".")[0] in ("conv1", "conv2", "fc1", "fc2", "fc3")]
    assert rows[-1]["weight_norm"] == pytest.approx(np.sqrt(sum((w * w).sum() for w in weights)), rel=1e-5)
    assert rows[2]["overflow"] == 1 and rows[2]["weight_norm"] == rows[1]["weight_norm"]  # skipped: unmoved
    assert rows[3]["weight_norm"] != rows[2]["weight_norm"]
