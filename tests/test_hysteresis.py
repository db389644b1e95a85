"""loss_scale=dynamic_hysteresis: DeepSpeed's rule, in MindSpore's compiled step, under both engines."""

import numpy as np
import pytest

from helpers.deepspeed_loss_scaler import scale_column
from helpers.megatron_grad_scaler import scale_column as megatron_scale_column
from helpers.scalers import columns, configure

SETTINGS = [  # (settings, overflow probability): the floor, the cap and both hysteresis modes all reached
    (dict(init_loss_scale=2.0**16, hysteresis=2, consecutive_hysteresis=False, min_loss_scale=1.0,
          max_loss_scale=2.0**24, scale_factor=2, scale_window=10), 0.15),
    (dict(init_loss_scale=2.0**10, hysteresis=3, consecutive_hysteresis=True, min_loss_scale=1.0,
          max_loss_scale=None, scale_factor=2, scale_window=5), 0.3),
    (dict(init_loss_scale=8.0, hysteresis=1, consecutive_hysteresis=False, min_loss_scale=1.0,
          max_loss_scale=2.0**12, scale_factor=2, scale_window=3), 0.1),
    (dict(init_loss_scale=2.0**20, hysteresis=4, consecutive_hysteresis=False, min_loss_scale=4.0,
          max_loss_scale=2.0**22, scale_factor=4, scale_window=1), 0.6),
    (dict(init_loss_scale=2.0**8, hysteresis=2, consecutive_hysteresis=True, min_loss_scale=2.0,
          max_loss_scale=2.0**9, scale_factor=2, scale_window=2), 0.5),
]


def _parity(settings):
    """The first setting per engine in the default suite (about 6 s each); the rest in CI's slow session."""
    return [settings[0]] + [pytest.param(*setting, marks=pytest.mark.slow) for setting in settings[1:]]


@pytest.mark.parametrize("engine", ["cell", "functional"])
@pytest.mark.parametrize("setting,p", _parity(SETTINGS))
def test_scaler_equals_todays_deepspeed_over_2000_random_overflows(setting, p, engine):
    from lsexp.strategies.dynamic_hysteresis import HysteresisLossScaleManager

    configure()
    for seed in (0, 1, 2):
        flags = np.random.default_rng(seed).random(2000) < p
        column, _ = columns(HysteresisLossScaleManager(**setting), flags, engine)  # fresh counters
        expected = scale_column(flags, **setting)
        assert column == expected, f"seed {seed}"
        moves = np.diff(np.log2(expected))
        assert (moves > 0).any() and (moves < 0).any()


def test_todays_deepspeed_grows_one_clean_step_later_than_the_earlier_rule():
    """Window 3, hysteresis 2, overflows at steps 3-4: the second backs off to 512; the earlier rule grew
    back after the 3rd clean step (1024 at step 8), today's after the 4th (512 at step 8, 1024 at 9)."""
    from lsexp.strategies.dynamic_hysteresis import HysteresisLossScaleManager

    configure()
    setting = dict(init_loss_scale=1024.0, hysteresis=2, consecutive_hysteresis=False, min_loss_scale=1.0,
                   max_loss_scale=None, scale_factor=2, scale_window=3)
    flags = [0, 0, 1, 1, 0, 0, 0, 0, 0]
    for engine in ("cell", "functional"):
        column, _ = columns(HysteresisLossScaleManager(**setting), flags, engine)
        assert column == scale_column(flags, **setting)
        assert column[4 - 1] == 1024 and column[5 - 1] == 512
        assert column[8 - 1] == 512 and column[9 - 1] == 1024
        # from the start too: the first growth uses 2048 from step 5, not from step 4
        column, _ = columns(HysteresisLossScaleManager(**setting), [0] * 6, engine)
        assert column == [1024.0] * 4 + [2048.0] * 2
    # Megatron's rule, the earlier one, on the same flags
    megatron = dict(initial_scale=1024.0, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                    growth_interval=3, hysteresis=2)
    assert megatron_scale_column(flags, **megatron)[8 - 1] == 1024


