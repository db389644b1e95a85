"""Data parallel through msrun with 2 ranks on CPU (MCCL): marked `msrun`, run by `.ci/run` as a
separate step (`python -m pytest -m msrun`). The shard arithmetic and the config checks are
default tests: they need no ranks."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from conftest import compose_cfg, run_cli
from lsexp.config.errors import ConfigError
from lsexp.config.facts import steps_per_epoch
from lsexp.datasets.kinds import _epoch_slice
from lsexp.device import onednn
from lsexp.preflight import validate
from lsexp.scaleout.msrun import _rank_pids
from lsexp.training.history import read_history
from test_golden import GOLDEN, feature_differences

DP = ["parallel=data", "parallel.workers=2", "train.progress=false"]


# --- default suite: no ranks ---------------------------------------------------------------------
def test_the_ranks_shards_together_are_the_batch_of_one_process_with_world_times_the_batch():
    one = OmegaConf.create({"batch_size": 8, "drop_remainder": True, "seed": 3, "shuffle": True})
    whole = _epoch_slice(100, OmegaConf.merge(one, {"batch_size": 16}), epoch=2, start=1, shard=(1, 0))
    shards = [_epoch_slice(100, one, epoch=2, start=1, shard=(2, r))
              for r in (0, 1)]
    assert all(len(s) == len(whole) // 2 for s in shards)
    for step in range(len(whole) // 16):  # global step i: rank 0's batch i, then rank 1's
        together = np.concatenate([s[step * 8:(step + 1) * 8] for s in shards])
        assert (together == whole[step * 16:(step + 1) * 16]).all()


def test_an_epoch_of_data_parallel_has_world_times_fewer_steps():
    assert steps_per_epoch(compose_cfg("dataset=digits", *DP[:2]), 1437) == 1437 // 64
    assert steps_per_epoch(compose_cfg("dataset=digits"), 1437) == 1437 // 32


@pytest.mark.parametrize("overrides,message", [
    (["inject.overflow_steps=[3]", "inject.rank=2"], "inject.rank=2: there are ranks 0..1"),
    (["dataset.drop_remainder=false"], "dataset.drop_remainder=false with parallel=data"),
    (["train.mode=pynative"], "train.mode=pynative with parallel=data"),
    (["parallel.workers=0"], "parallel.workers=0: must be >= 1"),
])
def test_data_parallel_config_errors_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        validate(compose_cfg(*DP[:2], *overrides))


# --- msrun: 2 real ranks --------------------------------------------------------------------------
def _lsexp(tmp_path, *overrides, name="run"):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli(*DP, "amp=O2", f"tracking.uri={uri}", f"hydra.run.dir={name}", *overrides, cwd=tmp_path)
    if out.returncode != 0:  # pytest removes the logs with tmp_path: keep their ends in the failure
        for log in sorted((tmp_path / name / "msrun_log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            out.stderr += f"\n--- {log.name}:\n" + "\n".join(tail)
    return out, uri, tmp_path / name


def _rank_processes(tmp_path) -> list:
    return _rank_pids(tmp_path / "run")


def _as_from_a_terminal():
    # A command started in the background by a non-interactive shell (as CI may start pytest)
    # inherits SIGINT ignored, and Python then installs no Ctrl-C handler; a terminal's command has
    # the default, which is what the Ctrl-C test is about.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_training(tmp_path, **popen):
    """A long 2-rank run tracked to a fresh store, returned once rank 0 has written its first epoch."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    MlflowClient(uri).search_experiments()
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", *DP, "amp=O2", "train.epochs=200",
                             f"tracking.uri={uri}", "hydra.run.dir=run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal, **popen)
    deadline = time.time() + 180
    while time.time() < deadline and not (tmp_path / "run/history.csv").exists():
        time.sleep(0.5)
    return proc, uri


