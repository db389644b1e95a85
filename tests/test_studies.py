"""The studies under experiments/, each run for real as a small sweep: the table and figure they
write, and their arithmetic checked against the runs' own histories and telemetry."""

import math
import subprocess
import sys

import pytest

from helpers.study_sweep import study_sweep as _sweep
from helpers.study_sweep import study_table as _table


@pytest.mark.slow  # a study sweep and its table are in the default suite (dynamic_window)
def test_underflow_study_fractions_equal_the_in_step_telemetry(tmp_path):
    client, parent, children = _sweep(tmp_path, "experiment=underflow", "workload=lenet5_digits,mlp_digits",
                                      "train.max_steps=3", "telemetry.histogram_steps=[1,3]")
    rows = _table(tmp_path, client, parent, "underflow")
    assert len(rows) == 4  # two workloads, two histogram steps
    for row in rows:
        (child,) = [c for c in children if row["workload"] in c.data.tags["lsexp.overrides"]]
        in_step = {m.step: m.value
                   for m in client.get_metric_history(child.info.run_id, "underflow_fraction")}
        # The histogram's count below 2^-24 at S=1 is what the compiled step counted
        # (float32 vs float64 sums).
        assert float(row["lost_at_2^0"]) == pytest.approx(in_step[int(row["step"])], abs=1e-6)
        lost = [float(row[f"lost_at_2^{k}"]) for k in range(0, 25, 4)]
        assert lost == sorted(lost, reverse=True) and lost[-1] == 0.0
    assert any(float(r["lost_at_2^0"]) > 0 for r in rows)  # LeNet5's Normal(0.02) weights: ~0.2% at S=1


@pytest.mark.slow  # the step-1 arithmetic is also checked by the scale_sweep test
def test_none_vs_scaled_measures_the_gradient_no_scaling_loses(tmp_path):
    client, parent, children = _sweep(tmp_path, "experiment=none_vs_scaled", "workload=deep_mlp_digits",
                                      "model.hidden_units=[64,64,64,64,64,64]", "loss_scale=none,fixed_drop",
                                      "train.seed=1", "train.max_steps=2")
    rows = {r["choices"]: r for r in _table(tmp_path, client, parent, "none_vs_scaled")}
    none, fixed = rows["loss_scale=none"], rows["loss_scale=fixed_drop"]
    # Same weights and batch at step 1: the extra zeros are gradients float16 flushed without a scale.
    assert float(none["lost_at_step1"]) == pytest.approx(
        float(none["step1_zero_fraction"]) - float(fixed["step1_zero_fraction"]))
    assert float(none["lost_at_step1"]) > 0.5