MEGATRON = [  # (settings, overflow probability)
    (dict(initial_scale=2.0**16, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=10,
          hysteresis=2), 0.15),
    (dict(initial_scale=2.0**10, min_scale=4.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=3,
          hysteresis=1), 0.2),
    (dict(initial_scale=2.0**20, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=50,
          hysteresis=3), 0.01),
    (dict(initial_scale=2.0**8, min_scale=2.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=1,
          hysteresis=4), 0.5),
]


@pytest.mark.parametrize("engine", ["cell", "functional"])
@pytest.mark.parametrize("setting,p", _parity(MEGATRON))
def test_megatron_equals_megatrons_dynamic_grad_scaler_over_2000_random_overflows(setting, p, engine):
    from lsexp.strategies.dynamic_hysteresis import MegatronGradScalerManager

    configure()
    for seed in (0, 1, 2):
        flags = np.random.default_rng(seed).random(2000) < p
        column, _ = columns(MegatronGradScalerManager(**setting), flags, engine)
        expected = megatron_scale_column(flags, **setting)
        assert column == expected, f"seed {seed}"
        moves = np.diff(np.log2(expected))
        assert (moves > 0).any() and (moves < 0).any()


def test_megatron_trains_under_both_engines_and_refuses_bad_factors(train_run):
    from conftest import compose_cfg
    from lsexp.config.errors import ConfigError
    from lsexp.preflight import validate

    setting = dict(initial_scale=1024.0, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                   growth_interval=4, hysteresis=2)
    common = ["model=mlp", "amp=O0", "loss_scale=megatron", "inject.overflow_steps=[3,4,9]",
              "train.max_steps=16"] + [f"loss_scale.{k}={v}" for k, v in setting.items()]
    _, cell, _ = train_run("engine=cell", *common)
    _, functional, _ = train_run("engine=functional", *common)
    assert cell == functional
    assert [r["loss_scale"] for r in cell] == megatron_scale_column([r["overflow"] for r in cell], **setting)
    assert cell[-1]["skipped_steps"] == 3
    for override, message in [("loss_scale.backoff_factor=1.5", "loss_scale.backoff_factor=1.5: must lie "
                                                                 "between 0 and 1"),
                              ("loss_scale.growth_factor=1", "loss_scale.growth_factor=1.0: must be > 1"),
                              ("loss_scale.min_scale=1e10",
                               "loss_scale.min_scale=10000000000.0: must be <=")]:
        with pytest.raises(ConfigError) as err:
            validate(compose_cfg("loss_scale=megatron", override))
        assert len(err.value.problems) == 1 and err.value.problems[0].startswith(message), err.value.problems


def test_the_random_sequences_reach_the_floor_and_the_cap():
    reached = {"floor": 0, "cap": 0}
    for setting, p in SETTINGS:
        for seed in (0, 1, 2):
            column = scale_column(np.random.default_rng(seed).random(1000) < p, **setting)
            reached["floor"] += setting["min_loss_scale"] in column
            reached["cap"] += setting["max_loss_scale"] in column
    assert reached["floor"] >= 3 and reached["cap"] >= 3, reached


TRAIN_SETTING = dict(init_loss_scale=2.0**10, hysteresis=2, consecutive_hysteresis=False, min_loss_scale=1.0,
                     max_loss_scale=2.0**13, scale_factor=2, scale_window=20)


def _overrides(setting):
    return ["loss_scale=dynamic_hysteresis"] + [
        f"loss_scale.{k}={'null' if v is None else str(v).lower()}" for k, v in setting.items()]