@pytest.mark.msrun
def test_an_overflow_injected_on_one_rank_is_skipped_by_both_and_the_ranks_stay_identical(tmp_path):
    out, uri, run_dir = _lsexp(tmp_path, "loss_scale=fixed_drop", "inject.overflow_steps=[3]",
                               "inject.rank=1", "train.max_steps=8")
    assert out.returncode == 0, out.stderr
    rows = read_history(run_dir / "history.csv")  # rank 0's: it injected nothing itself
    assert [r["overflow"] for r in rows] == [0, 0, 1, 0, 0, 0, 0, 0]
    assert rows[-1]["skipped_steps"] == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks_identical"] is True and summary["world_size"] == 2
    digests = sorted(run_dir.glob("msrun_log/rank*.params_sha256"))
    assert len(digests) == 2 and len({p.read_text() for p in digests}) == 1
    assert len(list(run_dir.rglob("history.csv"))) == 1  # written once, by rank 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["world_size"] == "2"
    # the ranks take the cap the job resolved (auto: this machine's cached decision, shared by the suite)
    decided = onednn.cached_or_calibrated()["onednn_max_cpu_isa"]
    assert (summary["onednn_max_cpu_isa"] == decided
            and run.data.params["device.onednn_max_cpu_isa"] == str(decided))
    assert [m.value for m in sorted(client.get_metric_history(run.info.run_id, "overflow"),
                                    key=lambda m: m.step)] == [0, 0, 1, 0, 0, 0, 0, 0]
    # and as recorded at 76da263, before issue 39's renovation (tests/test_golden.py)
    assert feature_differences(GOLDEN / "features" / "parallel_data", run_dir) == []


@pytest.mark.msrun
def test_under_data_parallel_the_first_nonfinite_names_the_layer_pass_and_rank(tmp_path):
    out, uri, run_dir = _lsexp(tmp_path, "loss_scale=dynamic", "loss_scale.init_loss_scale=1024",
                               "inject.layer=fc2", "inject.pass=backward", "inject.overflow_steps=[3]",
                               "inject.rank=0", "train.max_steps=5")
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    first = summary["first_nonfinite"]
    assert (first["step"], first["layer"], first["pass"], first["rank"]) == (3, "fc2", "backward", 0)
    rows = read_history(run_dir / "history.csv")
    assert [r["overflow"] for r in rows] == [0, 0, 1, 0, 0]
    assert [(r["first_nonfinite_layer"], r["first_nonfinite_pass"]) for r in rows] == [
        ("", ""), ("", ""), ("fc2", "backward"), ("", ""), ("", "")]
    assert summary["ranks_identical"] is True
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    assert run.data.tags["lsexp.first_nonfinite"] == "fc2/backward@3"


GPT_SMALL = ["workload=gpt_python", "dataset.max_bytes=200000", "dataset.seq_len=32", "dataset.batch_size=8",
             "train.max_steps=6"]


@pytest.mark.msrun
def test_gpt_under_data_parallel_counts_every_ranks_tokens_and_keeps_the_float32_control(tmp_path):
    # At O2 with a dynamic scale both ranks step alike; at O0 the mean over 2^20 tokens, whose batch is
    # both ranks' (2 x 8 x 32 tokens), gives the history of the run without the key.
    trained, uri, run_dir = _lsexp(tmp_path, *GPT_SMALL, "loss_scale=dynamic", "telemetry=layers", name="o2")
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks_identical"] is True and summary["world_size"] == 2 and summary["steps"] == 6
    assert {"blocks.0", "blocks.1"} <= set(summary["layers"])
    keyed, _, with_key = _lsexp(tmp_path, *GPT_SMALL, "amp=O0", "loss_scale=none",
                                "train.mean_over_tokens=1048576", name="keyed")
    assert keyed.returncode == 0, keyed.stderr
    plain, _, without = _lsexp(tmp_path, *GPT_SMALL, "amp=O0", "loss_scale=none", name="plain")
    assert plain.returncode == 0, plain.stderr
    assert read_history(with_key / "history.csv") == read_history(without / "history.csv")
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    (run,) = [r for r in runs if r.data.params.get("train.mean_over_tokens") == "1048576"]
    assert float(run.data.params["train.gradient_divisor"]) == 2 ** 20 / (2 * 8 * 32)
    assert json.loads((with_key / "summary.json").read_text())["ranks_identical"] is True


