"""Composition and validation: no MindSpore needed, so these are fast."""

import subprocess
import sys

import pytest

from conftest import compose_cfg, run_cli
from lsexp.config import paths
from lsexp.config.errors import ConfigError
from lsexp.config.facts import known_num_train, total_steps
from lsexp.preflight import validate
from lsexp.strategies import resolve


def strategy(cfg) -> str:
    return resolve(cfg).name


def optimizer_loss_scale(cfg) -> float:
    return resolve(cfg).optimizer_loss_scale


OPTIONS = {
    "model": ["lenet5", "mlp", "resnet"],
    "dataset": ["synthetic", "digits"],
    "amp": ["O0", "O1", "O2", "O3"],
    "loss_scale": ["none", "fixed_drop", "fixed_nodrop", "dynamic", "dynamic_seed_blog", "dynamic_hysteresis",
                   "megatron", "adaptive_window", "amax_history"],
    "optimizer": ["momentum"],
    "device": ["cpu", "auto"],
    "tracking": ["mlflow", "none"],
    "workload": ["lenet5_digits", "resnet_digits", "resnet8_digits", "mlp_digits", "deep_mlp_digits",
                 "transformer_sequence"],
}


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in OPTIONS.items() for o in opts])
def test_every_option_composes_and_validates(group, option):
    validate(compose_cfg(f"{group}={option}"))


