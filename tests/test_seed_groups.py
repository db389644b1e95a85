"""Seeds of one setting as one result: the lsexp.group and lsexp.seed tags, the grouped comparison with
mean, spread and Student's t interval, and the paired difference from a baseline group, from a real sweep
in a real MLflow store."""

import csv
import math
import statistics
import sys

import pytest

from conftest import made_once, run_cli
from helpers.mlflow_store import FAST, runs, store

SEEDS = ("1", "2", "3")


def _t(n):
    """Student's t for a 95% interval of a mean of n values, from scipy."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


@pytest.fixture(scope="session")
def seeded_sweep(tmp_path_factory):
    def make(root):
        out = run_cli("-m", "loss_scale=fixed_drop,dynamic", "train.seed=range(1,4)", "amp=O2",
                      "train.max_steps=8", "sweep.baseline='loss_scale=fixed_drop'",
                      f"tracking.uri={store(root)}", *FAST, cwd=root)
        assert out.returncode == 0, out.stderr

    root = made_once(tmp_path_factory, "seeded_sweep", make)
    return root, store(root)


def _table(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # a 6-job sweep (~50 s): in CI's slow session, the default suite stays under 10 minutes
def test_children_carry_their_group_and_seed(seeded_sweep):
    _, uri = seeded_sweep
    _, _, found = runs(uri)
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    assert sorted((c.data.tags["lsexp.group"], c.data.tags["lsexp.seed"]) for c in children) == [
        (group, seed) for group in ("loss_scale=dynamic", "loss_scale=fixed_drop") for seed in SEEDS]


@pytest.mark.slow  # a 6-job sweep (~50 s): in CI's slow session, the default suite stays under 10 minutes
def test_the_comparison_has_a_row_per_group_with_mean_spread_and_interval(seeded_sweep):
    _, uri = seeded_sweep
    client, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    assert parent.info.status == "FINISHED"
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    table = _table(client.download_artifacts(parent.info.run_id, "comparison.csv"))
    assert [r["group"] for r in table] == ["loss_scale=fixed_drop", "loss_scale=dynamic"]  # as typed
    for row in table:
        mine = [c for c in children if c.data.tags["lsexp.group"] == row["group"]]
        assert row["n"] == "3" and row["seeds"] == "1 2 3"
        for metric in ("final_loss", "skipped_steps", "overflow_count"):
            values = [c.data.metrics[metric] for c in mine]
            mean, std = statistics.fmean(values), statistics.stdev(values)
            assert float(row[f"{metric}_mean"]) == pytest.approx(mean, abs=1e-6)
            assert float(row[f"{metric}_std"] or 0) == pytest.approx(std, abs=1e-6)
            half = _t(3) * std / math.sqrt(3)
            assert float(row[f"{metric}_ci95_low"] or mean) == pytest.approx(mean - half, abs=1e-4)
            assert float(row[f"{metric}_ci95_high"] or mean) == pytest.approx(mean + half, abs=1e-4)
    # dynamic starts at 2^24 and skips its first steps at O2; a fixed 128 never does here
    dynamic = next(r for r in table if r["group"] == "loss_scale=dynamic")
    assert float(dynamic["skipped_steps_mean"]) > 0
    runs_table = _table(client.download_artifacts(parent.info.run_id, "comparison_runs.csv"))
    assert sorted((r["group"], r["seed"]) for r in runs_table) == sorted(
        (c.data.tags["lsexp.group"], c.data.tags["lsexp.seed"]) for c in children)
    md = open(client.download_artifacts(parent.info.run_id, "comparison.md")).read()
    assert " ± " in md and "| group | n | seeds |" in md


@pytest.mark.slow  # a 6-job sweep (~50 s): in CI's slow session, the default suite stays under 10 minutes
def test_the_paired_comparison_differs_seed_by_seed_from_the_baseline(seeded_sweep):
    _, uri = seeded_sweep
    client, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    by = {(c.data.tags["lsexp.group"], c.data.tags["lsexp.seed"]): c.data.metrics for c in children}
    (row,) = _table(client.download_artifacts(parent.info.run_id, "comparison_paired.csv"))
    assert (row["group"], row["baseline"], row["n_pairs"]) == ("loss_scale=dynamic", "loss_scale=fixed_drop",
                                                               "3")
    diffs = [by[("loss_scale=dynamic", s)]["final_loss"] - by[("loss_scale=fixed_drop", s)]["final_loss"]
             for s in SEEDS]
    assert float(row["final_loss_mean"]) == pytest.approx(statistics.fmean(diffs), abs=1e-6)
    half = _t(3) * statistics.stdev(diffs) / math.sqrt(3)
    assert float(row["final_loss_ci95_high"]) == pytest.approx(statistics.fmean(diffs) + half, abs=1e-4)


@pytest.mark.slow  # a 6-job sweep (~50 s): in CI's slow session, the default suite stays under 10 minutes
def test_report_redraws_the_groups_and_pairs_with_another_baseline(seeded_sweep, tmp_path):
    _, uri = seeded_sweep
    _, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    out = run_cli_report(parent.info.run_id, uri, tmp_path / "r", "--baseline", "loss_scale=dynamic")
    assert out.returncode == 0, out.stderr
    # the report prints the grouped table: a row per group, n=3, mean ± std [interval]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| loss_scale=")]
    assert [r.split(" | ")[:3] for r in rows[:2]] == [["| loss_scale=fixed_drop", "3", "1 2 3"],
                                                      ["| loss_scale=dynamic", "3", "1 2 3"]]
    assert all(" ± " in r and "[" in r for r in rows[:2])
    assert "paired with 'loss_scale=dynamic'" in out.stdout
    (row,) = _table(tmp_path / "r" / "comparison_paired.csv")
    assert row["group"] == "loss_scale=fixed_drop"
    bad = run_cli_report(parent.info.run_id, uri, tmp_path / "bad", "--baseline", "loss_scale=nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "'loss_scale=nope'" in bad.stderr and "'loss_scale=dynamic'" in bad.stderr
    assert not (tmp_path / "bad").exists()


def run_cli_report(run_id, uri, out, *args):
    import subprocess

    return subprocess.run([sys.executable, "-m", "lsexp", "report", run_id, "--tracking-uri", uri,
                           "--out", str(out), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("swept, baseline, named", [
    (["loss_scale=fixed_drop,dynamic"], "amp=O2", ["'loss_scale=fixed_drop'"]),
    # some of a group's choices may be named, but each with one of its swept values
    (["loss_scale=fixed_drop,dynamic", "amp=O2,O3"], "amp=O1",
     ["'loss_scale=fixed_drop amp=O2'", "'loss_scale=fixed_drop'"]),
])
def test_a_baseline_the_sweep_cannot_make_is_one_line_before_any_job(tmp_path, swept, baseline, named):
    out = run_cli("-m", *swept, "train.seed=1,2", f"sweep.baseline='{baseline}'",
                  f"tracking.uri={store(tmp_path)}", *FAST, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"sweep.baseline='{baseline}'" in out.stderr
    assert all(n in out.stderr for n in named), out.stderr
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "m.db").exists()


def test_a_baseline_of_some_choices_pairs_each_group_with_its_own():
    """`loss_scale=none` in a sweep over two workloads: each workload's dynamic runs are paired with that
    workload's none runs (as the recipes study needs), where a whole group is everyone's baseline."""
    from lsexp.report.groups import group_runs, paired_rows

    names, seeds, rows = [], [], []
    for workload, offset in (("a", 0.0), ("b", 10.0)):
        for strategy, shift in (("none", 0.0), ("dynamic", 0.5)):
            for seed in SEEDS:
                names.append(f"workload={workload} loss_scale={strategy}")
                seeds.append(seed)
                rows.append({"final_loss": offset + shift + int(seed) * 0.1 * (1 + (strategy == "dynamic"))})
    groups = group_runs(rows, names, seeds)
    paired = paired_rows(groups, "loss_scale=none", ["final_loss"])
    assert [(r["group"], r["baseline"], r["n_pairs"]) for r in paired] == [
        ("workload=a loss_scale=dynamic", "workload=a loss_scale=none", 3),
        ("workload=b loss_scale=dynamic", "workload=b loss_scale=none", 3)]
    # per seed: 0.5 + 0.1 * seed, so the mean is 0.7 on both workloads, not 10 apart
    assert [r["final_loss_mean"] for r in paired] == [pytest.approx(0.7), pytest.approx(0.7)]
    whole = paired_rows(groups, "workload=a loss_scale=none", ["final_loss"])
    assert [r["baseline"] for r in whole] == ["workload=a loss_scale=none"] * 3
    assert paired_rows(groups, "amp=O2", ["final_loss"]) == []
