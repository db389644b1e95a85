"""Training recipes (issue 19): every optimizer under every strategy, learning-rate schedules that hold
or advance on a skipped update, and clipping of the unscaled gradients, in real MindSpore steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import compose_cfg, run_cli
from helpers.scalers import configure

OPTIONS = ("none", "fixed_drop", "fixed_nodrop", "dynamic", "dynamic_hysteresis", "dynamic_seed_blog")
OPTIMIZERS = ("momentum", "sgd", "adam", "adamw", "lamb")
ENGINES = ("cell", "functional")


def parameters(run_dir):
    """The network's weights and biases, and the optimizer's state of them, from the run's checkpoint."""
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(run_dir / "checkpoint.ckpt")).items()
            if k.endswith(("weight", "bias"))}


def relative_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(b[k]))), 1e-12)) for k in a)


@pytest.mark.parametrize("optimizer,engine", [
    ("momentum", "cell"), pytest.param("momentum", "functional", marks=pytest.mark.slow),
    pytest.param("adamw", "cell", marks=pytest.mark.slow),
    pytest.param("adamw", "functional", marks=pytest.mark.slow)])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_clipping_sees_the_unscaled_gradients_under_every_strategy(train_run, optimizer, engine):
    # 0.15, not the 0.5: the default model's unscaled global norms run 0.09-0.27 here, so 0.5
    # would clip no step and the test could only catch clipping of the scaled gradients
    common = ("amp=O0", "train.max_steps=20", "train.checkpoint=true", "optimizer.clip_grad_norm=0.15",
              f"optimizer={optimizer}", f"engine={engine}")
    runs = {o: train_run(f"loss_scale={o}", *common) for o in OPTIONS}
    _, base_rows, base_dir = runs["none"]
    base = parameters(base_dir)
    assert sum(r["clipped"] for r in base_rows) > 0, "clip_grad_norm=0.15 must clip some of these steps"
    for option, (summary, rows, out) in runs.items():
        assert summary["skipped_steps"] == 0 and not summary["overflow_steps"], option
        assert [r["clipped"] for r in rows] == [r["clipped"] for r in base_rows], option
        assert np.allclose([r["global_norm"] for r in rows], [r["global_norm"] for r in base_rows],
                           rtol=1e-5), option
        assert relative_gap(parameters(out), base) < 1e-6, option


def warmup_linear_lr(step: int, lr=0.01, warmup=10, total=20, end=0.0) -> float:
    """transformers' get_linear_schedule_with_warmup at the 0-based update index `step`."""
    if step < warmup:
        return lr * step / warmup
    return end + (lr - end) * max(0.0, (total - step) / (total - warmup))


@pytest.mark.parametrize("engine", ["cell", pytest.param("functional", marks=pytest.mark.slow)])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_a_skipped_update_holds_the_schedule_or_it_advances(train_run, engine):
    # from 2^10, not dynamic's 2^24, whose float16 overflows in the first steps would skip updates too
    common = ("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024", "train.max_steps=20",
              "lr_schedule=warmup_linear", "lr_schedule.warmup_steps=10", f"engine={engine}")
    _, plain, _ = train_run(*common)
    assert plain[-1]["skipped_steps"] == 0
    _, held, _ = train_run(*common, "inject.overflow_steps=[5,6,7]")
    _, advanced, _ = train_run(*common, "inject.overflow_steps=[5,6,7]", "lr_schedule.on_skip=advance")
    lr = {name: [r["lr"] for r in rows] for name, rows in
          (("plain", plain), ("held", held), ("advanced", advanced))}
    assert np.allclose(lr["plain"], [warmup_linear_lr(s) for s in range(20)], rtol=1e-6, atol=1e-9)
    assert held[-1]["skipped_steps"] == 3 and advanced[-1]["skipped_steps"] == 3
    assert math.isclose(lr["held"][19], lr["plain"][16], rel_tol=1e-6)  # step 20 is the 17th update
    assert math.isclose(lr["advanced"][19], lr["plain"][19], rel_tol=1e-6)
    # a skipped step shows the rate it would have used: held, the same as the step after it
    assert lr["held"][4:8] == [lr["plain"][4]] * 4
    assert lr["advanced"] == pytest.approx(lr["plain"], rel=1e-6)