@pytest.mark.slow  # the parity tests hold the rule step for step; the default suite stays under 10 minutes
def test_scale_column_of_a_1000_step_run_equals_deepspeed(train_run):
    # amp=O0 computes in float32, so the injected overflows are the only ones: the flags are known.
    # engine=functional runs the same state machine (HysteresisLossScaler); test_engines holds it to this one.
    steps = sorted(int(s) for s in np.flatnonzero(np.random.default_rng(7).random(1000) < 0.1) + 1)
    summary, rows, _ = train_run("model=mlp", "train.epochs=40", "train.max_steps=1000",
                                 f"inject.overflow_steps=[{','.join(map(str, steps))}]",
                                 *_overrides(TRAIN_SETTING))
    flags = [r["overflow"] for r in rows]
    assert len(rows) == 1000 and [r["step"] for r in rows if r["overflow"]] == steps
    assert [r["loss_scale"] for r in rows] == scale_column(flags, **TRAIN_SETTING)
    assert summary["skipped_steps"] == len(steps)  # every overflow skips, hysteresis only delays the back-off
    assert summary["final_loss_scale"] == scale_column(flags + [0], **TRAIN_SETTING)[-1]


@pytest.mark.parametrize("engine", ["cell", "functional"])
def test_hysteresis_2_skips_both_overflows_and_backs_off_only_after_the_second(train_run, engine):
    _, rows, _ = train_run(f"engine={engine}", "amp=O2", "loss_scale=dynamic_hysteresis",
                           "loss_scale.hysteresis=2", "inject.overflow_steps=[3,4]", "train.max_steps=6")
    scale = [r["loss_scale"] for r in rows]
    assert [r["overflow"] for r in rows] == [0, 0, 1, 1, 0, 0]
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 2, 2, 2]  # the update is skipped at both
    assert scale[3] == scale[2] == 2.0**16  # unchanged after step 3
    assert scale[4] == scale[3] / 2  # backed off after the second


# the cell engine's resume is in the default suite (test_resumed_run_continues_the_scale_history_exactly)
@pytest.mark.parametrize("engine", [pytest.param("cell", marks=pytest.mark.slow),
                                    pytest.param("functional", marks=pytest.mark.slow)])
def test_resumed_hysteresis_run_has_the_straight_runs_history(train_run, engine):
    # An overflow before the checkpoint uses up one unit of hysteresis, so the one after it backs off
    # only if the resumed run kept the counters; growth every 7 steps needs the iteration counters too.
    common = [f"engine={engine}", "amp=O2", "loss_scale=dynamic_hysteresis", "loss_scale.scale_window=7",
              "loss_scale.init_loss_scale=1024"]
    inject = "inject.overflow_steps=[9,14,15]"
    _, straight, _ = train_run(*common, inject, "train.max_steps=24")
    _, first, part = train_run(*common, "inject.overflow_steps=[9]", "train.max_steps=10",
                               "train.checkpoint=true")
    summary, second, _ = train_run(*common, inject, "train.max_steps=24",
                                   f"train.resume={part / 'checkpoint.ckpt'}")
    assert summary["resumed_from_step"] == 10
    assert first + second == straight
    scales = [r["loss_scale"] for r in straight]
    assert scales[14] == scales[13] / 2, ("the overflow at step 14 backs off because step 9's used up "
                                          "the hysteresis")
    setting = dict(TRAIN_SETTING, init_loss_scale=1024.0, max_loss_scale=2.0**24, scale_window=7)
    assert scales == scale_column([r["overflow"] for r in straight], **setting)
    assert max(scales) > 1024 and min(scales) < 1024


def test_dynamic_hysteresis_validation_names_the_key_and_the_fix():
    from conftest import compose_cfg
    from lsexp.config.errors import ConfigError
    from lsexp.preflight import validate

    for overrides, key in [
        (["loss_scale.hysteresis=0"], "loss_scale.hysteresis=0"),
        (["loss_scale.min_loss_scale=8", "loss_scale.init_loss_scale=4"], "loss_scale.init_loss_scale=4.0"),
        (["loss_scale.max_loss_scale=2", "loss_scale.min_loss_scale=4"], "loss_scale.max_loss_scale=2.0"),
        (["loss_scale.init_loss_scale=0.5"], "loss_scale.init_loss_scale=0.5"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate(compose_cfg("loss_scale=dynamic_hysteresis", *overrides))
        assert len(err.value.problems) == 1 and err.value.problems[0].startswith(key), err.value.problems
