"""experiment=scalers: its arms as Hydra composes them, and the study run for real as a small sweep, its
table checked against the runs' own metrics and histories."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_cfg
from helpers.study_sweep import study_sweep, study_table
from lsexp.report.studies import dynamic_window

# each arm of conf/arm/: the loss_scale option it selects and the keys it sets
ARMS = {
    "dynamic": ("dynamic", {}),
    "dynamic_hysteresis": ("dynamic_hysteresis", {}),
    "megatron": ("megatron", {}),
    "adaptive_window": ("adaptive_window", {}),
    "amax_history_margin0": ("amax_history", {"margin": 0}),
    "amax_history_margin2": ("amax_history", {"margin": 2}),
    "fixed_drop_128": ("fixed_drop", {"loss_scale": 128.0}),
    "fixed_drop_65536": ("fixed_drop", {"loss_scale": 65536.0}),
    "none": ("none", {}),
}


def test_each_arm_composes_its_strategy_and_the_experiment_sweeps_them_all():
    from lsexp.report.studies import scalers

    swept = compose_cfg("experiment=scalers", hydra_cfg=True).hydra.sweeper.params
    assert swept["arm"].split(",") == list(ARMS) == scalers.ARMS
    assert swept["workload"].split(",") == ["mlp_digits", "transformer_sequence"]
    assert swept["train.seed"].split(",") == ["1", "2", "3"]
    for arm, (option, keys) in ARMS.items():
        cfg = compose_cfg("experiment=scalers", f"arm={arm}", hydra_cfg=True)
        assert cfg.hydra.runtime.choices.loss_scale == option
        assert {k: cfg.loss_scale[k] for k in keys} == keys
        assert cfg.amp.level == "O2" and cfg.amp.dtype == "float16" and cfg.telemetry.grads
        injected = list(cfg.inject.overflow_steps)
        if arm == "none":  # without a scaler an injected overflow is applied and ends the run
            assert injected == []
        else:  # two bursts, both inside the run
            assert len(dynamic_window.bursts(injected)) == 2 and max(injected) < cfg.train.max_steps


def _metric(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _num(cell: str) -> float:
    return float(cell) if cell else math.nan


@pytest.mark.slow
def test_scalers_study_counts_skips_headroom_and_recovery_from_the_runs(tmp_path):
    # The experiment's own bursts, with a run that ends 40 steps after the second; one workload and seed.
    bursts = list(compose_cfg("experiment=scalers").inject.overflow_steps)
    steps = max(bursts) + 40
    arms = ["dynamic", "megatron", "amax_history_margin0", "fixed_drop_65536", "none"]
    client, parent, children = study_sweep(
        tmp_path, "experiment=scalers", f"train.max_steps={steps}",
        f'hydra.sweeper.params={{arm:"{",".join(arms)}",workload:mlp_digits,train.seed:"1"}}')
    assert len(children) == len(arms)
    rows = {(r["arm"], r["dtype"]): r for r in study_table(tmp_path, client, parent, "scalers")}
    assert set(rows) == {(a, "float16") for a in arms} | {("none", "bfloat16")}
    speeds, zeros = {}, {}
    for arm in arms:
        row = rows[(arm, "float16")]
        (child,) = [c for c in children if f"arm={arm}" in c.data.tags["lsexp.overrides"].split()]
        run_id, metrics = child.info.run_id, child.data.metrics
        assert row["workload"] == "mlp_digits" and row["seeds"] == "1"
        overflow = _metric(client, run_id, "overflow")
        scale = _metric(client, run_id, "loss_scale")
        headroom = _metric(client, run_id, "headroom_log2")
        assert sorted(overflow) == list(range(1, steps + 1))

        # skipped updates: every one counted once, split by where it happened
        initial, burst, other = (int(row[k]) for k in ("skipped_initial_backoff", "skipped_bursts",
                                                       "skipped_other"))
        assert initial + burst + other == metrics["skipped_steps"]
        # the descent: the steps before the scale first grows (or the first burst)
        grown = [s for s in range(2, steps + 1) if scale[s] > scale[s - 1]]
        descent = [s for s in range(1, min(grown + bursts[:1])) if overflow[s]]
        injected = json.loads(child.data.params["inject.overflow_steps"])
        if arm == "none":  # nothing injected, nothing skipped: overflowed updates are applied
            assert injected == [] and initial + burst + other == 0
        else:  # a scaler skips every overflowed step
            assert injected == bursts
            assert initial + burst + other == sum(overflow.values()) == metrics["overflow_count"]
            assert initial == len(descent) and burst == len(bursts) and all(overflow[s] for s in bursts)
        if arm in ("dynamic", "megatron"):  # from 2^24 and 2^32 the scale backs off at the start
            assert initial > 0 and overflow[1]

        # headroom: NaN exactly on the overflowed steps, which the percentiles leave out
        assert [s for s in headroom if math.isnan(headroom[s])] == [s for s in overflow if overflow[s]]
        clean = [headroom[s] for s in headroom if not overflow[s]]
        assert float(row["headroom_log2_median"]) == pytest.approx(np.median(clean), rel=1e-3)
        assert float(row["headroom_log2_p10"]) == pytest.approx(np.percentile(clean, 10), rel=1e-3)
        for key in ("underflow_fraction", "zero_fraction"):
            values = _metric(client, run_id, key)
            assert float(row[f"mean_{key}"]) == pytest.approx(
                np.mean([values[s] for s in values if not overflow[s]]), rel=1e-3, abs=1e-12)
        zeros[arm] = float(row["mean_zero_fraction"])

        # recovery: the steps after a burst that ran below the scale the burst interrupted
        for column, (first, last) in zip(("recovery_burst1", "recovery_burst2"),
                                         dynamic_window.bursts(bursts)):
            if arm == "none":
                assert row[column] == ""
                continue
            below = next((s - last - 1 for s in range(last + 1, steps + 1) if scale[s] >= scale[first - 1]),
                         None)
            assert row[column] == (str(below) if below is not None else "not within the run")
        assert float(row["eval_accuracy"]) == pytest.approx(metrics["eval_accuracy"], rel=1e-3)
        assert float(row["eval_loss"]) == pytest.approx(metrics["eval_loss"], rel=1e-3)

        # time per step: steps per second after the first epoch (its compilation), against dynamic's
        folder = str(tmp_path / "artifacts" / arm)
        summary = json.loads(Path(client.download_artifacts(run_id, "summary.json", folder)).read_text())
        with open(client.download_artifacts(run_id, "history.csv", folder), newline="") as f:
            later = sum(1 for r in csv.DictReader(f) if int(r["epoch"]) > 1)
        speeds[arm] = later / sum(summary["epoch_seconds"][1:])
        assert float(row["step_time_vs_dynamic"]) == pytest.approx(speeds["dynamic"] / speeds[arm], rel=1e-3)

    # the baseline's scale is 1, so its gradients keep their size: more headroom than any scaler's
    assert _num(rows[("none", "float16")]["headroom_log2_median"]) > max(
        _num(rows[(a, "float16")]["headroom_log2_median"]) for a in arms if a != "none")
    # at O2 what float16 flushes is a zero: without a scale more of the gradient is
    assert zeros["none"] > max(zeros[a] for a in arms if a != "none")
    assert rows[("fixed_drop_65536", "float16")]["recovery_burst1"] == "0"  # a fixed scale never drops
    assert rows[("dynamic", "float16")]["recovery_burst1"] == "not within the run"  # window 2000

    # bfloat16: the probe of the workload's config finds it runs, emulated on this CPU (test_bfloat16)
    bf16 = rows[("none", "bfloat16")]
    assert bf16["seeds"] == "0"
    assert bf16["note"] == "amp.dtype=bfloat16 runs on CPU, emulated (docs/casts.md) (not swept)"

    # lsexp report redraws the study from the store alone, the bfloat16 probe outside Hydra included
    again = subprocess.run([sys.executable, "-m", "lsexp.report.cli", parent.info.run_id, "--tracking-uri",
                            f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "again")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    (first,) = tmp_path.glob("multirun/*/*/study/scalers.csv")
    assert (tmp_path / "again" / "scalers.csv").read_text() == first.read_text()