def trained(summary, rows):
    """Twenty finite steps, and updates that were applied (the synthetic data's random labels give a
    loss near ln 10 that 20 steps do not lower, so a falling loss is no test here)."""
    assert not summary["diverged"] and len(rows) == 20
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert summary["skipped_steps"] < 20 and len({r["loss"] for r in rows}) > 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("option", ("none", "fixed_drop"))
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_four_micro_batches_of_8_are_one_batch_of_32(train_run, option, engine):
    common = ("amp=O0", f"loss_scale={option}", f"engine={engine}", "train.max_steps=10",
              "train.checkpoint=true")
    _, rows, micro = train_run(*common, "train.accumulate_steps=4", "dataset.batch_size=8")
    _, whole_rows, whole = train_run(*common, "dataset.batch_size=32")
    assert len(rows) == len(whole_rows) == 10
    assert np.allclose([r["loss"] for r in rows], [r["loss"] for r in whole_rows], rtol=1e-5)
    assert relative_gap(parameters(micro), parameters(whole)) < 1e-5


@pytest.mark.parametrize("engine", ENGINES)
def test_an_overflow_in_one_micro_batch_skips_its_whole_step_and_backs_off_once(train_run, engine):
    summary, rows, _ = train_run("amp=O2", "loss_scale=dynamic", "loss_scale.init_loss_scale=1024",
                                 f"engine={engine}", "train.accumulate_steps=4", "dataset.batch_size=8",
                                 "train.max_steps=5", "inject.overflow_steps=[7]")  # step 2's 3rd
    assert [r["overflow"] for r in rows] == [0, 1, 0, 0, 0] and summary["skipped_steps"] == 1
    assert [r["loss_scale"] for r in rows] == [1024.0, 1024.0, 512.0, 512.0, 512.0]


def test_accumulation_counts_optimizer_steps():
    from lsexp.config.facts import steps_per_epoch

    cfg = compose_cfg("train.accumulate_steps=4", "dataset.batch_size=8")
    assert steps_per_epoch(cfg, 1000) == 1000 // 32


