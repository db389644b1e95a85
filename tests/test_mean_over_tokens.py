"""train.mean_over_tokens: the gradients a mean over N tokens makes, with the optimizer corrected so that
float32 trains exactly as without the key, while float16 loses what a batch of N tokens would lose."""

import pytest

from conftest import run_cli

# (workload, optimizer): the optimizer's correction is eps / K (AdamWeightDecay) or MindSpore's own
# loss_scale / K (Momentum)
CONTROLS = [
    pytest.param(("model=mlp", "dataset=digits"), "adamw", id="mlp-adamw", marks=pytest.mark.slow),
    pytest.param(("model=mlp", "dataset=digits"), "momentum", id="mlp-momentum"),
    pytest.param(("workload=gpt_python", "dataset.max_bytes=200000", "dataset.seq_len=32",
                  "dataset.batch_size=16"), "adamw", id="gpt-adamw", marks=pytest.mark.slow),
    pytest.param(("workload=transformer_text",), "adamw", id="lm-adamw",
                 marks=pytest.mark.slow),
    pytest.param(("model=mlp", "dataset=digits"), "adam", id="mlp-adam", marks=pytest.mark.slow),
]
COLUMNS = ("loss", "loss_scale", "overflow", "skipped_steps", "lr")


@pytest.mark.parametrize("workload,optimizer", CONTROLS)
def test_float32_trains_as_without_the_key(train_run, workload, optimizer):
    """At O0, N = 2^20 gives the history of the run without the key. K = N / the batch's tokens is a
    power of two here, so every scaling is exact and the histories are equal bit for bit."""
    common = (*workload, f"optimizer={optimizer}", "optimizer.weight_decay=0.01", "amp=O0",
              "train.max_steps=12")
    _, plain, _ = train_run(*common)
    summary, tokens, _ = train_run(*common, "train.mean_over_tokens=1048576")
    assert [[r[c] for c in COLUMNS] for r in tokens] == [[r[c] for c in COLUMNS] for r in plain]
    assert summary["steps"] == 12


def test_float16_loses_the_gradients_a_large_batch_makes_small(train_run):
    """The same run at O2 without a scale: with N = 2^20 most gradient elements flush to zero."""
    common = ("model=mlp", "dataset=digits", "optimizer=adamw", "amp=O2", "loss_scale=none",
              "telemetry=grads", "train.max_steps=4")
    _, plain, _ = train_run(*common)
    _, tokens, _ = train_run(*common, "train.mean_over_tokens=1048576")
    assert max(r["zero_fraction"] for r in plain) < 0.5
    assert min(r["zero_fraction"] for r in tokens) > 0.9


@pytest.mark.parametrize("args,says", [
    (["train.mean_over_tokens=16"], "train.mean_over_tokens=16: below the 32 tokens a step already averages"),
    (["train.mean_over_tokens=0"], "train.mean_over_tokens=0: below the 32 tokens"),
    pytest.param(["train.mean_over_tokens=-4"], "train.mean_over_tokens=-4: below the 32 tokens",
                 marks=pytest.mark.slow),
    (["train.mean_over_tokens=1.5"], "train.mean_over_tokens"),
    # Lamb's trust ratio takes eps inside a root and its update outside it: no one eps / K keeps both
    (["train.mean_over_tokens=1048576", "optimizer=lamb"],
     "train.mean_over_tokens=1048576 with optimizer._target_=mindspore.nn.Lamb: no correction keeps"),
    (["train.mean_over_tokens=1048576", "optimizer.clip_grad_norm=1.0"],
     "train.mean_over_tokens=1048576 with optimizer.clip_grad_norm=1.0"),
    pytest.param(["workload=transformer_text", "train.mean_over_tokens=1024"],
                 "train.mean_over_tokens=1024: below the 2048 tokens", marks=pytest.mark.slow),
])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_bad_token_counts_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    out = run_cli(*args, "train.max_steps=3", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("lsexp")]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_runs_params_carry_the_correction(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli("model=mlp", "dataset=digits", "optimizer=adamw", "train.mean_over_tokens=1048576",
                  "train.max_steps=2", f"tracking.uri={uri}", "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    params = run.data.params
    assert params["train.mean_over_tokens"] == "1048576"
    assert params["train.gradient_divisor"] == "32768"  # 2^20 / a batch of 32
    assert params["train.optimizer_correction"] == "optimizer.eps / 32768"
