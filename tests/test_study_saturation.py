"""experiment=saturation: its arms as Hydra composes them, and the study run for real as a small sweep, its
table checked against the runs' own histories."""

import csv
import math
import statistics

import pytest

from conftest import compose_cfg
from helpers.study_sweep import cell_values, interval, study_sweep, study_table

MODES = {"infnan": ("infnan", True), "saturation": ("saturation", True),
         "saturation_values": ("saturation", False)}


def test_each_overflow_arm_sets_the_mode_and_its_check():
    from lsexp.report.studies import saturation

    swept = compose_cfg("experiment=saturation", hydra_cfg=True).hydra.sweeper.params
    assert swept["overflow"].split(",") == list(MODES) == saturation.MODES
    assert swept["arm"].split(",") == ["fixed_drop_256", "fixed_drop_65536", "dynamic", "dynamic_hysteresis"]
    assert len(swept["train.seed"].split(",")) >= 3
    for arm, (mode, check) in MODES.items():
        cfg = compose_cfg("experiment=saturation", f"overflow={arm}")
        assert (cfg.device.overflow_mode, cfg.device.status_check, cfg.amp.level) == (mode, check, "O2")


def _check_cell(cell: str, values):
    """A table cell against the values it sums up: `mean ± std [low, high]`, or `mean ± 0` where the
    seeds agree."""
    if statistics.pstdev(values) == 0:
        assert cell == f"{values[0]:.4g} ± 0", cell
    else:
        assert cell_values(cell) == pytest.approx(interval(values), rel=1e-3)


def _history(client, run, folder):
    path = client.download_artifacts(run.info.run_id, "history.csv", str(folder))
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_saturation_study_reports_the_silent_failure_against_infnan(tmp_path):
    client, parent, children = study_sweep(
        tmp_path, "experiment=saturation", "train.max_steps=12",
        'hydra.sweeper.params={arm:"dynamic",train.seed:"1,2",inject.overflow_steps:"[6]"}')
    assert len(children) == 2 * 3
    rows = {r["overflow"]: r for r in study_table(tmp_path, client, parent, "saturation")}
    assert set(rows) == set(MODES)

    def runs(arm):
        return sorted((c for c in children if f"overflow={arm}" in c.data.tags["lsexp.overrides"].split()),
                      key=lambda c: c.data.params["train.seed"])

    histories = {arm: [_history(client, r, tmp_path / f"{arm}{i}") for i, r in enumerate(runs(arm))]
                 for arm in MODES}
    # the flag's check skips what infnan skips; the values-only check skips nothing and misses every flag
    for arm in MODES:
        skipped = [float(h[-1]["skipped_steps"]) for h in histories[arm]]
        _check_cell(rows[arm]["skipped_updates"], skipped)
    assert [h[-1]["skipped_steps"] for h in histories["saturation"]] == \
        [h[-1]["skipped_steps"] for h in histories["infnan"]]
    missed = [sum(1 for r in h if float(r["float_status"]) == 1 and r["overflow"] == "0")
              for h in histories["saturation_values"]]
    assert min(missed) >= 1  # step 6 at least
    _check_cell(rows["saturation_values"]["undetected_overflows"], missed)
    _check_cell(rows["saturation"]["undetected_overflows"], [0, 0])
    gaps = [max(abs(float(a["loss"]) - float(b["loss"])) if math.isfinite(float(a["loss"])) else math.inf
                for a, b in zip(mine, ref))
            for mine, ref in zip(histories["saturation_values"], histories["infnan"])]
    assert min(gaps) > 0
    _check_cell(rows["saturation"]["loss_deviation_max"], [0.0, 0.0])