@pytest.mark.slow  # a study sweep and its table are in the default suite (dynamic_window)
def test_scale_sweep_shows_both_ends_of_the_window(tmp_path):
    client, parent, children = _sweep(tmp_path, "experiment=scale_sweep", "workload=deep_mlp_digits",
                                      "amp=O3", "loss_scale.loss_scale=1,4096,16777216", "train.max_steps=3")
    rows = {float(r["log2_scale"]): r for r in _table(tmp_path, client, parent, "scale_sweep")}
    assert sorted(rows) == [0.0, 12.0, 24.0]
    assert float(rows[24.0]["skipped_fraction"]) == 1.0  # too large: every step overflows and is skipped
    assert float(rows[12.0]["skipped_fraction"]) == 0.0 and float(rows[0.0]["skipped_fraction"]) == 0.0
    # too small: most of the gradient flushes to zero
    assert float(rows[0.0]["step1_zero_fraction"]) > float(rows[12.0]["step1_zero_fraction"]) + 0.5


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_dynamic_window_counts_the_back_off_and_the_recovery_after_a_burst(tmp_path):
    client, parent, children = _sweep(tmp_path, "experiment=dynamic_window", "loss_scale=dynamic",
                                      "loss_scale.scale_window=5",
                                      "loss_scale.scale_factor=2,4", "inject.overflow_steps=[20,21]",
                                      "train.max_steps=40")
    rows = {int(r["scale_factor"]): r for r in _table(tmp_path, client, parent, "dynamic_window")}
    for factor, row in rows.items():
        (child,) = [c for c in children if c.data.params["loss_scale.scale_factor"] == str(factor)]
        scale = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "loss_scale")}
        overflow = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "overflow")}
        backoff = int(row["initial_backoff_skipped"])
        assert (backoff > 0 and all(overflow[s] == 1 for s in range(1, backoff + 1))
                and overflow[backoff + 1] == 0)
        assert scale[backoff + 1] == 2.0**24 / factor**backoff
        assert sum(int(part.split(":")[1]) for part in row["steps_at_each_scale"].split()) == 40
        # Two overflows divide the scale by factor^2; two windows of 5 clean steps multiply it back.
        before = scale[19]
        assert scale[22] == before / factor**2
        assert f"20-21 from 2^{int(math.log2(before))}: 10 steps below" in row["recovery_after_bursts"]

    # lsexp report redraws the study from the store alone, to the same table.
    again = subprocess.run([sys.executable, "-m", "lsexp.report.cli", parent.info.run_id, "--tracking-uri",
                            f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "again")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    (first,) = tmp_path.glob("multirun/*/*/study/dynamic_window.csv")
    assert (tmp_path / "again" / "dynamic_window.csv").read_text() == first.read_text()
    assert (tmp_path / "again" / "dynamic_window.png").stat().st_size > 0


@pytest.mark.slow  # tests/test_engines.py holds the engines to each other in the default suite
def test_engines_study_pairs_the_engines_runs_and_finds_them_identical(tmp_path):
    client, parent, children = _sweep(tmp_path, "experiment=engines", "loss_scale=dynamic_hysteresis",
                                      "train.epochs=2", "train.max_steps=50", "inject.overflow_steps=[5,6,7]")
    assert sorted(c.data.tags["lsexp.engine"] for c in children) == ["cell", "functional"]
    rows = {r["strategy"]: r for r in _table(tmp_path, client, parent, "engines")}
    assert sorted(rows) == ["dynamic_hysteresis"]
    for row in rows.values():
        assert row["same_overflows"] == "True" and row["same_scales"] == "True", row
        assert float(row["max_loss_difference"]) == 0.0 and int(row["steps"]) == 50
        assert float(row["cell_steps_per_second"]) > 0 and float(row["functional_steps_per_second"]) > 0
        assert float(row["functional_speed_ratio"]) == pytest.approx(
            float(row["functional_steps_per_second"]) / float(row["cell_steps_per_second"]))
    # hysteresis delays the back-off, not the skip
    assert int(rows["dynamic_hysteresis"]["skipped_steps"]) == 3


@pytest.mark.slow
def test_recipes_study_measures_the_schedule_drift_that_hold_leaves(tmp_path):
    client, parent, children = _sweep(
        tmp_path, "experiment=recipes", "train.max_steps=20",
        'hydra.sweeper.params={workload:transformer_sequence,loss_scale:"none,dynamic",'
        'lr_schedule.on_skip:"hold,advance",train.seed:"1"}')
    assert len(children) == 4
    rows = {(r["strategy"], r["on_skip"]): r for r in _table(tmp_path, client, parent, "recipes")}
    assert set(rows) == {("none", "hold = advance"), ("dynamic", "hold"), ("dynamic", "advance")}
    # dynamic's float16 back-off from 2^24 skips the first updates: hold leaves the schedule that many
    # steps behind, advance none
    held, advanced = rows[("dynamic", "hold")], rows[("dynamic", "advance")]
    assert float(held["skipped_updates"]) > 0
    assert float(held["schedule_drift_steps"]) == float(held["skipped_updates"])
    assert float(advanced["schedule_drift_steps"]) == 0
    assert float(rows[("none", "hold = advance")]["skipped_updates"]) == 0