@pytest.mark.parametrize("optimizer, option, engine", [
    ("momentum", "fixed_nodrop", "cell"),
    ("sgd", "dynamic", "functional"),
    ("adam", "fixed_drop", "cell"),
    ("adamw", "fixed_nodrop", "functional"),
    ("adam", "dynamic_hysteresis", "functional"),
    ("adamw", "none", "cell"),
    ("sgd", "dynamic_seed_blog", "cell"),
    ("lamb", "fixed_nodrop", "cell"),
    ("lamb", "dynamic", "functional"),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_every_optimizer_and_every_strategy_trains(train_run, optimizer, option, engine):
    summary, rows, _ = train_run(f"optimizer={optimizer}", f"loss_scale={option}", f"engine={engine}",
                                 "amp=O2", "train.max_steps=20", "lr_schedule=warmup_cosine")
    trained(summary, rows)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_strategy_and_engine_trains(train_run, optimizer, option, engine):
    summary, rows, _ = train_run(f"optimizer={optimizer}", f"loss_scale={option}", f"engine={engine}",
                                 "amp=O2", "train.max_steps=20")
    trained(summary, rows)


def test_optimizers_without_loss_scale_have_no_such_key():
    assert "loss_scale" not in compose_cfg("optimizer=adamw").optimizer
    assert "loss_scale" not in compose_cfg("optimizer=lamb").optimizer
    assert compose_cfg("optimizer=adam").optimizer.loss_scale is None


def test_lamb_on_cpu_equals_mindspores_gpu_kernel_step_for_step():
    # nn.Lamb's fused primitive has no CPU kernel; CpuLamb writes it out, checked here against a
    # transcription of the GPU kernel (tests/helpers/lamb_gpu_kernel.py), with weight decay and its filter
    from mindspore import Tensor, nn

    from helpers.lamb_gpu_kernel import lamb_step
    from lsexp.optimizers import param_groups
    from lsexp.optimizers.lamb import CpuLamb

    configure()
    net = nn.SequentialCell(nn.Dense(6, 5), nn.LayerNorm((5,)), nn.Dense(5, 3))
    params = net.trainable_params()
    # weights that large put the first layer's trust ratio above the kernel's clamp at 10
    params[0].set_data(Tensor(params[0].asnumpy() * 100))
    optimizer = CpuLamb(param_groups(params, 0.01), learning_rate=0.02, beta1=0.8, beta2=0.95, eps=1e-6)
    rng = np.random.default_rng(0)
    state = {p.name: (p.asnumpy().copy(), np.zeros(p.shape, np.float32), np.zeros(p.shape, np.float32))
             for p in params}
    # a zero gradient too: the trust ratio's w_norm > 0, g_hat_norm = 0 branch at a zero-initialised bias
    grads_seq = [[rng.normal(size=p.shape).astype(np.float32) * (0 if i == 0 and "bias" in p.name else 1)
                  for p in params] for i in range(6)]
    for step, grads in enumerate(grads_seq, start=1):
        optimizer(tuple(Tensor(g) for g in grads))
        for p, g in zip(params, grads):
            var, m, v = state[p.name]
            decay = 0.0 if p.name.endswith(("bias", "beta", "gamma")) else 0.01
            state[p.name] = lamb_step(var, m, v, g, 0.02, 0.8, 0.95, 1e-6, decay, step)
        for p in params:
            np.testing.assert_allclose(p.asnumpy(), state[p.name][0], rtol=1e-6, atol=1e-7, err_msg=p.name)


def test_decay_filter_leaves_biases_and_norm_parameters_undecayed():
    from mindspore import nn

    from lsexp.optimizers import param_groups

    net = nn.SequentialCell(nn.Dense(4, 4), nn.LayerNorm((4,)), nn.Dense(4, 2))
    decay, rest, order = param_groups(net.trainable_params(), 0.01)
    assert [p.name.rsplit(".", 1)[-1] for p in decay["params"]] == ["weight", "weight"]
    assert sorted(p.name.rsplit(".", 1)[-1] for p in rest["params"]) == ["beta", "bias", "bias", "gamma"]
    assert decay["weight_decay"] == 0.01 and rest["weight_decay"] == 0.0
    assert order["order_params"] == net.trainable_params()


@pytest.mark.parametrize("override, says", [
    ("optimizer.clip_grad_norm=0", "optimizer.clip_grad_norm=0"),
    ("optimizer.clip_grad_norm=-1", "optimizer.clip_grad_norm=-1"),
    ("lr_schedule.on_skip=sometimes", "lr_schedule.on_skip=sometimes"),
    ("lr_schedule=warmup_linear lr_schedule.warmup_steps=20", "lr_schedule.warmup_steps=20"),
    ("lr_schedule=warmup_cosine lr_schedule.total_steps=10", "lr_schedule.total_steps=10"),
    ("optimizer=adam optimizer.beta2=1.5", "optimizer.beta2=1.5"),
    ("train.accumulate_steps=0", "train.accumulate_steps=0"),
    ("train.accumulate_steps=4 dataset.num_samples=64", "train.accumulate_steps=4: more micro-batches"),
    ("train.accumulate_steps=2 train.max_steps=3 inject.overflow_steps=[7]",
     "micro-batch(s) [7] are outside this run's micro-batches 1..6"),
])
def test_a_bad_recipe_is_one_problem_naming_its_key(override, says):
    from lsexp.config.errors import ConfigError
    from lsexp.preflight import validate

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*override.split(), "train.max_steps=20"
                             if "max_steps" not in override else "train.progress=false"))
    assert len(err.value.problems) == 1 and says in err.value.problems[0], err.value.problems


def test_a_bad_recipe_on_the_command_line_is_one_line_and_exit_2_with_nothing_written(tmp_path):
    out = run_cli("lr_schedule=warmup_linear", "lr_schedule.warmup_steps=20", "train.max_steps=20",
                  cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "lsexp: config error: lr_schedule.warmup_steps=20: the warm-up must end before the schedule's "
        "20 steps; lower it below 20"]
    assert list(tmp_path.iterdir()) == []


def test_a_key_the_optimizer_class_does_not_take_is_refused_when_hydra_composes():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg("optimizer=adamw", "optimizer.loss_scale=8")
    assert "Key 'loss_scale' not in 'AdamWeightDecayConfig'" in str(err.value.__cause__)
