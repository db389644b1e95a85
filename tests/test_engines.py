"""engine=functional (value_and_grad, LossScalers, all_finite) against engine=cell (MindSpore's cells),
and scale collapse under either."""

import json

import pytest

from conftest import run_cli

STRATEGIES = ["none", "fixed_drop", "fixed_nodrop", "dynamic", "dynamic_hysteresis"]


@pytest.mark.parametrize("loss_scale", [s if s in ("fixed_drop", "dynamic")
                                        else pytest.param(s, marks=pytest.mark.slow) for s in STRATEGIES])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_functional_engine_gives_the_cell_engines_history(train_run, loss_scale):
    # O2 with dynamic's 2^24 start overflows float16 for real, besides the injected step.
    common = [f"loss_scale={loss_scale}", "amp=O2", "train.max_steps=10", "inject.overflow_steps=[6]"]
    cell, cell_rows, _ = train_run("engine=cell", *common)
    functional, functional_rows, _ = train_run("engine=functional", *common)
    assert functional_rows == cell_rows  # loss, scale, overflow and skipped updates, bit for bit
    assert cell_rows[5]["overflow"] == 1
    for key in ("steps", "skipped_steps", "overflow_steps", "final_loss_scale", "diverged_at_step"):
        assert functional[key] == cell[key], key


def test_the_one_difference_dynamic_scaler_stops_growing_below_inf(train_run):
    """DynamicLossScaler.adjust grows only to a finite value; DynamicLossScaleUpdateCell multiplies
    2^127 by 2 to inf, and from then on every step overflows and is skipped."""
    common = ["model=mlp", "amp=O0", "loss_scale=dynamic", f"loss_scale.init_loss_scale={2.0**125}",
              "loss_scale.scale_window=1", "train.max_steps=6"]
    _, cell, _ = train_run("engine=cell", *common)
    _, functional, _ = train_run("engine=functional", *common)
    growth = [2.0**125, 2.0**126, 2.0**127]
    assert [r["loss_scale"] for r in cell] == growth + [float("inf")] * 3
    assert [r["overflow"] for r in cell] == [0, 0, 0, 1, 1, 1] and cell[-1]["skipped_steps"] == 3
    assert [r["loss_scale"] for r in functional] == growth + [2.0**127] * 3
    assert [r["overflow"] for r in functional] == [0] * 6


@pytest.mark.parametrize("engine", ["cell", "functional"])
def test_a_scale_stuck_at_its_floor_collapses_the_run(train_run, engine):
    # From step 5 every step overflows: 16 and 8 back off to the floor of 4, which then overflows 5 times.
    summary, rows, _ = train_run(f"engine={engine}", "amp=O0", "loss_scale=dynamic_hysteresis",
                                 "loss_scale.hysteresis=1", "loss_scale.init_loss_scale=16",
                                 "loss_scale.min_loss_scale=4", "train.collapse_patience=5",
                                 f"inject.overflow_steps=[{','.join(map(str, range(5, 30)))}]",
                                 "train.max_steps=40")
    assert summary["collapsed"] is True and summary["collapsed_at_step"] == 11
    assert [r["loss_scale"] for r in rows[4:]] == [16.0, 8.0] + [4.0] * 5
    assert summary["steps"] == 11 and summary["status"] == "finished" and not summary["diverged"]


def test_collapse_is_a_result_exit_0_with_a_one_line_diagnosis(tmp_path):
    steps = ",".join(map(str, range(3, 40)))
    result = run_cli("loss_scale=dynamic", "loss_scale.init_loss_scale=4", f"inject.overflow_steps=[{steps}]",
                     "train.max_steps=60", "tracking=none", "train.progress=false", "hydra.run.dir=run",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    diagnosis = [line for line in result.stderr.splitlines()
                 if line.startswith("lsexp: loss scale collapsed")]
    assert len(diagnosis) == 1 and "at its floor 1" in diagnosis[0] and "Traceback" not in result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # 4 and 2 back off at steps 3 and 4; steps 5..24 overflow at the floor: 20, the default patience.
    assert summary["collapsed"] is True and summary["collapsed_at_step"] == 24 and summary["steps"] == 24


def test_a_dynamic_run_that_recovers_does_not_collapse(train_run):
    # At the floor from step 4: 2 overflows, a clean step, 3 overflows: never 4 in a row.
    summary, rows, _ = train_run("loss_scale=dynamic", "loss_scale.init_loss_scale=4",
                                 "train.collapse_patience=4", "inject.overflow_steps=[2,3,4,5,7,8,9]",
                                 "train.max_steps=12")
    assert summary["collapsed"] is False and summary["collapsed_at_step"] is None and summary["steps"] == 12
