"""loss_scale=amax_history: the scale predicted from the history of the gradients' amax, in MindSpore's
compiled step under both engines, against the rule computed in numpy from the run's own grad_amax column."""

import math

import numpy as np
import pytest

FP16_MAX = np.float32(65504.0)


def expected_scales(rows, init_loss_scale, history_len, amax_compute_algo, margin, backoff_factor,
                    min_loss_scale, max_loss_scale):
    """The scale each step uses, from the rows' overflow flags and grad_amax: docs/strategies.md's rule,
    with the power of two taken from the float32 exponent (frexp)."""
    scale, history, ceiling, calm, out = init_loss_scale, [], max_loss_scale, history_len, []
    for row in rows:
        out.append(scale)
        if row["overflow"]:
            scale = max(scale / backoff_factor, min_loss_scale)
            ceiling, calm = scale, 0
            continue
        history = (history + [np.float32(row["grad_amax"])])[-history_len:]
        calm += 1
        if calm >= history_len:
            ceiling = max_loss_scale
        agg = max(history) if amax_compute_algo == "max" else history[-1]
        ratio = FP16_MAX / agg if agg > 0 else np.float32(np.inf)
        predicted = max_loss_scale if np.isinf(ratio) else 2.0 ** (np.frexp(ratio)[1] - 1 - margin)
        scale = min(max(predicted, min_loss_scale), max_loss_scale, ceiling)
    return out


DEFAULTS = dict(init_loss_scale=65536.0, history_len=16, amax_compute_algo="max", margin=0,
                backoff_factor=2.0, min_loss_scale=1.0, max_loss_scale=2.0**24)
SETTINGS = {
    # a short history, so the ceiling set by each burst lifts within the run
    "max": dict(DEFAULTS, history_len=8, margin=1),
    # the cap below what the gradients allow, so the prediction is clipped
    "most_recent": dict(DEFAULTS, history_len=4, amax_compute_algo="most_recent", max_loss_scale=2.0**18),
}
INJECTED = [1, 5, 6, 7, 30, 31, 70, 120, 121, 122, 123, 160]


def _overrides(setting):
    return ["loss_scale=amax_history"] + [f"loss_scale.{k}={v}" for k, v in setting.items()]


# most_recent under both engines in CI's slow session (about 15 s each), to keep the default suite short
@pytest.mark.parametrize("engine", ["cell", "functional"])
@pytest.mark.parametrize("name", ["max", pytest.param("most_recent", marks=pytest.mark.slow)])
def test_the_scale_is_predicted_from_the_amax_history_step_for_step(train_run, engine, name):
    # amp=O0 computes in float32, so the injected overflows are the only ones
    setting = SETTINGS[name]
    summary, rows, _ = train_run(f"engine={engine}", "model=mlp", "amp=O0", "train.epochs=20",
                                 "train.max_steps=200",
                                 f"inject.overflow_steps=[{','.join(map(str, INJECTED))}]",
                                 *_overrides(setting))
    assert [r["step"] for r in rows if r["overflow"]] == INJECTED
    assert summary["skipped_steps"] == len(INJECTED)
    scales = [r["loss_scale"] for r in rows]
    assert scales == expected_scales(rows, **setting)
    assert scales[0] == setting["init_loss_scale"]  # nothing measured yet
    for step in INJECTED:
        # no amax from an overflowed step, and the next step uses the scale halved
        assert math.isnan(rows[step - 1]["grad_amax"])
        assert scales[step] == max(scales[step - 1] / 2, 1.0)
    clean = [r["grad_amax"] for r in rows if not r["overflow"]]
    assert all(0 < a < 10 for a in clean)
    if name == "most_recent":  # the cap holds the prediction once the ceiling has lifted
        assert max(scales) == 2.0**18 and scales[-1] == 2.0**18
    else:  # a ceiling was in force after a burst: a lower scale than the history alone predicts
        assert any(s < scales[-1] for s in scales[8:30])