@pytest.mark.msrun
def test_delayed_fp8_scales_are_identical_on_both_ranks(tmp_path):
    # each rank quantises its own shard: without TE's amax all-reduce their input scales would differ
    import mindspore as ms

    out, _, run_dir = _lsexp(tmp_path, "model=mlp", "dataset=digits", "loss_scale=dynamic",
                             "precision=fp8_delayed", "precision.amax_history_len=4", "train.max_steps=8",
                             "train.checkpoint=true")
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks_identical"] is True and summary["world_size"] == 2
    saved = ms.load_checkpoint(str(run_dir / "checkpoint.ckpt"))
    scales = {k: float(v.asnumpy()) for k, v in saved.items()
              if k.startswith("lsexp_fp8.") and k.endswith("scale")}
    assert "lsexp_fp8.layers.1.input.scale" in scales and scales["lsexp_fp8.layers.1.input.scale"] != 1.0


@pytest.mark.msrun
def test_the_functional_engine_and_hysteresis_decide_alike_on_every_rank(tmp_path):
    # Rank 1's two overflows reach rank 0 through the reducer: both skip both steps, and hysteresis 2
    # backs off only after the second, on both ranks.
    out, _, run_dir = _lsexp(tmp_path, "engine=functional", "loss_scale=dynamic_hysteresis", "tracking=none",
                             "inject.overflow_steps=[3,4]", "inject.rank=1", "train.max_steps=6")
    assert out.returncode == 0, out.stderr
    rows = read_history(run_dir / "history.csv")
    assert [r["overflow"] for r in rows] == [0, 0, 1, 1, 0, 0] and rows[-1]["skipped_steps"] == 2
    assert [r["loss_scale"] for r in rows] == [65536.0] * 4 + [32768.0] * 2
    assert json.loads((run_dir / "summary.json").read_text())["ranks_identical"] is True


@pytest.mark.msrun
def test_a_two_rank_run_resumed_from_its_checkpoint_continues_exactly(tmp_path):
    common = ["loss_scale=dynamic", "loss_scale.scale_window=3", "tracking=none"]
    first, _, part = _lsexp(tmp_path, *common, "train.max_steps=6", "train.checkpoint=true", name="part")
    assert first.returncode == 0, first.stderr
    rest, _, resumed = _lsexp(tmp_path, *common, "train.max_steps=12",
                              f"train.resume={part / 'checkpoint.ckpt'}", name="resumed")
    assert rest.returncode == 0, rest.stderr
    whole, _, straight = _lsexp(tmp_path, *common, "train.max_steps=12", name="straight")
    assert whole.returncode == 0, whole.stderr
    second = read_history(resumed / "history.csv")
    assert [r["step"] for r in second] == list(range(7, 13))
    assert read_history(part / "history.csv") + second == read_history(straight / "history.csv")


@pytest.mark.msrun
def test_ctrl_c_stops_every_rank_and_the_run_ends_killed(tmp_path):
    proc, uri = _start_training(tmp_path, stderr=subprocess.STDOUT)
    try:
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert _rank_processes(tmp_path) == []
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    assert run.info.status == "KILLED"
    # rank 0 stopped like Ctrl-C: nothing it trained is lost
    rows = read_history(tmp_path / "run/history.csv")
    assert len(rows) > 0 and len(client.get_metric_history(run.info.run_id, "loss")) == len(rows)


