"""Real MindSpore training steps through lsexp's own path (compose -> validate -> train)."""

import math

import numpy as np
import pytest


def reference_dynamic_scales(init, factor, window, flags):
    """The scale column MindSpore's own nn.DynamicLossScaleUpdateCell gives for these overflow flags."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn

    cell = nn.DynamicLossScaleUpdateCell(loss_scale_value=init, scale_factor=factor, scale_window=window)
    scale = Parameter(Tensor(init, ms.float32), name="scale")
    scales = []
    for flag in flags:
        scales.append(float(scale.asnumpy()))
        cell(scale, Tensor(bool(flag)))
    return scales


def test_default_run_reproduces_the_seed(train_run):
    summary, rows, _ = train_run()
    assert summary["steps"] == 320 and len(rows) == 320
    assert {r["epoch"] for r in rows} == set(range(1, 11))
    assert len(summary["epoch_loss"]) == 10
    for loss in summary["epoch_loss"].values():
        assert 2.28 <= loss <= 2.34
    assert summary["skipped_steps"] == 0 and summary["overflow_steps"] == []
    assert {r["loss_scale"] for r in rows} == {128.0}


INJECT = ["loss_scale=dynamic", "loss_scale.scale_window=2", "train.max_steps=8",
          "inject.overflow_steps=[3,5]"]


def test_injected_overflow_dynamic_matches_mindspore_update_cell(train_run):
    summary, rows, _ = train_run("amp=O0", *INJECT)
    flags = [r["overflow"] for r in rows]
    assert [r["step"] for r in rows if r["overflow"]] == [3, 5]
    assert summary["overflow_steps"] == [3, 5] and summary["skipped_steps"] == 2
    assert [r["loss_scale"] for r in rows] == reference_dynamic_scales(2.0**24, 2, 2, flags)


def test_scale_column_is_the_scale_each_step_used_without_injection_too(train_run):
    # Without injection nothing else orders the step's read of the scale before the update cell's write.
    _, rows, _ = train_run("amp=O2", "loss_scale=dynamic", "loss_scale.scale_window=2", "train.max_steps=12")
    assert rows[0]["loss_scale"] == 2.0**24
    assert [r["loss_scale"] for r in rows] == reference_dynamic_scales(2.0**24, 2, 2,
                                                                       [r["overflow"] for r in rows])


def test_real_fp16_overflow_on_o2_still_matches_mindspore(train_run):
    summary, rows, _ = train_run("amp=O2", *INJECT)
    flags = [r["overflow"] for r in rows]
    assert flags[2] == 1 and flags[4] == 1
    assert sum(flags) > 2, "with O2 and a 2^24 scale, fp16 overflows happen besides the injected ones"
    assert [r["loss_scale"] for r in rows] == reference_dynamic_scales(2.0**24, 2, 2, flags)
    assert summary["skipped_steps"] == sum(flags)


def _weights(ckpt):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(ckpt)).items()
            if not k.startswith("lsexp")}  # the step counters are the only state a skipped step advances


def test_fixed_drop_leaves_parameters_unchanged_across_an_injected_step(train_run):
    _, _, before = train_run("train.max_steps=2", "train.checkpoint=true")
    summary, rows, after = train_run("train.max_steps=3", "train.checkpoint=true",
                                     "inject.overflow_steps=[3]")
    assert rows[2]["overflow"] == 1 and summary["skipped_steps"] == 1
    w_before, w_after = _weights(before / "checkpoint.ckpt"), _weights(after / "checkpoint.ckpt")
    assert (w_before.keys() == w_after.keys()
            and {"conv1.weight", "fc3.bias", "moments.fc3.bias"} <= w_before.keys())
    for k in w_before:
        np.testing.assert_array_equal(w_before[k], w_after[k], err_msg=k)


def test_fixed_nodrop_with_matching_optimizer_scale_equals_scale_one(train_run):
    _, scaled, _ = train_run("loss_scale=fixed_nodrop", "train.max_steps=20")
    _, unscaled, _ = train_run("loss_scale=fixed_nodrop", "loss_scale.loss_scale=1", "train.max_steps=20")
    assert {r["loss_scale"] for r in scaled} == {1024.0}
    np.testing.assert_allclose([r["loss"] for r in scaled], [r["loss"] for r in unscaled], rtol=1e-5)


def test_fixed_nodrop_applies_an_injected_overflow_and_the_run_diverges(train_run):
    summary, rows, _ = train_run("loss_scale=fixed_nodrop", "train.max_steps=10", "inject.overflow_steps=[3]")
    assert summary["diverged"] is True and summary["diverged_at_step"] == 3
    assert summary["steps"] == 3 and len(rows) == 3 and summary["skipped_steps"] == 0
    assert summary["status"] == "finished"


def test_no_loss_scaling_records_and_applies_overflows_at_scale_one(train_run):
    summary, rows, _ = train_run("loss_scale=none", "amp=O3", "train.max_steps=10")
    assert summary["strategy"] == "none" and {r["loss_scale"] for r in rows} == {1.0}
    assert summary["final_loss_scale"] == 1.0 and summary["skipped_steps"] == 0
    summary, rows, _ = train_run("loss_scale=none", "amp=O3", "train.max_steps=10",
                                 "inject.overflow_steps=[4]")
    assert rows[3]["overflow"] == 1 and summary["diverged_at_step"] == 4  # applied, not skipped


@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_resumed_run_continues_the_scale_history_exactly(train_run):
    common = ["amp=O2", "loss_scale=dynamic", "loss_scale.scale_window=3"]
    _, straight, _ = train_run(*common, "train.max_steps=24")
    _, first, part = train_run(*common, "train.max_steps=10", "train.checkpoint=true")
    summary, second, _ = train_run(*common, "train.max_steps=24", f"train.resume={part / 'checkpoint.ckpt'}")
    assert [r["step"] for r in second] == list(range(11, 25))
    assert first + second == straight
    assert summary["resumed_from_step"] == 10


def test_digits_reports_validation_accuracy(train_run):
    summary, rows, _ = train_run("dataset=digits", "model=mlp", "train.epochs=2")
    assert summary["steps"] == 2 * (1438 // 32)
    assert summary["eval_accuracy"] > 0.8, summary
    assert rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.parametrize("amp", ["O0", "O1", "O2", "O3"])
@pytest.mark.parametrize("loss_scale", ["none", "fixed_drop", "fixed_nodrop", "dynamic"])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_every_strategy_and_amp_level_trains_in_graph_mode(train_run, loss_scale, amp):
    summary, rows, _ = train_run(f"loss_scale={loss_scale}", f"amp={amp}", "train.max_steps=4")
    assert len(rows) == summary["steps"] >= 1
    assert all(math.isfinite(r["loss"]) for r in rows[:1])


@pytest.mark.parametrize("loss_scale", ["fixed_drop", "fixed_nodrop", "dynamic"])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_every_strategy_trains_in_pynative_mode(train_run, loss_scale):
    summary, rows, _ = train_run(f"loss_scale={loss_scale}", "amp=O2", "train.mode=pynative",
                                 "train.max_steps=6", "inject.overflow_steps=[2]")
    assert rows[1]["overflow"] == 1
    if loss_scale == "fixed_nodrop":
        assert summary["diverged_at_step"] == 2
    else:
        assert rows[1]["skipped_steps"] >= 1 and not summary["diverged"]


def test_mlp_model_trains(train_run):
    summary, rows, _ = train_run("model=mlp", "train.max_steps=5")
    assert summary["steps"] == 5 and all(math.isfinite(r["loss"]) for r in rows)
