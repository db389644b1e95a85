"""experiment=large_batch and large_batch_gpt: their arms as Hydra composes them, and the study run for real
as a small sweep, its table checked against the runs' own metrics, histories and layer tables."""

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_cfg
from helpers.study_sweep import cell_values, interval, study_sweep, study_table

# each arm: its amp level and the loss_scale option it selects
ARMS = {
    "float32": ("O0", "none"),
    "none": ("O2", "none"),
    "bfloat16": ("O2", "none"),
    "fixed_drop_256": ("O2", "fixed_drop"),
    "fixed_drop_65536": ("O2", "fixed_drop"),
    "dynamic": ("O2", "dynamic"),
    "dynamic_hysteresis": ("O2", "dynamic_hysteresis"),
    "amax_history_margin0": ("O2", "amax_history"),
}


@pytest.mark.parametrize("experiment,model", [("large_batch", "mlp"), ("large_batch_gpt", "gpt")])
def test_each_arm_composes_its_precision_and_strategy_and_the_sweep_spans_the_tokens(experiment, model):
    from lsexp.report.studies import large_batch

    swept = compose_cfg(f"experiment={experiment}", hydra_cfg=True).hydra.sweeper.params
    assert swept["arm"].split(",") == list(ARMS) == large_batch.ARMS
    assert swept["train.seed"].split(",") == ["1", "2", "3", "4", "5"]
    tokens = swept["train.mean_over_tokens"].split(",")
    assert tokens[0] == "null" and max(int(n) for n in tokens[1:]) >= 2 ** 22
    for arm, (level, option) in ARMS.items():
        cfg = compose_cfg(f"experiment={experiment}", f"arm={arm}", hydra_cfg=True)
        assert cfg.hydra.runtime.choices.loss_scale == option
        assert (cfg.amp.level, cfg.amp.dtype) == (level, "bfloat16" if arm == "bfloat16" else "float16")
        assert cfg.study == "large_batch" and cfg.telemetry.layers
        assert cfg.model._target_.split(".")[2] == model
        assert cfg.optimizer._target_ == "mindspore.nn.AdamWeightDecay"  # eps / K keeps float32 unchanged
    assert compose_cfg(f"experiment={experiment}", "arm=fixed_drop_256").loss_scale.loss_scale == 256.0


def _lost(client, run_id, folder):
    path = client.download_artifacts(run_id, "telemetry/layers.csv", str(folder))
    lost = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["overflow"] == "0":
                lost.setdefault(row["layer"], []).append(float(row["underflow_fraction"])
                                                         + float(row["zero_fraction"]))
    return {layer: float(np.mean(v)) for layer, v in lost.items()}


@pytest.mark.slow
def test_large_batch_study_sets_float16_with_and_without_a_scale_against_float32(tmp_path):
    arms = ["float32", "none", "dynamic"]  # the control, the effect and its cure: 12 runs
    client, parent, children = study_sweep(
        tmp_path, "experiment=large_batch", "train.max_steps=60",
        f'hydra.sweeper.params={{arm:"{",".join(arms)}",train.mean_over_tokens:"null,16777216",'
        'train.seed:"1,2"}')
    assert len(children) == 2 * 2 * len(arms)
    rows = {(r["N"], r["arm"], r["dtype"]): r for r in study_table(tmp_path, client, parent, "large_batch")}
    cells = {(n, a, "float32" if a == "float32" else "float16") for n in ("T = 2^5", "2^24") for a in arms}
    assert set(rows) == cells | {("", "none", "bfloat16")}

    def runs(n, arm):
        return sorted((c for c in children if f"arm={arm}" in c.data.tags["lsexp.overrides"].split()
                       and c.data.params["train.mean_over_tokens"] == n),
                      key=lambda c: c.data.params["train.seed"])

    losses = {}
    for (n_label, arm, _), row in rows.items():
        if not arm or n_label == "":
            continue
        mine = runs("None" if n_label.startswith("T") else "16777216", arm)
        assert [c.data.params["train.seed"] for c in mine] == ["1", "2"] and row["seeds"] == "2"
        assert float(row["K"]) == (1.0 if n_label.startswith("T") else 2 ** 24 / 32)
        values = [c.data.metrics["eval_loss"] for c in mine]
        losses[(n_label, arm)] = values
        if all(math.isfinite(v) for v in values) and values[0] != values[1]:
            assert cell_values(row["eval_loss"]) == pytest.approx(interval(values), rel=1e-3, abs=1e-4)
        skipped = [c.data.metrics["skipped_steps"] for c in mine]
        assert row["skipped_updates"].split(" ")[0] == f"{np.mean(skipped):.4g}"
        # the first growth, from the logged scale: dynamic's window is 2000 steps, longer than the run
        for c in mine:
            scale = [m.value for m in sorted(client.get_metric_history(c.info.run_id, "loss_scale"),
                                             key=lambda m: m.step)]
            assert all(b <= a for a, b in zip(scale, scale[1:]))
        assert row["steps_to_first_growth"] == ("not within the run" if arm == "dynamic" else "-")
        # the lost fraction per layer, from each seed's telemetry/layers.csv
        lost = [_lost(client, c.info.run_id, tmp_path / "dl" / c.info.run_id) for c in mine]
        shown = dict(item.rsplit(" ", 1) for item in row["lost_fraction_by_layer"].split("; "))
        assert list(shown) == list(lost[0])
        for layer, value in shown.items():
            assert float(value) == pytest.approx(np.mean([seed[layer] for seed in lost]), abs=6e-4)

    # the float32 control, inside the study: the same held-out loss at every N
    assert losses[("T = 2^5", "float32")] == losses[("2^24", "float32")]
    # the effect: at N = 2^24 float16 without a scale ends wholly above float32, and the dynamic scale
    # keeps what none flushes
    reference = interval(losses[("2^24", "float32")])
    assert rows[("2^24", "none", "float16")]["vs_float32"] == "above"
    assert min(losses[("2^24", "none")]) > reference[3]
    none_lost = dict(item.rsplit(" ", 1) for item in rows[("2^24", "none", "float16")]
                     ["lost_fraction_by_layer"].split("; "))
    dynamic_lost = dict(item.rsplit(" ", 1) for item in rows[("2^24", "dynamic", "float16")]
                        ["lost_fraction_by_layer"].split("; "))
    assert set(none_lost) == set(dynamic_lost) and all(float(none_lost[k]) > float(dynamic_lost[k])
                                                        for k in none_lost)
    for key, row in rows.items():  # vs_float32 is where the interval lies against float32's at that N
        if key[1] in ("", "float32") or key[0] == "":
            continue
        values = losses[(key[0], key[1])]
        ref = interval(losses[(key[0], "float32")])
        if all(math.isfinite(v) for v in values) and values[0] != values[1]:
            low, high = interval(values)[2:]
            expected = "above" if low > ref[3] else "below" if high < ref[2] else "overlaps"
            assert row["vs_float32"] == expected

    # bfloat16: the refusal as the command itself gives it, probed outside the sweep
    assert "bfloat16" in rows[("", "none", "bfloat16")]["note"]

    # lsexp report redraws the study from the store alone
    again = subprocess.run([sys.executable, "-m", "lsexp.report.cli", parent.info.run_id, "--tracking-uri",
                            f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "again")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    (first,) = tmp_path.glob("multirun/*/*/study/large_batch.csv")
    assert Path(tmp_path / "again" / "large_batch.csv").read_text() == first.read_text()
