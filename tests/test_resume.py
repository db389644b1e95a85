"""sweep.resume: a sweep interrupted (Ctrl-C, or killed outright) and run again with its old folder trains
only what had not finished, under the same parent, and ends as the uninterrupted sweep would have."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from helpers.mlflow_store import FAST, runs, store
from helpers.processes import lsexp_processes_in

# 3 strategies x 2 seeds at O2, 60 steps (an epoch of the default data is 32 steps)
SWEEP = ["-m", "loss_scale=fixed_drop,dynamic,dynamic_hysteresis", "train.seed=1,2", "amp=O2",
         "train.max_steps=60", *FAST]


def _sweep(root: Path, *extra: str):
    return [*SWEEP, f"tracking.uri={store(root)}", f"hydra.sweep.dir={root / 'sweep'}", *extra]


def _start(root: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lsexp", *args], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_for_job(uri: str, job: int, timeout: float = 600) -> None:
    """Until job `job`'s run has its first epoch's steps in the store: it is training."""
    from mlflow.tracking import MlflowClient

    client, deadline = MlflowClient(uri), time.time() + timeout
    while time.time() < deadline:
        exp = client.get_experiment_by_name("lsexp")
        if exp is not None:
            mine = client.search_runs([exp.experiment_id], f"tags.`lsexp.job` = '{job}'")
            if mine and client.get_metric_history(mine[0].info.run_id, "loss"):
                return
        time.sleep(0.2)
    raise AssertionError(f"job {job} never started")


def _children(uri):
    _, _, found = runs(uri)
    parents = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    return parents, [r for r in found if "mlflow.parentRunId" in r.data.tags]


def _histories(root: Path):
    """history.csv by job, named by its overrides (the folder's name without the job number)."""
    return {p.parent.name.split("-", 1)[1]: p.read_bytes() for p in (root / "sweep").glob("*/history.csv")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same sweep, never interrupted, for the jobs from the third on (the first two never stop)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    args = [a.replace("fixed_drop,", "") for a in _sweep(root)]  # dynamic,dynamic_hysteresis x 2 seeds
    out = run_cli(*args, cwd=root, timeout=1200)
    assert out.returncode == 0, out.stderr
    return root


def test_a_sweep_interrupted_in_its_fourth_job_resumes_to_the_uninterrupted_sweep(tmp_path, uninterrupted):
    uri = store(tmp_path, create=True)
    proc = _start(tmp_path, *_sweep(tmp_path))
    try:
        # 60 steps take ~3 s: stop job 3 as it starts to build its step, once its run is open (the job
        # writes config.yaml beside the run's Open message)
        deadline = time.time() + 600
        while not list((tmp_path / "sweep").glob("3-*/config.yaml")) and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode != 0, output
    (parent,), children = _children(uri)
    assert parent.info.status == "KILLED"
    assert sorted((c.data.tags["lsexp.job"], c.info.status) for c in children) == [
        ("0", "FINISHED"), ("1", "FINISHED"), ("2", "FINISHED"), ("3", "KILLED")], output
    finished = {c.info.run_id for c in children if c.info.status == "FINISHED"}

    out = run_cli(*_sweep(tmp_path, "sweep.resume=true"), cwd=tmp_path, timeout=1200)
    assert out.returncode == 0, out.stderr
    # jobs 0-2 say they were skipped, and only jobs 3-5 trained
    said = out.stdout + out.stderr
    assert said.count("with the same config (sweep.resume); not trained again") == 3, said
    assert said.count(" 60 steps, final loss") == 3, said
    (again,), children = _children(uri)
    assert again.info.run_id == parent.info.run_id and again.info.status == "FINISHED"
    current = [c for c in children if c.data.tags.get("lsexp.superseded") != "true"]
    superseded = [c for c in children if c.data.tags.get("lsexp.superseded") == "true"]
    assert sorted(c.data.tags["lsexp.job"] for c in current) == ["0", "1", "2", "3", "4", "5"]
    assert {c.info.status for c in current} == {"FINISHED"}
    assert [(c.data.tags["lsexp.job"], c.info.status) for c in superseded] == [("3", "KILLED")]
    assert finished <= {c.info.run_id for c in current}, "a finished job was trained again"
    # the killed job's files (config.yaml at least: stopped while it built its step, it had no steps)
    # are kept beside its rerun's
    (aside,) = (tmp_path / "sweep").glob("3-*/superseded/*/config.yaml")
    assert aside.parent.name == superseded[0].info.run_id
    resumed, reference = _histories(tmp_path), _histories(uninterrupted)
    assert len(resumed) == 6 and len(reference) == 4  # jobs 2-5 of the six
    assert {job: resumed[job] for job in reference} == reference
    client, _, _ = runs(uri)
    table = client.download_artifacts(parent.info.run_id, "comparison.csv")
    assert len(Path(table).read_text().strip().splitlines()) == 1 + 3  # a row per group, seeds within


@pytest.mark.slow  # a 2-job sweep twice: in CI's slow step
def test_runs_left_running_by_a_lost_machine_rerun_and_nothing_stays_running(tmp_path):
    uri = store(tmp_path, create=True)
    args = ["-m", "loss_scale=fixed_drop,dynamic", "amp=O2", "train.epochs=30", *FAST, f"tracking.uri={uri}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = _start(tmp_path, *args)
    try:
        _wait_for_job(uri, 1)
        # the machine lost: the command, its job and the tracking workers (in sessions of their own, which
        # end a job's run even when the job is killed outright) all at once, so nothing ends a run
        for pid in [proc.pid, *lsexp_processes_in(tmp_path)]:
            os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    (parent,), children = _children(uri)
    assert parent.info.status == "RUNNING"
    assert sorted((c.data.tags["lsexp.job"], c.info.status) for c in children) == [("0", "FINISHED"),
                                                                                    ("1", "RUNNING")]
    out = run_cli(*args, "sweep.resume=true", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    (parent,), children = _children(uri)
    assert parent.info.status == "FINISHED"
    assert sorted((c.data.tags["lsexp.job"], c.info.status, c.data.tags.get("lsexp.superseded", ""))
                  for c in children) == [("0", "FINISHED", ""), ("1", "FINISHED", ""),
                                         ("1", "KILLED", "true")]


@pytest.mark.slow  # a 2-job sweep: in CI's slow step
def test_a_changed_override_is_refused_in_one_line_and_the_store_is_unchanged(tmp_path):
    uri = store(tmp_path)
    args = ["-m", "loss_scale=fixed_drop,dynamic", "train.max_steps=4", *FAST, f"tracking.uri={uri}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert run_cli(*args, "amp=O2", cwd=tmp_path).returncode == 0
    client, _, before = runs(uri)
    out = run_cli(*args, "amp=O3", "sweep.resume=true", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.strip().splitlines() if line.startswith("lsexp")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "job 0 (loss_scale=fixed_drop" in lines[0] and "amp.level=O2, and now has amp.level=O3" in lines[0]
    _, _, after = runs(uri)
    assert [(r.info.run_id, r.info.status, r.info.end_time, r.data.tags) for r in after] == [
        (r.info.run_id, r.info.status, r.info.end_time, r.data.tags) for r in before]


@pytest.mark.parametrize("extra,message", [
    ([], "holds no lsexp sweep"),
    (["tracking=none"], "sweep.resume=true with tracking.backend=none"),
    (["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2"], "Optuna's study lives in the sweep's memory"),
])
def test_resume_without_a_sweep_to_resume_is_one_line(tmp_path, extra, message):
    out = run_cli("-m", "loss_scale=fixed_drop,dynamic", "sweep.resume=true",
                  f"tracking.uri={store(tmp_path)}", f"hydra.sweep.dir={tmp_path / 'nothing'}", *extra, *FAST,
                  cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert message in out.stderr
    assert not (tmp_path / "nothing").exists() and not (tmp_path / "m.db").exists()
