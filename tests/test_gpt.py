"""model=gpt on dataset=python_source (workload=gpt_python): a GPT-style decoder language model on the
interpreter's own standard library, byte by byte."""

import math

import numpy as np
import pytest

from conftest import run_cli

# a small corpus and short sequences: the tests' steps, not the workload's
SMALL = ("workload=gpt_python", "dataset.max_bytes=200000", "dataset.seq_len=32", "dataset.batch_size=16")
STRATEGIES = ("none", "fixed_drop", "fixed_nodrop", "dynamic", "dynamic_hysteresis", "dynamic_seed_blog",
              "amax_history", "adaptive_window", "megatron")
FAST = {("dynamic", "cell")}


def _cases():
    for strategy in STRATEGIES:
        for engine in ("cell", "functional"):
            marks = () if (strategy, engine) in FAST else (pytest.mark.slow,)
            yield pytest.param(strategy, engine, marks=marks, id=f"{strategy}-{engine}")


@pytest.mark.parametrize("strategy,engine", list(_cases()))
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_every_strategy_trains_the_gpt_at_o2_for_20_steps(train_run, strategy, engine):
    summary, rows, _ = train_run(*SMALL, "amp=O2", f"loss_scale={strategy}", f"engine={engine}",
                                 "train.max_steps=20")
    assert summary["steps"] == 20 and len(rows) == 20
    finite = [r["loss"] for r in rows if math.isfinite(r["loss"])]
    assert finite and finite[-1] < finite[0], "the loss falls"
    assert math.isfinite(summary["eval_loss"])


@pytest.mark.slow  # 300 steps, ~90 s
def test_the_gpt_workload_beats_the_unigram_entropy_of_its_corpus(train_run):
    from lsexp.datasets.python_source_schema import read

    summary, _, _ = train_run("workload=gpt_python")
    corpus = read(2_000_000)
    counts = np.bincount(corpus)
    p = counts[counts > 0] / len(corpus)
    entropy = float(-(p * np.log(p)).sum())
    assert summary["reference_loss"] == pytest.approx(entropy)
    assert summary["eval_loss"] < entropy - 0.4, summary


@pytest.mark.slow
def test_the_gpt_resumes_exactly(train_run):
    # the schedule's length fixed, not the run's: the first part stops at 6 of the same 12 steps
    common = [*SMALL, "amp=O2", "loss_scale=dynamic", "lr_schedule.total_steps=12"]
    _, straight, _ = train_run(*common, "train.max_steps=12")
    _, first, part = train_run(*common, "train.max_steps=6", "train.checkpoint=true")
    summary, second, _ = train_run(*common, "train.max_steps=12", f"train.resume={part / 'checkpoint.ckpt'}")
    assert first + second == straight
    assert summary["resumed_from_step"] == 6


@pytest.mark.parametrize("args,says", [
    (["model=gpt", "dataset=digits"], "model._target_=lsexp.models.gpt.GPT: takes dataset.vocab_size, which "
     "dataset._target_=lsexp.datasets.digits.digits does not have"),
    (["model=gpt", "dataset=sequence"], "model._target_=lsexp.models.gpt.GPT with dataset sequence: "
     "a language model needs text; use dataset=python_source or dataset=text"),
    (["workload=gpt_python", "dataset.max_bytes=100"], "dataset.max_bytes=100: 100 bytes are too few"),
])
def test_bad_gpt_options_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    out = run_cli(*args, "train.max_steps=3", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("lsexp")]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []
