"""experiment=eight_bit and eight_bit_gpt: their arms as Hydra composes them, and the study run for real as
a small sweep, its table checked against the runs' own metrics and precision tables."""

import csv

import numpy as np
import pytest

from conftest import compose_cfg
from helpers.study_sweep import cell_values, interval, study_sweep, study_table

# each arm: amp level, loss_scale option, precision option
ARMS = {
    "float32": ("O0", "none", "none"),
    "dynamic": ("O2", "dynamic", "none"),
    "bfloat16": ("O2", "none", "none"),
    "fp8_delayed": ("O2", "dynamic", "fp8_delayed"),
    "fp8_current": ("O2", "dynamic", "fp8_current"),
    "mxfp8": ("O2", "dynamic", "mxfp8"),
    "hif8_current": ("O2", "dynamic", "hif8_current"),
}


@pytest.mark.parametrize("experiment,model,seeds", [("eight_bit", "mlp", 5), ("eight_bit_gpt", "gpt", 3)])
def test_each_arm_composes_its_precision_recipe_on_float16(experiment, model, seeds):
    from lsexp.report.studies import eight_bit

    swept = compose_cfg(f"experiment={experiment}", hydra_cfg=True).hydra.sweeper.params
    assert swept["arm"].split(",") == list(ARMS) == eight_bit.ARMS
    assert swept["train.seed"].split(",") == [str(s) for s in range(1, seeds + 1)]
    for arm, (level, option, precision) in ARMS.items():
        cfg = compose_cfg(f"experiment={experiment}", f"arm={arm}", hydra_cfg=True)
        choices = cfg.hydra.runtime.choices
        assert (choices.loss_scale, choices.precision) == (option, precision)
        assert (cfg.amp.level, cfg.amp.dtype) == (level, "bfloat16" if arm == "bfloat16" else "float16")
        assert cfg.study == "eight_bit" and cfg.model._target_.split(".")[2] == model


def _flushed(client, run_id, folder):
    path = client.download_artifacts(run_id, "telemetry/precision.csv", str(folder))
    values = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["overflow"] == "0":
                values.setdefault(row["tensor"], []).append(float(row["flushed_fraction"]))
    return {name: float(np.mean(v)) for name, v in values.items()}


@pytest.mark.slow
def test_eight_bit_study_sets_each_recipe_against_float32_and_float16(tmp_path):
    arms = ["float32", "dynamic", "bfloat16", "fp8_delayed", "mxfp8"]
    client, parent, children = study_sweep(
        tmp_path, "experiment=eight_bit", "train.max_steps=60",
        f'hydra.sweeper.params={{arm:"{",".join(arms)}",train.seed:"1,2"}}')
    assert len(children) == 2 * len(arms)
    rows = {(r["arm"], r["dtype"]): r for r in study_table(tmp_path, client, parent, "eight_bit")}
    # bfloat16 swept as an arm: its rows are its runs', and no probe's note row
    dtypes = {"float32": "float32", "bfloat16": "bfloat16"}
    assert set(rows) == {(a, dtypes.get(a, "float16")) for a in arms}

    def runs(arm):
        return sorted((c for c in children if f"arm={arm}" in c.data.tags["lsexp.overrides"].split()),
                      key=lambda c: c.data.params["train.seed"])

    losses = {arm: [c.data.metrics["eval_loss"] for c in runs(arm)] for arm in arms}
    for (arm, _), row in rows.items():
        assert row["seeds"] == "2"
        assert cell_values(row["eval_loss"]) == pytest.approx(interval(losses[arm]), rel=1e-3)
        for against, column in (("float32", "vs_float32"), ("dynamic", "vs_float16")):
            if arm in ("float32", against) or (column == "vs_float16" and arm == "dynamic"):
                assert row[column] == ""
                continue
            low, high = interval(losses[arm])[2:]
            ref = interval(losses[against])
            assert row[column] == ("above" if low > ref[3] else "below" if high < ref[2] else "overlaps")
        if arm in ("fp8_delayed", "mxfp8"):  # the most flushed tensors, from each seed's precision.csv
            flushed = [_flushed(client, c.info.run_id, tmp_path / "dl" / c.info.run_id) for c in runs(arm)]
            means = {name: np.mean([seed[name] for seed in flushed]) for name in flushed[0]}
            top = sorted(means.items(), key=lambda kv: -kv[1])[:3]
            shown = [item.rsplit(" ", 1) for item in row["most_flushed"].split("; ")]
            assert [name for name, _ in shown] == [name for name, value in top if value > 0]
            assert all(float(v) == pytest.approx(means[name], rel=1e-2) for name, v in shown)
            assert "." in row["step_time_vs_float16"]  # a ratio per seed, against the float16 arm's
        else:
            assert row["most_flushed"] == "" and row["precision"] == "none"
    assert rows[("bfloat16", "bfloat16")]["skipped_updates"].startswith("0")  # no scale, nothing skipped
