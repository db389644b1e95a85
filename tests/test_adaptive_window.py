"""loss_scale=adaptive_window: MindFormers' AdaptiveLossScaleUpdateCell, in MindSpore 2.10's compiled step,
under both engines, against the numpy transcription of mindformers 2.1.0's file."""

import numpy as np
import pytest

from helpers.mindformers_adaptive_loss_scale import get_window_list, scale_and_window_columns
from helpers.scalers import columns, configure

DEFAULTS = dict(loss_scale_value=2.0**16, scale_factor=2, scale_window=20, max_scale_window=1000,
                min_scale_window=20)
# (settings, overflow rate): rates from 0.1% to 20%; short windows so that 2 000 steps reach the
# longest window, and the drop to 1 and the climb back
SETTINGS = [
    (DEFAULTS, 0.001),
    (dict(DEFAULTS, max_scale_window=300, min_scale_window=4, scale_window=4), 0.01),
    (dict(DEFAULTS, max_scale_window=60, min_scale_window=2, scale_window=2), 0.05),
    (dict(DEFAULTS, loss_scale_value=2.0**10, max_scale_window=40, min_scale_window=3, scale_window=3,
          scale_factor=4), 0.2),
    (dict(DEFAULTS, max_scale_window=200, min_scale_window=10, scale_window=50), 0.1),  # 50: not in the list
    (dict(DEFAULTS, loss_scale_value=1.0, max_scale_window=10, min_scale_window=2, scale_window=2), 0.01),
]
SEEDS = (0, 1, 2)
# one setting per engine in the default suite (about 8 s each); the rest in CI's slow session
PARITY = [SETTINGS[0]] + [pytest.param(*setting, marks=pytest.mark.slow) for setting in SETTINGS[1:]]


def _columns(engine):
    def run(flags, setting):
        from lsexp.strategies.adaptive_window import AdaptiveLossScaleManager

        scales, state = columns(AdaptiveLossScaleManager(**setting), flags, engine, ("scale_window",))
        return scales, state["scale_window"]

    return run


_cell_columns, _scaler_columns = _columns("cell"), _columns("functional")


@pytest.mark.parametrize("max_window,min_window", [(1000, 20), (300, 4), (60, 2), (40, 3), (200, 10),
                                                   (2000, 100), (1000, 30), (150, 7)])
def test_window_list_is_mindformers(max_window, min_window):
    from lsexp.strategies.adaptive_window import window_list

    assert window_list(max_window, min_window) == get_window_list(max_window, min_window)


def test_the_default_windows_are_mindformers_documented_list():
    from lsexp.strategies.adaptive_window import window_list

    assert window_list(1000, 20) == [20, 30, 40, 50, 100, 200, 500, 1000]


@pytest.mark.parametrize("columns", [_cell_columns, _scaler_columns], ids=["cell", "functional"])
@pytest.mark.parametrize("setting,rate", PARITY)
def test_scale_and_window_equal_mindformers_over_2000_random_overflows(setting, rate, columns):
    configure()
    for seed in SEEDS:
        flags = np.random.default_rng(seed).random(2000) < rate
        scales, windows = columns(flags, setting)
        expected_scales, expected_windows = scale_and_window_columns(flags, **setting)
        assert scales == expected_scales, f"seed {seed}"
        assert windows == expected_windows, f"seed {seed}"


def test_the_random_sequences_reach_every_window_move():
    """What the parity test covers: the longest window, the drop to 1, the climb back from it, and a
    scale_window outside the list."""
    reached = {"longest": 0, "one": 0, "climb_from_one": 0}
    for setting, rate in SETTINGS:
        longest = get_window_list(setting["max_scale_window"], setting["min_scale_window"])[-1]
        for seed in SEEDS:
            _, windows = scale_and_window_columns(np.random.default_rng(seed).random(2000) < rate, **setting)
            reached["longest"] += longest in windows
            reached["one"] += 1 in windows
            reached["climb_from_one"] += any(a == 1 and b > 1 for a, b in zip(windows, windows[1:]))
    assert all(count >= 3 for count in reached.values()), reached


