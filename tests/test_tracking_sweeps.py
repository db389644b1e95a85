"""A sweep in MLflow: one parent run, its children, their comparison, and `lsexp report` redrawing it
from the store alone."""

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import made_once, run_cli
from helpers.mlflow_store import FAST, job_dirs, runs, store
from lsexp.training.history import read_history


@pytest.fixture(scope="session")
def basic_sweep(tmp_path_factory):
    def make(root):
        out = run_cli("-m", "loss_scale=fixed_drop,fixed_nodrop,dynamic", "amp=O2", "train.max_steps=20",
                      "telemetry=grads", f"tracking.uri={store(root)}", *FAST, cwd=root)
        assert out.returncode == 0, out.stderr

    root = made_once(tmp_path_factory, "sweep", make)
    return root, store(root)


@pytest.mark.slow  # its shared sweep is ~60 s; in CI's slow session: the default suite stays under 10 minutes
def test_sweep_has_one_parent_and_three_finished_children(basic_sweep):
    root, uri = basic_sweep
    client, _, found = runs(uri)
    parents = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3 and len(found) == 4
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["loss_scale"] == "fixed_drop,fixed_nodrop,dynamic"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert {c.info.status for c in children} == {"FINISHED"}

    by_overrides = {c.data.tags["lsexp.overrides"]: c for c in children}
    for job in job_dirs(root):
        overrides = " ".join(_overrides(job))
        child = by_overrides[overrides]
        scales = sorted((m.step, m.value) for m in client.get_metric_history(child.info.run_id, "loss_scale"))
        assert scales == [(r["step"], r["loss_scale"]) for r in read_history(job / "history.csv")]
        assert len(scales) == 20
        log2 = sorted((m.step, m.value)
                      for m in client.get_metric_history(child.info.run_id, "loss_scale_log2"))
        # the UI's linear chart separates them
        assert log2 == [(step, math.log2(value)) for step, value in scales]
    # The UI's run column shows ~15 characters: a child is named by the options its sweep varies.
    assert sorted(c.info.run_name for c in children) == ["dynamic", "fixed_drop", "fixed_nodrop"]

    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"comparison.png", "comparison.csv", "comparison.md"} <= artifacts
    table = list(csv.DictReader(open(client.download_artifacts(parent.info.run_id, "comparison.csv"))))
    assert sorted(r["choices"] for r in table) == ["loss_scale=dynamic", "loss_scale=fixed_drop",
                                                   "loss_scale=fixed_nodrop"]
    dynamic = next(r for r in table if r["choices"] == "loss_scale=dynamic")
    assert int(dynamic["skipped_steps"]) > 0 and dynamic["diverged"] == "false"
    # With telemetry the table says what float16 broke: 2^24 overflows it at first, 128 never here.
    fixed = next(r for r in table if r["choices"] == "loss_scale=fixed_drop")
    assert float(dynamic["mean_overflow_fraction"]) > 0 and float(fixed["mean_overflow_fraction"]) == 0
    assert "mean_underflow_fraction" in open(
        client.download_artifacts(parent.info.run_id, "comparison.md")).read()


def _overrides(job: Path):
    import yaml

    return yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_report_redraws_a_sweep_from_the_store_alone(basic_sweep, tmp_path):
    root, uri = basic_sweep
    client, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    logged = open(client.download_artifacts(parent.info.run_id, "comparison.csv")).read()
    for target in (parent.info.run_id, "lsexp"):
        out = subprocess.run([sys.executable, "-m", "lsexp.report.cli", target, "--tracking-uri", uri,
                              "--out", str(tmp_path / target)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / target / "comparison.csv").read_text() == logged
        assert (tmp_path / target / "comparison.png").stat().st_size > 10_000
    # the console script takes the same arguments
    out = subprocess.run([str(Path(sys.executable).parent / "lsexp"), "report", "no-such-experiment",
                          "--tracking-uri", uri], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no-such-experiment" in out.stderr


def test_loss_scale_axis_reads_in_powers_of_two(tmp_path):
    from lsexp.figures import RunFigure

    rows = [{"step": i, "loss": 2.3, "loss_scale": 2.0 ** (24 - i // 10), "overflow": int(i % 10 == 0)}
            for i in range(1, 60)]
    RunFigure("dynamic").save(rows, tmp_path / "f.png")
    import matplotlib.pyplot as plt

    assert not plt.get_fignums() and (tmp_path / "f.png").stat().st_size > 10_000
    from lsexp.figures import power_of_two

    assert [power_of_two(v) for v in (2.0 ** 24, 128.0, 1.0, 0.25, 3.0)] == ["2²⁴", "2⁷", "2⁰", "2⁻²", "3"]


@pytest.mark.slow  # 8 jobs, 4 at once; a 2-job joblib sweep to SQLite is in test_device
def test_parallel_joblib_sweep_of_8_jobs_loses_nothing(tmp_path):
    uri = store(tmp_path)
    out = run_cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4",
                  "loss_scale=fixed_drop,fixed_nodrop,dynamic,dynamic_seed_blog", "amp=O0,O2",
                  "train.max_steps=8", f"tracking.uri={uri}", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "locked" not in out.stderr.lower()
    client, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 8 and len(found) == 9
    assert {c.info.status for c in children} == {"FINISHED"} and parent.info.status == "FINISHED"
    for child in children:
        for key in ("loss", "loss_scale", "overflow"):
            assert [m.step for m in sorted(client.get_metric_history(child.info.run_id, key),
                                           key=lambda m: m.step)] == list(range(1, 9))


@pytest.mark.slow  # 9 jobs; sweeps as parent and children are in the default suite below
def test_seed_blog_experiment_logs_as_a_sweep(tmp_path):
    uri = store(tmp_path)
    out = run_cli("experiment=seed_blog", "amp=O0", "train.max_steps=3", f"tracking.uri={uri}", *FAST,
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    assert parent.data.params["loss_scale"] == "fixed_drop,fixed_nodrop,dynamic_seed_blog"
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.data.params["loss_scale.scale_factor"] for c in children
                  if "loss_scale.scale_factor" in c.data.params) == ["4"]
    assert {c.info.status for c in children} == {"FINISHED"} and len(children) == 3


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_failing_job_is_failed_and_the_next_job_starts_clean(tmp_path):
    uri = store(tmp_path)
    # A 3-class head on 10-class labels passes validation but fails inside MindSpore.
    out = run_cli("-m", "model.num_class=3,10", "train.max_steps=3", f"tracking.uri={uri}", *FAST,
                  cwd=tmp_path)
    assert out.returncode != 0
    _, _, found = runs(uri)
    parent = next(r for r in found if r.data.tags.get("lsexp.sweep") == "true")
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [c.info.status for c in children] == ["FAILED", "FINISHED"]
    assert "lsexp.error" in children[0].data.tags
    assert parent.info.status == "FAILED"
    assert "RUNNING" not in {r.info.status for r in found}
