"""The workloads: models and data sets trained for real, through MindSpore's own loaders."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from helpers.data_files import write_cifar10, write_image_folder, write_mnist

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
AMPS = ["O0", "O1", "O2", "O3"]
STRATEGIES = ["fixed_drop", "fixed_nodrop", "dynamic"]
WORDS = ("the scale grows when no step overflows and shrinks by its factor when one does so the "
         "gradients keep their small values in half precision while the weights stay in single").split()


def write_text(path: Path, chars: int = 200_000, seed: int = 0) -> Path:
    """Sentences of a small vocabulary: structure a character model can learn, far below unigram entropy."""
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=chars // 4)
    path.write_text(". ".join(" ".join(words[i:i + 9]) for i in range(0, len(words), 9))[:chars],
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    return write_mnist(tmp_path_factory.mktemp("mnist"), train=6000, test=500)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("text") / "corpus.txt")


# --- models in every amp level and strategy -----------------------------------------------------
def _short_run(train_run, *overrides):
    summary, rows, _ = train_run(*overrides, "train.max_steps=3")
    assert summary["steps"] == len(rows) == 3
    assert math.isfinite(rows[0]["loss"])
    return summary, rows


# BatchNorm in float32 (O2) or float16 (O3, in CI's slow session)
@pytest.mark.slow
@pytest.mark.parametrize("amp", ["O2", "O3"])
def test_resnet_trains_with_batchnorm_in_both_precisions(train_run, amp):
    summary, rows = _short_run(train_run, "model=resnet", "model.depth=8", "dataset=digits", f"amp={amp}",
                               "loss_scale=dynamic")
    assert summary["overflow_steps"], "from 2^24, the first float16 steps overflow"
    assert 0 <= summary["eval_accuracy"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("amp", AMPS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resnet_every_amp_level_and_strategy(train_run, amp, strategy):
    _short_run(train_run, "model=resnet", "model.depth=8", "dataset=digits", f"amp={amp}",
               f"loss_scale={strategy}")


@pytest.mark.slow
@pytest.mark.parametrize("amp", AMPS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_transformer_every_amp_level_and_strategy(train_run, text_file, amp, strategy):
    _short_run(train_run, "model=transformer", "dataset=sequence", f"amp={amp}", f"loss_scale={strategy}")
    _short_run(train_run, "model=transformer", "dataset=text", f"dataset.path={text_file}", f"amp={amp}",
               f"loss_scale={strategy}")


# and the slow grid above
@pytest.mark.parametrize("amp,strategy", [pytest.param("O3", "dynamic", marks=pytest.mark.slow)])
def test_transformer_trains_in_float16(train_run, text_file, amp, strategy):
    _short_run(train_run, "model=transformer", "dataset=sequence", f"amp={amp}", f"loss_scale={strategy}")
    _short_run(train_run, "model=transformer", "dataset=text", f"dataset.path={text_file}", f"amp={amp}",
               f"loss_scale={strategy}")


# --- what the workloads learn -------------------------------------------------------------------
@pytest.mark.slow  # trains to accuracy: ~25 s; CI runs it in the slow session
def test_transformer_solves_the_sequence_task_on_held_out_sequences(train_run):
    summary, _, _ = train_run("model=transformer", "dataset=sequence", "train.epochs=2")
    assert summary["eval_accuracy"] >= 0.9, summary


@pytest.mark.slow  # ~20 s of learning; the LM's float16 steps run in test_transformer_trains_in_float16
def test_character_lm_beats_the_unigram_entropy(train_run, text_file):
    summary, _, _ = train_run("model=transformer", "dataset=text", f"dataset.path={text_file}",
                              "train.epochs=3")
    chars = text_file.read_text()
    freq = np.unique(list(chars), return_counts=True)[1] / len(chars)
    entropy = float(-(freq * np.log(freq)).sum())
    assert summary["reference_loss"] == pytest.approx(entropy)
    assert summary["eval_loss"] < entropy - 0.5, summary
    assert summary["final_loss"] < entropy - 0.5, summary


@pytest.mark.slow
def test_resnet_reaches_90_percent_on_digits_with_the_default_epochs(tmp_path):
    # 440 ResNet-20 steps at O2: cores shared with other work can double their time
    out = run_cli("model=resnet", "dataset=digits", "amp=O2", "loss_scale=dynamic", "tracking=none",
                  "train.progress=false", cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr
    (summary,) = [json.loads(p.read_text()) for p in tmp_path.glob("outputs/*/*/summary.json")]
    assert summary["eval_accuracy"] >= 0.9 and summary["steps"] == 10 * (1438 // 32), summary


# --- real formats through MindSpore's loaders -----------------------------------------------------
@pytest.mark.slow  # 750 steps through the pipeline: MNIST's reading is also covered by the 20-step test below
def test_mnist_trains_the_default_lenet5_on_the_cli(tmp_path, mnist_dir):
    # LeNet5's Normal(0.02) layers sit on a plateau for a few hundred steps before they learn.
    out = run_cli("dataset=mnist", f"dataset.path={mnist_dir}", "train.epochs=4", "tracking=none",
                  "train.progress=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (summary,) = [json.loads(p.read_text()) for p in tmp_path.glob("outputs/*/*/summary.json")]
    assert summary["run_name"] == "lenet5-mnist-O0-fixed_drop" and summary["steps"] == 4 * (6000 // 32)
    assert summary["eval_accuracy"] >= 0.9, summary  # on the 500 t10k images


def test_mnist_at_its_own_28x28_with_lenet5_following(train_run, mnist_dir):
    summary, _, _ = train_run("dataset=mnist", f"dataset.path={mnist_dir}", "dataset.image_size=28",
                              "train.max_steps=20")
    assert summary["steps"] == 20 and "eval_accuracy" in summary


def test_cifar10_full_size_files_train_and_evaluate_on_the_test_batch(train_run, tmp_path):
    folder = write_cifar10(tmp_path / "cifar")
    summary, rows, _ = train_run("dataset=cifar10", f"dataset.path={folder.parent}", "model=mlp",
                                 "train.max_steps=40", "dataset.batch_size=64")
    assert summary["steps"] == 40 and rows[-1]["loss"] < rows[0]["loss"]
    assert summary["eval_accuracy"] > 0.5, summary  # 10 000 test records, chance is 0.1


def test_a_folder_of_pngs_trains_through_image_folder_dataset(train_run, tmp_path):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=40, size=16)
    summary, _, _ = train_run("dataset=image_folder", f"dataset.path={root}", "dataset.image_size=16",
                              "dataset.batch_size=8", "model=mlp", "train.epochs=4")
    assert summary["steps"] == 4 * (96 // 8)
    assert summary["eval_accuracy"] >= 0.9, summary  # 24 held-out images of 3 classes


@pytest.mark.slow  # ~19 s of MNIST files; resume from in-memory data is in the default suite
def test_a_run_resumed_mid_epoch_on_a_pipeline_has_the_straight_history(train_run, mnist_dir):
    # the streamed pipeline: dataset.cache=auto would serve these small files from memory
    common = ["dataset=mnist", f"dataset.path={mnist_dir}", "dataset.cache=stream", "amp=O2",
              "loss_scale=dynamic", "loss_scale.scale_window=5"]
    _, straight, _ = train_run(*common, "train.max_steps=80")
    _, first, part = train_run(*common, "train.max_steps=50", "train.checkpoint=true")
    _, second, _ = train_run(*common, "train.max_steps=80", f"train.resume={part / 'checkpoint.ckpt'}")
    assert first[-1]["epoch"] == 1 and second[0]["epoch"] == 1  # 187 steps an epoch: resumed mid-epoch
    assert first + second == straight


# --- your own model and data ----------------------------------------------------------------------
@pytest.mark.parametrize("data", ["my_pkg.make_data",
                                  pytest.param("my_pkg.make_dataset", marks=pytest.mark.slow)])
def test_a_model_and_data_set_from_outside_lsexp_train_via_target(tmp_path, data):
    out = run_cli("model._target_=my_pkg.MyNet", "+model.depth=3", f"dataset._target_={data}", "amp=O2",
                  "loss_scale=dynamic", "inject.overflow_steps=[2]", "dataset.num_samples=96",
                  "train.epochs=2", "tracking=none", "train.progress=false", cwd=tmp_path,
                  env={"PYTHONPATH": EXAMPLES})
    assert out.returncode == 0, out.stderr
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run_name"].startswith("mynet-") and summary["steps"] == 6
    assert 2 in summary["overflow_steps"] and summary["skipped_steps"] >= 1
    assert "model:\n  _target_: my_pkg.MyNet" in (run_dir / ".hydra" / "config.yaml").read_text()


def test_a_graph_mindspore_cannot_compile_leaves_its_dump_in_the_job_folder(tmp_path):
    # MindSpore writes analyze_fail.ir under ./rank_0/om by default: the user's folder
    (tmp_path / "bad_net.py").write_text(
        "from mindspore import nn\n"
        "class BadNet(nn.Cell):\n"
        "    def __init__(self, num_class, num_channel, image_size):\n"
        "        super().__init__()\n"
        "        self.head = nn.Dense(num_channel * image_size * image_size, num_class)\n"
        "    def construct(self, x):\n"
        "        from math import pi  # graph mode has no import statement\n"
        "        return self.head(x.reshape(x.shape[0], -1)) * pi\n")
    out = run_cli("model._target_=bad_net.BadNet", "train.max_steps=1", "tracking=none",
                  "train.progress=false", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode != 0 and "ImportFrom" in out.stderr, out.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad_net.py", "outputs"]
    (dump,) = tmp_path.glob("outputs/*/*/rank_0/om/analyze_fail.ir")
    assert str(dump) in out.stderr  # where MindSpore's message says it is


# --- errors: one line, exit 2, nothing written ------------------------------------------------------
def _assert_one_line_and_nothing_written(out, cwd: Path, *keys: str) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lsexp: config error:"), out.stderr
    assert all(k in lines[0] for k in keys), lines[0]
    assert "Traceback" not in out.stderr
    assert list(cwd.iterdir()) == []  # no outputs/, no mlflow.db, no rank_0/ or analyze_fail.ir
    return lines[0]


@pytest.mark.parametrize("args,keys", [
    (["dataset=mnist"], ["dataset.path=None", "train-images-idx3-ubyte", "yann.lecun.com"]),
    (["dataset=mnist", "dataset.path=/no/such/dir"], ["dataset.path=/no/such/dir", "no such folder"]),
    (["dataset=cifar10", "dataset.path=/no/such/dir"], ["dataset.path=/no/such/dir", "data_batch_1.bin",
                                                        "cs.toronto.edu"]),
    (["dataset=image_folder", "dataset.path=/no/such/dir"], ["dataset.path=/no/such/dir",
                                                             "one subfolder per class"]),
    (["model=transformer", "dataset=text", "dataset.path=/no/such.txt"], ["dataset.path=/no/such.txt",
                                                                         "UTF-8"]),
    (["model.num_class=0"], ["model.num_class=0"]),
    (["model=mlp", "model.hidden_units=[64,0]"], ["model.hidden_units=[64, 0]"]),
    (["dataset.image_size=8"], ["model.image_size=8", "14x14"]),
    (["model.num_channel=3"], ["model.num_channel=3", "dataset.num_channel=1"]),
    (["model=transformer"], ["model._target_=lsexp.models.transformer_encoder.Transformer", "dataset.task"]),
    (["hydra.run.dir=conftest.py/run"], ["hydra.run.dir=conftest.py/run", "cannot create it"]),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_workload_errors_are_one_line_and_write_nothing(tmp_path, args, keys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    if args[0].startswith("hydra.run.dir"):  # a path below a regular file
        (cwd / "conftest.py").write_text("")
        out = run_cli(*args, cwd=cwd)
        (cwd / "conftest.py").unlink()
    else:
        out = run_cli(*args, cwd=cwd)
    _assert_one_line_and_nothing_written(out, cwd, *keys)


def test_broken_data_files_are_named(tmp_path, mnist_dir):
    bad = tmp_path / "mnist"
    bad.mkdir()
    for f in mnist_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "t10k-labels-idx1-ubyte").write_bytes((bad / "t10k-labels-idx1-ubyte").read_bytes()[:-7])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    line = _assert_one_line_and_nothing_written(run_cli("dataset=mnist", f"dataset.path={bad}", cwd=cwd), cwd,
                                                "t10k-labels-idx1-ubyte", "truncated")
    assert line.startswith(f"lsexp: config error: dataset.path={bad}:")
    cifar = tmp_path / "cifar-10-batches-bin"
    cifar.mkdir()
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (cifar / name).write_bytes(b"\0" * 3073 * 100)  # 100 records: MindSpore would refuse it
    _assert_one_line_and_nothing_written(run_cli("dataset=cifar10", f"dataset.path={tmp_path}", cwd=cwd), cwd,
                                         "data_batch_1.bin has 307300 bytes")


USER_MODULE = """
from mindspore import nn