@pytest.mark.parametrize("columns", [_cell_columns, _scaler_columns], ids=["cell", "functional"])
def test_the_edge_cases(columns):
    configure()
    # three overflows in a row at index 0: the window is already the shortest and stays
    setting = dict(DEFAULTS, max_scale_window=60, min_scale_window=2, scale_window=2)
    flags = [0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0]
    scales, windows = columns(flags, setting)
    assert (scales, windows) == scale_and_window_columns(flags, **setting)
    assert set(windows) == {2} and scales[4] == 2.0**13
    # the last window is reached and kept: growth never moves past it
    setting = dict(DEFAULTS, max_scale_window=4, min_scale_window=2, scale_window=4)  # windows [2, 3, 4]
    flags = [0] * 80
    scales, windows = columns(flags, setting)
    assert (scales, windows) == scale_and_window_columns(flags, **setting)
    # grown at steps 4, 8, ..., 76
    assert windows[0] == 4 and set(windows) == {4} and scales[-1] == 2.0**(16 + 19)
    setting = dict(setting, scale_window=2)
    scales, windows = columns(flags, setting)
    assert (scales, windows) == scale_and_window_columns(flags, **setting)
    assert windows[0] == 2 and windows[-1] == 4 and 3 in windows
    # a scale_window the list lacks starts at the shortest window
    setting = dict(DEFAULTS, scale_window=25)
    flags = [0] * 30
    scales, windows = columns(flags, setting)
    assert (scales, windows) == scale_and_window_columns(flags, **setting)
    assert windows[0] == 20 and scales[21] == 2.0**17


def _overrides(setting):
    return ["loss_scale=adaptive_window"] + [f"loss_scale.{k}={v}" for k, v in setting.items()]


TRAIN = dict(loss_scale_value=1024.0, scale_factor=2, scale_window=3, max_scale_window=12, min_scale_window=3)


@pytest.mark.parametrize("engine", ["cell", "functional"])
def test_a_training_runs_scale_column_equals_mindformers(train_run, engine):
    # amp=O0 computes in float32, so the injected overflows are the only ones: the flags are known.
    steps = [5, 6, 7, 30, 31, 33, 70, 71, 72, 73, 74, 75, 76, 77, 78, 120, 121, 122]
    summary, rows, _ = train_run(f"engine={engine}", "model=mlp", "amp=O0", "train.epochs=20",
                                 "train.max_steps=200",
                                 f"inject.overflow_steps=[{','.join(map(str, steps))}]",
                                 *_overrides(TRAIN))
    assert [r["step"] for r in rows if r["overflow"]] == steps
    scales, windows = scale_and_window_columns([r["overflow"] for r in rows], **TRAIN)
    assert [r["loss_scale"] for r in rows] == scales
    assert {3, 4, 6, 7, 9} <= set(windows) and 1 in windows  # it moved along the list and dropped to 1
    assert summary["skipped_steps"] == len(steps)


# both engines in CI's slow session: the default suite stays under 10 minutes
@pytest.mark.parametrize("engine", [pytest.param("cell", marks=pytest.mark.slow),
                                    pytest.param("functional", marks=pytest.mark.slow)])
def test_a_resumed_run_has_the_straight_runs_history(train_run, engine):
    # the checkpoint falls where the window has moved and the counters are mid-way
    common = [f"engine={engine}", "amp=O2", "model=mlp", *_overrides(TRAIN)]
    inject = "inject.overflow_steps=[9,10,11,40,41]"
    _, straight, _ = train_run(*common, inject, "train.max_steps=60")
    _, first, part = train_run(*common, "inject.overflow_steps=[9,10,11]", "train.max_steps=30",
                               "train.checkpoint=true")
    summary, second, _ = train_run(*common, inject, "train.max_steps=60",
                                   f"train.resume={part / 'checkpoint.ckpt'}")
    assert summary["resumed_from_step"] == 30
    assert first + second == straight
    scales, windows = scale_and_window_columns([r["overflow"] for r in straight], **TRAIN)
    assert [r["loss_scale"] for r in straight] == scales
    assert windows[29] != windows[0]


@pytest.mark.parametrize("override,message", [
    ("loss_scale.max_scale_window=20", "loss_scale.max_scale_window=20: must be greater than "
                                       "loss_scale.min_scale_window=20"),
    ("loss_scale.min_scale_window=0", "loss_scale.min_scale_window=0: must be >= 1"),
    ("loss_scale.loss_scale_value=0.5", "loss_scale.loss_scale_value=0.5: must be a finite number >= 1"),
    ("loss_scale.scale_factor=1", "loss_scale.scale_factor=1: must be > 1"),
    ("loss_scale.scale_window=0", "loss_scale.scale_window=0: must be >= 1"),
])
def test_bad_windows_are_refused_in_one_line(override, message):
    from conftest import compose_cfg
    from lsexp.config.errors import ConfigError
    from lsexp.preflight import validate

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg("loss_scale=adaptive_window", override))
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(message)
