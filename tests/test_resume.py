"""sweep.resume: a sweep interrupted (Ctrl-C, or killed outright) and run again with its old folder trains
only what had not finished, under the same parent, and ends as the uninterrupted sweep would have."""

from pathlib import Path

import pytest

from conftest import made_once, run_cli
from helpers.interrupted_sweep import check_interrupted, histories, interrupt, resume, sweep_args
from helpers.mlflow_store import FAST, runs, store


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same sweep, never interrupted, for the jobs from the third on (the first two never stop);
    made once for both pytest -n workers."""
    def make(root):
        # dynamic,dynamic_hysteresis x 2 seeds
        args = [a.replace("fixed_drop,", "") for a in sweep_args(root)]
        out = run_cli(*args, cwd=root, timeout=1200)
        assert out.returncode == 0, out.stderr

    return made_once(tmp_path_factory, "resume_uninterrupted", make)


@pytest.mark.slow  # since 2026-12-06: the default suite took 760 s on a 2-core AMD EPYC (docs/testing.md)
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_a_sweep_stopped_in_its_fourth_job_resumes_to_the_uninterrupted_sweep(tmp_path, uninterrupted, how):
    """SIGINT: Ctrl-C; SIGKILL (slow: in CI's slow session): a lost machine, which leaves runs RUNNING."""
    args = sweep_args(tmp_path)
    output = interrupt(tmp_path, args, how)
    finished = check_interrupted(store(tmp_path), how, output)
    assert finished == {"0", "1", "2"}, output[-5000:]  # the basic launcher runs one job at a time
    resume(tmp_path, args, finished)
    # the stopped job's files (config.yaml at least: stopped while it built its step, it had no steps)
    # are kept beside its rerun's, under the superseded run's id
    (aside,) = (tmp_path / "sweep").glob("3-*/superseded/*/config.yaml")
    client, _, found = runs(store(tmp_path))
    (stopped,) = [r for r in found if r.data.tags.get("lsexp.superseded") == "true"]
    assert aside.parent.name == stopped.info.run_id
    resumed, reference = histories(tmp_path), histories(uninterrupted)
    assert len(resumed) == 6 and len(reference) == 4  # jobs 2-5 of the six
    assert {job: resumed[job] for job in reference} == reference
    (parent,) = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    table = client.download_artifacts(parent.info.run_id, "comparison.csv")
    assert len(Path(table).read_text().strip().splitlines()) == 1 + 3  # a row per group, seeds within


@pytest.mark.slow  # a 2-job sweep: in CI's slow session
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