@pytest.mark.msrun
def test_a_rank_that_dies_fails_the_run_in_one_line_with_no_rank_left(tmp_path):
    proc, uri = _start_training(tmp_path, stderr=subprocess.PIPE)
    try:
        os.kill(max(_rank_processes(tmp_path)), signal.SIGKILL)  # the last rank msrun started
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode not in (0, 130), stderr
    lines = [line for line in stderr.splitlines() if line.startswith("lsexp:")]
    assert len(lines) == 1 and "parallel=data" in lines[0] and "Traceback" not in stderr, stderr
    assert _rank_processes(tmp_path) == []
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    assert run.info.status == "FAILED"


@pytest.mark.msrun
def test_data_parallel_inside_a_sweep_job(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli("-m", *DP, "amp=O2", "loss_scale=fixed_drop,dynamic", "train.max_steps=4",
                  f"tracking.uri={uri}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    (parent,) = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.info.status for c in children) == ["FINISHED", "FINISHED"]
    assert all(c.data.params["world_size"] == "2" for c in children)


@pytest.mark.msrun
def test_accumulation_under_data_parallel_reduces_once_per_step_and_the_ranks_stay_identical(tmp_path):
    # micro-batch 6 on rank 1 is the 2nd of optimizer step 2 (k = 4): both ranks skip that step
    out, _, run_dir = _lsexp(tmp_path, "loss_scale=fixed_drop", "train.accumulate_steps=4",
                             "dataset.batch_size=8", "inject.overflow_steps=[6]", "inject.rank=1",
                             "train.max_steps=5", "tracking=none")
    assert out.returncode == 0, out.stderr
    rows = read_history(run_dir / "history.csv")
    assert [r["overflow"] for r in rows] == [0, 1, 0, 0, 0] and rows[-1]["skipped_steps"] == 1
    assert json.loads((run_dir / "summary.json").read_text())["ranks_identical"] is True
    digests = sorted(run_dir.glob("msrun_log/rank*.params_sha256"))
    assert len(digests) == 2 and len({p.read_text() for p in digests}) == 1


@pytest.mark.msrun
@pytest.mark.parametrize("engine", ["cell", "functional"])
@pytest.mark.parametrize("option", ["adaptive_window", "amax_history"])
def test_the_new_scalers_decide_alike_on_every_rank_when_one_ranks_gradients_are_poisoned(tmp_path, option,
                                                                                           engine):
    # Rank 1's overflows reach rank 0 through the reducer; amax_history's amax is taken after it, so both
    # ranks predict the same scale. The digests cover the parameters and every state entry of the scaler.
    window = (["loss_scale.scale_window=3", "loss_scale.min_scale_window=3", "loss_scale.max_scale_window=12",
               "loss_scale.loss_scale_value=1024"] if option == "adaptive_window"
              else ["loss_scale.history_len=4"])
    out, _, run_dir = _lsexp(tmp_path, f"engine={engine}", f"loss_scale={option}", *window, "tracking=none",
                             "inject.overflow_steps=[3,4,9]", "inject.rank=1", "train.max_steps=16")
    assert out.returncode == 0, out.stderr
    rows = read_history(run_dir / "history.csv")
    # at O2 a predicted scale can overflow the activations' gradients too (docs/strategies.md)
    overflows = [r["step"] for r in rows if r["overflow"]]
    assert {3, 4, 9} <= set(overflows) and rows[-1]["skipped_steps"] == len(overflows)
    scales = [r["loss_scale"] for r in rows]
    assert scales[3] == scales[2] / 2 and scales[4] == scales[3] / 2
    assert len(set(r["loss_scale"] for r in rows)) > 2  # it moved, not only backed off
    digests = sorted(run_dir.glob("msrun_log/rank*.params_sha256"))
    assert len(digests) == 2 and len({p.read_text() for p in digests}) == 1
    assert json.loads((run_dir / "summary.json").read_text())["ranks_identical"] is True