@pytest.mark.parametrize("dataset", ["sequence", "text"])
def test_the_transformer_takes_its_task_and_sizes_from_token_data(dataset, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcab" * 500, encoding="utf-8")
    cfg = compose_cfg("model=transformer", f"dataset={dataset}",
                      *([f"dataset.path={text}"] if dataset == "text" else []))
    validate(cfg)
    expected = ("classify", 16, 16, 8) if dataset == "sequence" else ("lm", 3, 3, 64)
    assert (cfg.model.task, cfg.model.vocab_size, cfg.model.num_class, cfg.model.max_len) == expected


def test_every_family_has_its_schema_beside_its_code():
    from lsexp.config import families

    assert set(families.schemas("model")) >= {"lenet5", "mlp", "resnet", "transformer"}
    assert set(families.schemas("dataset")) >= {"synthetic", "digits", "mnist", "cifar10", "image_folder",
                                                "text", "sequence"}
    assert set(families.schemas("loss_scale")) == {"none", "fixed", "dynamic", "dynamic_hysteresis",
                                                   "megatron", "adaptive_window", "amax_history", "per_layer"}
    for group in families.PACKAGES:
        for name, module in families.schemas(group).items():
            # each family has a YAML option that builds on its schema (fixed: fixed_drop and fixed_nodrop)
            options = [p for p in (paths.conf_dir() / group).glob("*.yaml")
                       if f"base_{name}]" in p.read_text()]
            assert options, name
            assert families.of(group, module.SCHEMA._target_) is module


def test_defaults_are_the_seed_first_setup():
    cfg = compose_cfg()
    assert cfg.model._target_ == "lsexp.models.lenet5.LeNet5"
    assert cfg.dataset.num_samples == 1024 and cfg.dataset.batch_size == 32 and cfg.dataset.drop_remainder
    assert cfg.amp.level == "O0"
    assert strategy(cfg) == "fixed_drop"
    assert cfg.loss_scale.loss_scale == 128.0 and cfg.loss_scale.drop_overflow_update is True
    assert cfg.optimizer.learning_rate == 0.01 and cfg.optimizer.momentum == 0.9
    assert cfg.train.epochs == 10 and total_steps(cfg, known_num_train(cfg)) == 320
    assert cfg.device.device_target == "CPU"


def test_strategy_defaults_match_mindspore_managers():
    from mindspore.amp import DynamicLossScaleManager, FixedLossScaleManager

    fixed = FixedLossScaleManager()
    assert compose_cfg().loss_scale.loss_scale == fixed.get_loss_scale()
    dynamic = DynamicLossScaleManager()
    cfg = compose_cfg("loss_scale=dynamic").loss_scale
    assert (cfg.init_loss_scale, cfg.scale_factor, cfg.scale_window) == (
        dynamic.get_loss_scale(), dynamic.scale_factor, dynamic.scale_window)


def test_no_scaling_is_sens_one_and_optimizer_scale_one():
    cfg = compose_cfg("loss_scale=none")
    assert strategy(cfg) == "none" and optimizer_loss_scale(cfg) == 1.0
    assert problems("loss_scale=none", "optimizer.loss_scale=8") == [
        "optimizer.loss_scale=8.0 with loss_scale=none: the train step already divides the gradients by the "
        "scale, so they would be divided twice; set optimizer.loss_scale=1 or leave it unset"]


def test_optimizer_loss_scale_follows_the_strategy():
    assert optimizer_loss_scale(compose_cfg("loss_scale=fixed_nodrop")) == 1024.0
    assert optimizer_loss_scale(compose_cfg("loss_scale=fixed_nodrop", "loss_scale.loss_scale=64")) == 64.0
    assert optimizer_loss_scale(compose_cfg("loss_scale=fixed_drop")) == 1.0
    assert optimizer_loss_scale(compose_cfg("loss_scale=dynamic")) == 1.0


def problems(*overrides):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    return err.value.problems


@pytest.mark.parametrize("overrides,key", [
    (["loss_scale=fixed_nodrop", "optimizer.loss_scale=1"], "optimizer.loss_scale=1.0"),
    (["loss_scale=fixed_drop", "optimizer.loss_scale=128"], "optimizer.loss_scale=128.0"),
    (["loss_scale=dynamic", "optimizer.loss_scale=2"], "optimizer.loss_scale=2.0"),
    (["loss_scale=dynamic", "loss_scale.scale_factor=1"], "loss_scale.scale_factor=1"),
    (["loss_scale=dynamic", "loss_scale.scale_window=0"], "loss_scale.scale_window=0"),
    (["loss_scale=dynamic", "loss_scale.init_loss_scale=0"], "loss_scale.init_loss_scale=0"),
    (["loss_scale.loss_scale=-1"], "loss_scale.loss_scale=-1"),
    (["loss_scale.loss_scale=inf"], "loss_scale.loss_scale=inf"),
    (["amp.level=O4"], "amp.level=O4"),
    (["dataset.batch_size=0"], "dataset.batch_size=0"),
    (["train.epochs=0"], "train.epochs=0"),
    (["train.max_steps=0"], "train.max_steps=0"),
    (["train.mode=eager"], "train.mode=eager"),
    (["train.objective=accuracy"], "train.objective=accuracy"),
    (["inject.overflow_steps=[0,3]"], "inject.overflow_steps=[0, 3]"),
    (["train.max_steps=8", "inject.overflow_steps=[9]"], "inject.overflow_steps=[9]"),
    (["train.resume=/no/such.ckpt"], "train.resume=/no/such.ckpt"),
    (["device=gpu"], "device.device_target=GPU"),
    (["device=ascend"], "device.device_target=Ascend"),
    (["device.onednn_max_cpu_isa=AVX9"], "device.onednn_max_cpu_isa=AVX9"),
    (["device.affinity_cpu_list=[4096]"], "device.affinity_cpu_list=[4096]"),
    (["tracking.uri=mlflow.db"], "tracking.uri=mlflow.db"),
])
def test_each_rule_names_key_and_value(overrides, key):
    found = problems(*overrides)
    assert len(found) == 1 and found[0].startswith(key), found


def test_all_problems_are_reported_at_once():
    found = problems("loss_scale=dynamic", "loss_scale.scale_factor=0", "loss_scale.scale_window=0",
                     "amp.level=O9", "train.epochs=0", "device=gpu")
    assert len(found) == 5
    assert "lsexp: config error: amp.level=O9" in str(ConfigError(found))


def test_dynamic_only_keys_are_rejected_on_fixed_strategies():
    # The seed passed dynamic arguments by position; the schema refuses keys a manager doesn't have.
    with pytest.raises(Exception, match="scale_window"):
        compose_cfg("loss_scale=fixed_drop", "loss_scale.scale_window=3000")


def test_seed_blog_experiment_sweeps_the_three_setups():
    cfg = compose_cfg("experiment=seed_blog", hydra_cfg=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweeper.params.loss_scale == "fixed_drop,fixed_nodrop,dynamic_seed_blog"
    assert cfg.hydra.sweeper.params.amp == "O0,O2,O3"
    blog = compose_cfg("experiment=seed_blog", "loss_scale=dynamic_seed_blog").loss_scale
    assert (blog.init_loss_scale, blog.scale_factor, blog.scale_window) == (2**24, 4, 3000)
    nodrop = compose_cfg("experiment=seed_blog", "loss_scale=fixed_nodrop")
    assert nodrop.loss_scale.loss_scale == 1024.0 and optimizer_loss_scale(nodrop) == 1024.0


def test_validation_does_not_import_mindspore():
    code = ("import sys; sys.path.insert(0, 'tests'); from conftest import compose_cfg;"
            "from lsexp.preflight import validate; validate(compose_cfg('device=auto', 'dataset=digits'));"
            "print('mindspore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("args,keys", [
    (["loss_scale=fixed_nodrop", "optimizer.loss_scale=1"],
     ["optimizer.loss_scale", "loss_scale.loss_scale"]),
    (["device=gpu"], ["device.device_target=GPU"]),
])
def test_cli_config_error_is_one_line_and_writes_nothing(tmp_path, args, keys):
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lsexp: config error:"), out.stderr
    assert all(k in lines[0] for k in keys)
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/, no history.csv, no mlflow.db


@pytest.mark.parametrize("args,line", [
    (["optimizer=adamw", "optimizer.momentum=0.9"],
     "optimizer.momentum=0.9: AdamWeightDecayConfig has no key 'momentum'; its keys are learning_rate, "
     "weight_decay, clip_grad_norm, decay_filter, beta1, beta2, eps"),
    (["train.max_stpes=3"],
     "train.max_stpes=3: TrainConfig has no key 'max_stpes'; did you mean train.max_steps? its keys are "),
    (["loss_scale=fixd_drop"],
     "loss_scale=fixd_drop: no such option; did you mean loss_scale=fixed_drop? the options are "),
    (["train.max_steps=abc"],
     "train.max_steps=abc: Value 'abc' of type 'str' could not be converted to Integer; give "
     "train.max_steps a value its schema takes"),
    (["loss_scale=none,dynamic"], "loss_scale=none,dynamic: a comma sweeps only in a multirun; add -m"),
    (["-m", "loss_scale=none,dynamc", "train.seed=1,2"],
     "loss_scale=dynamc: no such option; did you mean loss_scale=dynamic? the options are "),
    # a key another model has names the models that have it
    (["model.vocab_size=4"],
     "model.vocab_size=4: LeNet5Config has no key 'vocab_size'; its keys are num_class, num_channel, "
     "image_size; model=gpt and model=transformer have it"),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_a_config_hydra_cannot_compose_is_one_line_and_exit_2_with_nothing_written(tmp_path, args, line):
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"lsexp: config error: {line}"), out.stderr
    # a sweep is composed job by job before its parent run or its folder exist
    assert list(tmp_path.iterdir()) == []


def test_a_bad_value_in_a_later_sweep_job_is_refused_before_the_sweep_opens(tmp_path):
    out = run_cli("-m", "optimizer=momentum,adamw", "optimizer.momentum=0.9", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "lsexp: config error: optimizer.momentum=0.9: AdamWeightDecayConfig has no key 'momentum'; its keys "
        "are learning_rate, weight_decay, clip_grad_norm, decay_filter, beta1, beta2, eps (the job "
        "optimizer=adamw optimizer.momentum=0.9)"]
    assert list(tmp_path.iterdir()) == []


def test_hydra_full_error_still_gives_hydras_own_report(tmp_path):
    out = run_cli("loss_scale=fixd_drop", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert out.returncode == 1 and "Traceback" in out.stderr and "MissingConfigException" in out.stderr


def test_a_workload_picks_the_model_and_the_data_set_and_the_command_line_still_wins():
    cfg = compose_cfg("workload=resnet8_digits")
    assert (cfg.model._target_.endswith("ResNet") and cfg.model.depth == 8
            and cfg.dataset._target_.endswith("digits"))
    assert compose_cfg("workload=resnet8_digits", "model.depth=14").model.depth == 14


@pytest.mark.parametrize("study", ["underflow", "scale_sweep", "none_vs_scaled", "dynamic_window"])
def test_every_study_composes_validates_and_names_its_report(study):
    from lsexp.report import studies

    cfg = compose_cfg(f"experiment={study}", hydra_cfg=True)
    assert cfg.study == study and study in studies.available()
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    validate(compose_cfg(f"experiment={study}"))


def test_an_unknown_study_is_one_line_naming_the_choices():
    from lsexp.report import studies

    with pytest.raises(ConfigError, match=r"study=nope: no such study; use one of ") as err:
        validate(compose_cfg("study=nope"))
    named = str(err.value).split("use one of ", 1)[1]
    assert "\n" not in named and named.endswith(" or null")
    assert named.removesuffix(" or null").split(", ") == sorted(studies.available())
    assert {"dynamic_window", "engines", "large_batch", "none_vs_scaled"} <= set(studies.available())


def test_an_experiment_sets_plain_keys_of_the_primary_config_too():
    # The primary config's own keys (inject) come first, so an experiment's values win over them.
    assert list(compose_cfg("experiment=dynamic_window").inject.overflow_steps) == [
        801, 802, 803, 1601, 1602, 1603]
    assert list(compose_cfg("experiment=dynamic_window",
                            "inject.overflow_steps=[5]").inject.overflow_steps) == [5]


