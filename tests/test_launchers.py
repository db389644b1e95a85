"""Sweeps through Hydra's launcher plugins, for real: a local Ray cluster (and an existing one by
address), a single-node Slurm cluster started from Debian's packages (tests/helpers/slurm_cluster.py), and
submitit's local processes; real MindSpore jobs, a real MLflow store, real Hydra.

Marked ray and slurm, so deselected by default: `python -m pytest -m "ray or slurm"` (after
`pip install -e ".[ray,slurm]"` and `apt-get install -y slurmctld slurmd slurm-client munge`).
Without them the tests are skipped, saying why; with LSEXP_REQUIRE_LAUNCHERS=1 (CI) they fail instead.
"""

import csv
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import made_once, run_cli, stop_group
from helpers import slurm_cluster
from helpers.interrupted_sweep import check_interrupted, histories, interrupt, resume, sweep_args
from helpers.mlflow_store import FAST, job_dirs, runs, store
from helpers.required import unavailable
from lsexp.training.history import read_history

SWEEP = ["-m", "loss_scale=fixed_drop,dynamic", "amp=O2", "train.max_steps=20"]
# lsexp's lost-job grace, shortened so that the killed-job test stays lean
SLURM_ENV = {"LSEXP_SLURM_LOST_AFTER_S": "5"}


def _unavailable(reason: str):
    unavailable("LSEXP_REQUIRE_LAUNCHERS", reason)


def _need(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        _unavailable(f'{module} is not installed (pip install -e ".[{extra}]")')


@pytest.fixture(scope="session")
def slurm():
    reason = slurm_cluster.missing()
    if reason:
        _unavailable(reason)
    _need("submitit", "slurm")
    cluster = slurm_cluster.Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def ray_ready():
    _need("ray", "ray")
    _need("hydra_plugins.hydra_ray_launcher", "ray")


@pytest.fixture
def launcher(request):
    """(the launcher's overrides, the environment its sweep needs)"""
    name = request.param
    if name == "joblib":  # hydra-joblib-launcher is in the test extra
        return ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], {}
    if name == "ray":
        request.getfixturevalue("ray_ready")
        return ["hydra/launcher=ray"], {}
    if name == "submitit_local":
        _need("submitit", "slurm")
        return ["hydra/launcher=submitit_local"], {}
    cluster = request.getfixturevalue("slurm")
    return ["hydra/launcher=submitit_slurm"], dict(cluster.env(), **SLURM_ENV)


def _marks(name):
    return [pytest.mark.ray] if name == "ray" else [pytest.mark.slurm]


LAUNCHERS = [pytest.param(n, marks=_marks(n), id=n) for n in ("ray", "submitit_local", "submitit_slurm")]


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):
    """The same sweep under Hydra's basic launcher: what every other launcher must reproduce (made once
    for both pytest -n workers)."""
    def make(root):
        out = run_cli(*SWEEP, f"tracking.uri={store(root)}", *FAST, cwd=root)
        assert out.returncode == 0, out.stderr

    root = made_once(tmp_path_factory, "launchers_basic", make)
    return {job.name: read_history(job / "history.csv") for job in job_dirs(root)}


def _family(uri: str):
    """(parent, children, every run) of the store's one sweep"""
    client, _, found = runs(uri)
    (parent,) = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return client, parent, children, found


def _assert_same_histories(mine: dict, basic: dict) -> None:
    assert sorted(mine) == sorted(basic)
    for job, rows in basic.items():
        assert len(mine[job]) == len(rows) == 20
        for got, want in zip(mine[job], rows):
            assert got.keys() == want.keys()
            for key, value in want.items():
                expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-6, abs=1e-9)
                assert got[key] == expected, (job, got["step"], key)