class FixedNet(nn.Cell):  # takes 1-channel images whatever the data set says
    def __init__(self, num_class, **_):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.head = nn.Dense(4, num_class)

    def construct(self, x):
        return self.head(self.conv(x).mean(axis=(2, 3)))
"""


def test_a_user_model_that_cannot_take_the_data_fails_on_its_traced_batch(tmp_path):
    modules, cwd = tmp_path / "modules", tmp_path / "cwd"
    modules.mkdir(), cwd.mkdir()
    (modules / "fixed_pkg.py").write_text(USER_MODULE)
    out = run_cli("model._target_=fixed_pkg.FixedNet", "dataset.num_channel=3", cwd=cwd,
                  env={"PYTHONPATH": str(modules)})
    line = _assert_one_line_and_nothing_written(out, cwd, "model._target_=fixed_pkg.FixedNet",
                                                "dataset._target_=lsexp.datasets.synthetic.synthetic")
    assert "Conv2D" in line, line  # MindSpore's own words on the mismatch


def test_a_user_data_sets_size_bounds_the_injected_steps_before_anything_is_written(tmp_path):
    out = run_cli("dataset._target_=my_pkg.make_data", "dataset.num_samples=256", "train.epochs=1",
                  "inject.overflow_steps=[9]", cwd=tmp_path, env={"PYTHONPATH": EXAMPLES})
    _assert_one_line_and_nothing_written(out, tmp_path, "inject.overflow_steps=[9]", "steps 1..8")


def test_data_file_checks_run_before_mindspore_is_imported():
    import subprocess

    code = ("import sys; sys.path.insert(0, 'tests'); from conftest import compose_cfg;"
            "from lsexp.config.errors import ConfigError; from lsexp.preflight import validate\n"
            "try: validate(compose_cfg('dataset=cifar10', 'dataset.path=/nowhere'))\n"
            "except ConfigError as e: print(len(e.problems), 'mindspore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "1 False"