def test_the_power_of_two_is_the_float32_exponent_near_powers_of_two():
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from lsexp.strategies.amax_history import AmaxHistoryLossScaleManager

    # one entry, no clipping in range: each clean step's scale is 2^floor(log2(65504 / amax)) alone
    cell = AmaxHistoryLossScaleManager(history_len=1, min_loss_scale=2.0**-30,
                                       max_loss_scale=2.0**60).get_update_cell()
    scale = Parameter(Tensor(1.0, ms.float32), name="scale")
    powers = np.float32(2.0) ** np.arange(-20, 40, dtype=np.float32)
    ratios = np.concatenate([powers, np.nextafter(powers, np.float32(0)),
                             np.nextafter(powers, np.float32(np.inf)),
                             np.random.default_rng(0).uniform(1e-3, 1e9, 200).astype(np.float32)])
    fp16_max = np.float32(np.finfo(np.float16).max)
    amaxes = fp16_max / ratios
    for amax in amaxes:
        cell(scale, Tensor(False), Tensor(amax))
        ratio = fp16_max / amax  # what the step divides, in float32
        assert float(scale.asnumpy()) == np.ldexp(1.0, np.frexp(ratio)[1] - 1), (amax, ratio)


# both engines in CI's slow session: the default suite stays under 10 minutes
@pytest.mark.parametrize("engine", [pytest.param("cell", marks=pytest.mark.slow),
                                    pytest.param("functional", marks=pytest.mark.slow)])
def test_a_resumed_run_has_the_straight_runs_history(train_run, engine):
    # the checkpoint falls while a ceiling is in force and the history is part full
    setting = dict(DEFAULTS, history_len=8)
    common = [f"engine={engine}", "amp=O2", "model=mlp", *_overrides(setting)]
    inject = "inject.overflow_steps=[9,10,27,40,41]"
    _, straight, _ = train_run(*common, inject, "train.max_steps=60")
    _, first, part = train_run(*common, "inject.overflow_steps=[9,10,27]", "train.max_steps=30",
                               "train.checkpoint=true")
    summary, second, _ = train_run(*common, inject, "train.max_steps=60",
                                   f"train.resume={part / 'checkpoint.ckpt'}")
    assert summary["resumed_from_step"] == 30
    assert _same(first + second, straight)
    assert [r["loss_scale"] for r in straight] == expected_scales(straight, **setting)


def _same(rows, others):
    """Row for row equal, NaN equal to NaN (grad_amax on overflowed steps)."""
    def key(row):
        return {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}

    return [key(r) for r in rows] == [key(r) for r in others]


@pytest.mark.parametrize("override,message", [
    ("loss_scale.history_len=0", "loss_scale.history_len=0: must be >= 1"),
    ("loss_scale.margin=-1", "loss_scale.margin=-1: must be >= 0"),
    ("loss_scale.min_loss_scale=1024", "loss_scale.min_loss_scale=1024.0: must be <= "
                                        "loss_scale.max_loss_scale=512.0"),
    ("loss_scale.amax_compute_algo=mean",
     "loss_scale.amax_compute_algo=mean: must be one of max, most_recent"),
    ("loss_scale.backoff_factor=1", "loss_scale.backoff_factor=1.0: must be > 1"),
    ("loss_scale.init_loss_scale=0.5", "loss_scale.init_loss_scale=0.5: must be a finite number >= 1"),
])
def test_bad_keys_are_refused_in_one_line(override, message):
    from conftest import compose_cfg
    from lsexp.config.errors import ConfigError
    from lsexp.preflight import validate

    extra = ["loss_scale.max_loss_scale=512"] if "min_loss_scale" in override else []
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg("loss_scale=amax_history", override, *extra))
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(message)


def test_a_bad_key_on_the_command_line_is_one_line_exit_2_and_nothing_written(tmp_path):
    from conftest import run_cli

    out = run_cli("loss_scale=amax_history", "loss_scale.margin=-1", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "lsexp: config error: loss_scale.margin=-1: must be >= 0 (powers of two kept free below float16's "
        "largest value); e.g. 0 or 2"]
    assert list(tmp_path.iterdir()) == []