@pytest.mark.parametrize("launcher", LAUNCHERS, indirect=True)
def test_sweep_equals_the_basic_launchers_with_one_parent_and_report(launcher, basic_sweep, tmp_path):
    args, env = launcher
    uri = store(tmp_path)
    out = run_cli(*SWEEP, *args, f"tracking.uri={uri}", *FAST, cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-5000:]
    assert "Traceback" not in out.stderr
    _assert_same_histories({job.name: read_history(job / "history.csv") for job in job_dirs(tmp_path)},
                           basic_sweep)

    client, parent, children, found = _family(uri)
    assert len(found) == 3 and len(children) == 2
    assert parent.info.status == "FINISHED" and {c.info.status for c in children} == {"FINISHED"}
    assert sorted(c.info.run_name for c in children) == ["dynamic", "fixed_drop"]
    # the scheduler's CPUs per job are its MindSpore threads: 2 jobs at once on 2 cores, 1 thread each
    assert {c.data.params["device.threads_num"] for c in children} == {"1"}
    by_overrides = {c.data.tags["lsexp.overrides"]: c for c in children}
    for job in job_dirs(tmp_path):
        overrides = " ".join(yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
        scales = sorted((m.step, m.value)
                        for m in client.get_metric_history(by_overrides[overrides].info.run_id, "loss_scale"))
        assert scales == [(r["step"], r["loss_scale"]) for r in read_history(job / "history.csv")]
    logged = open(client.download_artifacts(parent.info.run_id, "comparison.csv")).read()
    table = list(csv.DictReader(logged.splitlines()))
    assert sorted(r["choices"] for r in table) == ["loss_scale=dynamic", "loss_scale=fixed_drop"]
    report = subprocess.run([sys.executable, "-m", "lsexp.report.cli", "lsexp", "--tracking-uri", uri,
                             "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "comparison.csv").read_text() == logged


@pytest.mark.parametrize("launcher", LAUNCHERS, indirect=True)
def test_failing_job_is_failed_and_the_other_finishes(launcher, tmp_path):
    args, env = launcher
    uri = store(tmp_path)
    # A 3-class head on 10-class labels passes validation but fails inside MindSpore.
    out = run_cli("-m", "model.num_class=3,10", "train.max_steps=3", *args, f"tracking.uri={uri}", *FAST,
                  cwd=tmp_path, env=env, timeout=600)
    assert out.returncode != 0
    _, parent, children, found = _family(uri)
    status = {c.data.params["model.num_class"]: c.info.status for c in children}
    assert status == {"3": "FAILED", "10": "FINISHED"}
    assert "lsexp.error" in next(c for c in children if c.info.status == "FAILED").data.tags
    assert parent.info.status == "FAILED"
    assert "RUNNING" not in {r.info.status for r in found}


# submitit_local is the Slurm launcher's own code without Slurm: Slurm's variant covers it
RESUMABLE = [p for p in LAUNCHERS if p.id != "submitit_local"] + [
    pytest.param("joblib", marks=pytest.mark.slow, id="joblib")]


@pytest.mark.parametrize("launcher", RESUMABLE, indirect=True)
def test_a_resumed_sweep_reruns_only_the_failed_job_under_this_launcher(launcher, tmp_path):
    # the decision is the job's, from the store: it must hold wherever the launcher runs the job
    args, env = launcher
    uri = store(tmp_path)
    sweep = ["-m", "model.num_class=3,10", "train.max_steps=3", *args, f"tracking.uri={uri}", *FAST,
             f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert run_cli(*sweep, cwd=tmp_path, env=env, timeout=600).returncode != 0  # num_class=3 fails
    _, parent, before, _ = _family(uri)
    finished = next(c for c in before if c.info.status == "FINISHED")
    out = run_cli(*sweep, "sweep.resume=true", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode != 0  # it fails again, as it must
    _, again, children, found = _family(uri)
    assert again.info.run_id == parent.info.run_id and again.info.status == "FAILED"
    by_job = sorted((c.data.params["model.num_class"], c.info.status, c.data.tags.get("lsexp.superseded", ""))
                    for c in children)
    assert by_job == [("10", "FINISHED", ""), ("3", "FAILED", ""), ("3", "FAILED", "true")]
    assert next(c for c in children if c.data.params["model.num_class"] == "10").info.run_id == \
        finished.info.run_id, "the finished job was trained again"
    assert "RUNNING" not in {r.info.status for r in found}


@pytest.fixture(scope="module")
def basic_six(tmp_path_factory):
    """Issue 21's 6-job sweep under the basic launcher, with the one MindSpore thread a job gets from
    Ray's or Slurm's CPU per job: what a stopped and resumed sweep under either must end as (made once
    for both pytest -n workers)."""
    def make(root):
        out = run_cli(*sweep_args(root, "device.threads_num=1"), cwd=root, timeout=1200)
        assert out.returncode == 0, out.stderr[-5000:]

    root = made_once(tmp_path_factory, "launchers_basic_six", make)
    return {job.replace("device.threads_num=1,", ""): rows for job, rows in histories(root).items()}


@pytest.mark.parametrize("launcher", [p for p in LAUNCHERS if p.id != "submitit_local"], indirect=True)
def test_a_sweep_stopped_in_its_fourth_job_resumes_under_this_launcher(launcher, basic_six, tmp_path):
    # Ctrl-C as job 3 starts: the launcher cancels what still runs or waits (two jobs run at once, so
    # job 2 may be cut short too), each cancelled job ends its run KILLED, and the resumed sweep, its
    # decisions made in each job from the store, trains only those
    args, env = launcher
    sweep = sweep_args(tmp_path, *args)
    output = interrupt(tmp_path, sweep, "SIGINT", env)
    finished = check_interrupted(store(tmp_path), "SIGINT", output)
    resume(tmp_path, sweep, finished, env)
    assert histories(tmp_path) == basic_six


def _long_job_under_way(uri: str) -> bool:
    """The short job's run has finished and the long one has logged its first epoch."""
    try:
        client, _, found = runs(uri)
    except Exception:  # the experiment does not exist yet
        return False
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    steps = {r.data.params.get("train.max_steps"): len(client.get_metric_history(r.info.run_id, "loss"))
             for r in children}
    finished = {r.data.params.get("train.max_steps") for r in children if r.info.status == "FINISHED"}
    return finished == {"3"} and steps.get("3000", 0) > 0


def _pids_with(text: str) -> list:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def _kill_the_long_job(name: str, cwd: Path, cluster) -> None:
    if name == "submitit_slurm":  # the way a user or an admin stops a Slurm job
        # the short job's run is FINISHED in MLflow while its process may still be exiting
        deadline = time.time() + 60
        jobs = [job for job, state in cluster.queue() if state == "RUNNING"]
        while len(jobs) != 1 and time.time() < deadline:
            time.sleep(0.5)
            jobs = [job for job, state in cluster.queue() if state == "RUNNING"]
        assert len(jobs) == 1, jobs
        cluster.run("scancel", jobs[0])
        return
    # outright: the job's own process dies, as under the OOM killer
    marker = "ray::_run_job" if name == "ray" else "submitit.core._submit " + str(cwd)
    deadline = time.time() + 30
    while len(_pids_with(marker)) != 1 and time.time() < deadline:  # the short job's process may be exiting
        time.sleep(0.5)
    pids = _pids_with(marker)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)


@pytest.mark.parametrize("launcher", LAUNCHERS, indirect=True)
def test_killed_job_ends_killed_and_the_sweep_does_not_hang(launcher, tmp_path, request):
    args, env = launcher
    name = args[0].split("=")[1]
    cluster = request.getfixturevalue("slurm") if name == "submitit_slurm" else None
    uri = store(tmp_path, create=True)
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", "-m", "train.max_steps=3,3000", *args,
                             f"tracking.uri={uri}", *FAST], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, **env))
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not _long_job_under_way(uri):
            assert proc.poll() is None, proc.communicate()[0][-5000:]
            time.sleep(0.5)
        _kill_the_long_job(name, tmp_path, cluster)
        output = proc.communicate(timeout=180)[0]  # no hang: the launcher gives the job up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, output[-5000:]
    _, parent, children, found = _family(uri)
    status = {c.data.params["train.max_steps"]: c.info.status for c in children}
    assert status["3"] == "FINISHED" and status["3000"] in ("KILLED", "FAILED"), output[-5000:]
    assert parent.info.status in ("KILLED", "FAILED")
    assert "RUNNING" not in {r.info.status for r in found}
    if cluster is not None:
        assert cluster.queue() == []


@pytest.mark.ray
def test_ray_sweep_on_an_existing_cluster_by_address(ray_ready, tmp_path):
    port = slurm_cluster.free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    ray_bin = str(Path(sys.executable).parent / "ray")
    # --block: the cluster lives as long as this process group, which the test ends itself
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--node-ip-address=127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                assert head.poll() is None, head.communicate()[0]
                time.sleep(0.5)
        uri = store(tmp_path)
        out = run_cli("-m", "loss_scale=fixed_drop,dynamic", "amp=O2", "train.max_steps=3",
                      "hydra/launcher=ray", f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
                      f"tracking.uri={uri}", *FAST, cwd=tmp_path, timeout=600)
        assert out.returncode == 0, out.stderr[-5000:]
        assert f"connecting to 127.0.0.1:{port}" in out.stdout + out.stderr
        _, parent, children, _ = _family(uri)
        assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    finally:
        stop_group(head, timeout=60)


# --- refusals: one line, exit 2, before the sweep (marked too: the default suite stays as it was) ------
# the lsexp command in an environment without the given modules (None in sys.modules: not importable)
_HIDE = ("import sys\n"
         "sys.modules.update(dict.fromkeys(sys.argv[1].split(',')))\n"
         "sys.argv = ['lsexp'] + sys.argv[2:]\n"
         "from lsexp.cli import main; main()\n")


@pytest.mark.parametrize("option, hidden, extra", [
    pytest.param("ray", "hydra_plugins.hydra_ray_launcher,hydra_plugins.hydra_ray_launcher._config,ray",
                 "ray", marks=pytest.mark.ray),
    pytest.param("submitit_slurm", "hydra_plugins.hydra_submitit_launcher,"
                 "hydra_plugins.hydra_submitit_launcher.config,submitit", "slurm", marks=pytest.mark.slurm),
])
def test_a_launcher_whose_extra_is_missing_is_one_line(tmp_path, option, hidden, extra):
    out = subprocess.run([sys.executable, "-c", _HIDE, hidden, "-m", f"hydra/launcher={option}",
                          "train.max_steps=2,3", f"tracking.uri={store(tmp_path)}", *FAST],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert (line.startswith(f"lsexp: config error: hydra/launcher={option}: ")
            and f'pip install -e ".[{extra}]"' in line)
    assert not (tmp_path / "multirun").exists()


@pytest.mark.ray
def test_a_ray_address_where_no_cluster_answers_is_one_line(ray_ready, tmp_path):
    port = slurm_cluster.free_port()
    out = run_cli("-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
                  "train.max_steps=2,3", "tracking=none", *FAST, cwd=tmp_path, timeout=300)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"lsexp: config error: hydra.launcher.ray.init.address=127.0.0.1:{port}: "
                           "no Ray cluster")


@pytest.mark.slurm
def test_a_slurm_time_limit_inside_the_warning_signal_is_one_line(tmp_path):
    _need("hydra_plugins.hydra_submitit_launcher", "slurm")
    out = run_cli("-m", "hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=2",
                  "train.max_steps=2,3", "tracking=none", *FAST, cwd=tmp_path, timeout=300)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert (line.startswith("lsexp: config error: hydra.launcher.timeout_min=2: ")
            and "signal_delay_s=120" in line)
