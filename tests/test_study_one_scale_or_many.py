"""experiment=one_scale_or_many: its arms as Hydra composes them, and the study run for real as a small
sweep, its table checked against the runs' own metrics and layer tables."""

import csv

import numpy as np
import pytest

from conftest import compose_cfg
from helpers.study_sweep import cell_values, interval, study_sweep, study_table

# each arm: its amp level, loss_scale option, model.scaling and amp.dtype
ARMS = {
    "float32": ("O0", "none", "standard", "float16"),
    "none": ("O2", "none", "standard", "float16"),
    "dynamic": ("O2", "dynamic", "standard", "float16"),
    "dynamic_hysteresis": ("O2", "dynamic_hysteresis", "standard", "float16"),
    "per_layer": ("O2", "per_layer", "standard", "float16"),
    "per_layer_4096": ("O2", "per_layer", "standard", "float16"),
    "unit_none": ("O2", "none", "unit", "float16"),
    "unit_dynamic": ("O2", "dynamic", "unit", "float16"),
    "bfloat16": ("O2", "none", "standard", "bfloat16"),
}


@pytest.mark.parametrize("experiment,model,tokens", [
    ("one_scale_or_many", "mlp", [2 ** 22, 2 ** 24]),
    ("one_scale_or_many_gpt", "gpt", [2 ** 18, 2 ** 22]),  # per_layer refuses the GPT (no branch rule)
])
def test_each_arm_composes_its_precision_strategy_and_scaling(experiment, model, tokens):
    from lsexp.report.studies import one_scale_or_many

    swept = compose_cfg(f"experiment={experiment}", hydra_cfg=True).hydra.sweeper.params
    arms = [a for a in ARMS if model == "mlp" or not a.startswith("per_layer")]
    assert swept["arm"].split(",") == arms == [a for a in one_scale_or_many.ARMS if a in arms]
    assert swept["train.seed"].split(",") == ["1", "2", "3", "4", "5"]
    assert swept["train.mean_over_tokens"].split(",") == [str(n) for n in tokens]
    for arm in arms:
        level, option, scaling, dtype = ARMS[arm]
        cfg = compose_cfg(f"experiment={experiment}", f"arm={arm}", hydra_cfg=True)
        assert cfg.hydra.runtime.choices.loss_scale == option
        assert (cfg.amp.level, cfg.amp.dtype, cfg.model.scaling) == (level, dtype, scaling)
        assert cfg.study == "one_scale_or_many" and cfg.telemetry.layers
        assert cfg.model._target_.split(".")[2] == model
    assert compose_cfg("experiment=one_scale_or_many", "arm=per_layer_4096").loss_scale.init_scale == 4096


@pytest.mark.slow
def test_the_study_sets_each_arm_against_float32_with_the_layers_scales(tmp_path):
    arms = ["float32", "dynamic", "per_layer", "unit_none"]
    client, parent, children = study_sweep(
        tmp_path, "experiment=one_scale_or_many", "train.max_steps=30",
        f'hydra.sweeper.params={{arm:"{",".join(arms)}",train.mean_over_tokens:"16777216",train.seed:"1,2"}}')
    assert len(children) == 2 * len(arms)
    rows = {r["arm"]: r for r in study_table(tmp_path, client, parent, "one_scale_or_many")}
    assert list(rows) == arms and {r["N"] for r in rows.values()} == {"2^24"}

    def runs(arm):
        return sorted((c for c in children if f"arm={arm}" in c.data.tags["lsexp.overrides"].split()),
                      key=lambda c: c.data.params["train.seed"])

    losses = {arm: [c.data.metrics["eval_loss"] for c in runs(arm)] for arm in arms}
    reference = interval(losses["float32"])
    for arm, row in rows.items():
        assert row["seeds"] == "2"
        assert cell_values(row["eval_loss"]) == pytest.approx(interval(losses[arm]), rel=1e-3, abs=1e-4)
        if arm != "float32":
            low, high = interval(losses[arm])[2:]
            assert row["vs_float32"] == ("above" if low > reference[3] else "below" if high < reference[2]
                                         else "overlaps")
        # each layer's scale under per_layer, from the runs' own layers.csv; none under another strategy
        scales = []
        for c in runs(arm):
            path = client.download_artifacts(c.info.run_id, "telemetry/layers.csv",
                                             str(tmp_path / c.info.run_id))
            with open(path, newline="") as f:
                table = [r for r in csv.DictReader(f) if r["overflow"] == "0"]
            scales.append({name: np.mean([float(r["layer_scale"]) for r in table if r["layer"] == name])
                           for name in dict.fromkeys(r["layer"] for r in table)} if "layer_scale" in table[0]
                          else {})
        shown = (dict(item.rsplit(" ", 1) for item in row["layer_scales"].split("; "))
                 if row["layer_scales"] else {})
        assert list(shown) == list(scales[0])
        for name, value in shown.items():
            assert float(value) == pytest.approx(np.mean([s[name] for s in scales]), rel=1e-3)
        speed = np.mean([c.data.metrics["steps_per_second"] for c in runs(arm)])
        dynamic = np.mean([c.data.metrics["steps_per_second"] for c in runs("dynamic")])
        assert float(row["time_per_step_vs_dynamic"].rstrip("x")) == pytest.approx(dynamic / speed, abs=0.006)
    assert rows["per_layer"]["layer_scales"] and not rows["dynamic"]["layer_scales"]
