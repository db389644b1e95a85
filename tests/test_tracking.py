"""MLflow tracking against real stores: a temporary SQLite file, and a real `mlflow server`."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import free_port, run_cli, stop_group
from lsexp.training.history import read_history

FAST = ["train.progress=false"]


def store(tmp_path: Path, create: bool = False) -> str:
    """A SQLite store in tmp_path; create=True makes its schema now, so that a test polling it while
    a job runs is not a second process migrating a new database at the same moment."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    if create:
        MlflowClient(uri).search_experiments()
    return uri


def runs(uri: str, experiment: str = "lsexp"):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, exp, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def job_dirs(root: Path):
    return sorted(p.parent for p in root.glob("multirun/*/*/*/history.csv"))


def test_single_run_logs_params_metrics_tags_and_artifacts(tmp_path):
    uri = store(tmp_path)
    out = run_cli("amp=O2", "loss_scale=dynamic", "loss_scale.scale_window=3", "train.max_steps=12",
                  "inject.overflow_steps=[2]", f"tracking.uri={uri}", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client, exp, found = runs(uri)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = found
    assert run.info.status == "FINISHED" and run.info.run_name == "lenet5-synthetic-O2-dynamic"
    params = run.data.params
    assert params["loss_scale.scale_window"] == "3" and params["amp.level"] == "O2"
    assert (params["optimizer.loss_scale"] == "1.0"
            and params["loss_scale._target_"].endswith("DynamicLossScaleManager"))
    tags = run.data.tags
    assert tags["lsexp.strategy"] == "dynamic" and tags["lsexp.amp_level"] == "O2"
    assert tags["lsexp.device_target"] == "CPU" and tags["lsexp.model"] == "lenet5"
    assert tags["lsexp.dataset"] == "synthetic" and tags["lsexp.diverged"] == "false"
    assert tags["lsexp.mindspore_version"].startswith("2.10")

    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    rows = read_history(run_dir / "history.csv")
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("loss", "loss_scale", "overflow"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(r["step"], pytest.approx(r[key])) for r in rows]
    metrics = run.data.metrics
    assert metrics["skipped_steps"] == summary["skipped_steps"] >= 1
    assert metrics["overflow_count"] == len(summary["overflow_steps"])
    assert metrics["final_loss_scale"] == summary["final_loss_scale"]
    assert {"final_loss", "steps_per_second"} <= metrics.keys() and "diverged_at_step" not in metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "history.csv", "summary.json", "loss_scale.png"}
    # the store sits in the named file; nothing was written where the command was started besides outputs/
    assert not (tmp_path / "mlflow.db").exists()


def test_default_store_is_mlflow_db_in_the_start_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out = subprocess.run([sys.executable, "-m", "lsexp", "train.max_steps=2", *FAST], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    _, _, found = runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [r.info.status for r in found] == ["FINISHED"]


def test_diverged_run_is_tagged_and_has_the_step(tmp_path):
    uri = store(tmp_path)
    out = run_cli("loss_scale=fixed_nodrop", "train.max_steps=6", "inject.overflow_steps=[4]",
                  f"tracking.uri={uri}", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _, _, (run,) = runs(uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["lsexp.diverged"] == "true" and run.data.metrics["diverged_at_step"] == 4


def test_credentials_in_the_tracking_uri_are_never_logged():
    from conftest import compose_cfg
    from lsexp.tracking.run import flat_params

    params = flat_params(compose_cfg("tracking.uri=http://alice:s3cret@127.0.0.1:5000"))
    assert params["tracking.uri"] == "http://127.0.0.1:5000"
    assert not any("s3cret" in v for v in params.values())


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    uri = store(root)
    out = run_cli("-m", "loss_scale=fixed_drop,fixed_nodrop,dynamic", "amp=O2", "train.max_steps=20",
                  "telemetry=grads", f"tracking.uri={uri}", *FAST, cwd=root)
    assert out.returncode == 0, out.stderr
    return root, uri


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


@pytest.mark.slow  # 8 jobs, 4 at once; a 2-job joblib sweep to SQLite is in the default suite (test_device)
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


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM",
                                 # same path, more signals
                                 *(pytest.param(h, marks=pytest.mark.slow)
                                   for h in ("SIGTERM to the process group", "SIGTERM twice"))])
def test_killed_job_is_killed_with_the_steps_so_far(tmp_path, how):
    # the command's process passes a signal on to the job; a group's kill reaches the job twice
    uri = store(tmp_path, create=True)
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", "train.epochs=30", f"tracking.uri={uri}", *FAST],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        _wait_for_an_epoch(uri)  # some steps into training
        if how.endswith("group"):
            os.killpg(proc.pid, signal.SIGTERM)
        elif how.endswith("twice"):  # the second while the first is being handled
            (job,) = [pid for pid in _lsexp_processes_in(tmp_path) if _parent(pid) == proc.pid]
            for _ in range(2):
                os.kill(job, signal.SIGTERM)
                time.sleep(0.2)
        else:
            proc.send_signal(getattr(signal, how))
        output = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert "Traceback" not in output
    assert "lsexp: interrupted; the history so far is in" in output
    client, _, (run,) = runs(uri)
    assert run.info.status == "KILLED", output
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    rows = read_history(run_dir / "history.csv")
    assert 0 < len(rows) < 30 * 32
    assert len(client.get_metric_history(run.info.run_id, "loss")) == len(rows)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"


def test_ctrl_c_in_a_terminal_ends_the_run_killed(tmp_path):
    # the terminal sends SIGINT to its whole foreground process group: the command and its job
    import fcntl
    import termios

    uri = store(tmp_path, create=True)
    master, terminal = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", "train.epochs=30", f"tracking.uri={uri}", *FAST],
                            cwd=tmp_path, stdin=terminal, stdout=terminal, stderr=terminal,
                            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(terminal)
    output = b""
    try:
        _wait_for_an_epoch(uri)
        os.write(master, b"\x03")
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every process holding the terminal has gone
                break
            if not chunk:
                break
            output += chunk
        proc.wait(timeout=120)
    finally:
        proc.kill()
        os.close(master)
    text = output.decode(errors="replace")
    assert proc.returncode == 130, text
    assert "Traceback" not in text and text.count("lsexp: interrupted;") == 1, text
    client, _, (run,) = runs(uri)
    assert run.info.status == "KILLED"
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    assert (len(client.get_metric_history(run.info.run_id, "loss"))
            == len(read_history(run_dir / "history.csv")))


def _running(uri: str) -> bool:
    try:
        _, exp, found = runs(uri)
    except Exception:  # the store or experiment does not exist yet
        return False
    return any(r.info.status == "RUNNING" for r in found)


def _wait_for_an_epoch(uri: str, timeout: float = 180) -> None:
    """Until the running job has streamed its first epoch to the store: some steps into training,
    however slowly the machine compiles."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            client, _, found = runs(uri)
            if any(r.info.status == "RUNNING" and client.get_metric_history(r.info.run_id, "loss")
                   for r in found):
                return
        except Exception:  # the store or experiment does not exist yet
            pass
        time.sleep(0.5)


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not start")
        yield url
    finally:
        stop_group(proc)


def test_http_tracking_server(tmp_path, mlflow_server):
    out = run_cli("amp=O2", "loss_scale=dynamic", "train.max_steps=5", f"tracking.uri={mlflow_server}", *FAST,
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client, _, (run,) = runs(mlflow_server)
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "loss_scale")) == 5
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"history.csv", "loss_scale.png"}


def test_unreachable_server_is_one_line_before_training(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    out = run_cli("train.max_steps=5", f"tracking.uri={url}", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and lines[0].startswith("lsexp: tracking error:")
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_cannot_be_written_is_one_line_and_keeps_the_records(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the store's folder should be")
    out = run_cli("train.max_steps=3", f"tracking.uri=sqlite:///{blocked}/m.db", *FAST, cwd=tmp_path)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("lsexp: tracking error:")]
    assert len(errors) == 2 and "Traceback" not in out.stderr, out.stderr
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3


def _start_and_train_a_while(tmp_path: Path, uri: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", "train.epochs=30", f"tracking.uri={uri}", *FAST],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_an_epoch(uri)  # past the first epoch, which is streamed to the store as it ends
    return proc


def test_a_job_killed_outright_still_ends_its_run(tmp_path):
    uri = store(tmp_path, create=True)
    proc = _start_and_train_a_while(tmp_path, uri)
    (job,) = [pid for pid in _lsexp_processes_in(tmp_path) if _parent(pid) == proc.pid]
    os.kill(job, signal.SIGKILL)  # no handler, no finally
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL  # as a shell reports it
    client, _, (run,) = runs(uri)  # the command has waited for the worker
    assert run.info.status == "KILLED"
    assert len(client.get_metric_history(run.info.run_id, "loss")) >= 32


def test_the_command_killed_outright_stops_the_job_with_its_history(tmp_path):
    # the job runs in a child of the command's process; the kernel sends it SIGTERM when that dies
    uri = store(tmp_path, create=True)
    proc = _start_and_train_a_while(tmp_path, uri)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.time() + 60
    while time.time() < deadline and (_running(uri) or _lsexp_processes_in(tmp_path)):
        time.sleep(0.5)
    client, _, (run,) = runs(uri)
    assert run.info.status == "KILLED"
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    rows = read_history(run_dir / "history.csv")
    assert len(client.get_metric_history(run.info.run_id, "loss")) == len(rows) > 32
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"


# --- the early tracking worker -----------------------------------------------------------------
def _lsexp_processes_in(cwd: Path, workers_only: bool = False):
    """lsexp processes started from cwd (they inherit the command's directory): the command, its
    job, tracking workers. A forked worker has the command's command line; any worker leads a
    session of its own."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if any(part.startswith(b"lsexp") for part in cmdline) and Path(os.readlink(proc / "cwd")) == cwd:
                session = int(_stat(proc)[3])
                if not workers_only or session == int(proc.name):
                    found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def _stat(proc: Path):
    """The fields of a /proc/<pid> (or /proc/<pid>/task/<tid>) stat file after the command name:
    state, ppid, pgrp, session, ..."""
    return (proc / "stat").read_text().rpartition(")")[2].split()


def _parent(pid: int) -> int:
    return int(_stat(Path(f"/proc/{pid}"))[1])


def test_what_runs_before_hydra_imports_nothing_heavy():
    # they run before Hydra composes the config; anything heavy they import delays the run, and
    # numpy must load only once the worker has limited OpenBLAS to one thread
    code = ("import sys, lsexp.cli, lsexp.tracking.supervisor, lsexp.tracking.worker; "
            "print(sorted(m for m in ('hydra', 'omegaconf', 'mindspore', 'mlflow', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tracking_worker_keeps_to_one_core(tmp_path):
    # numpy's OpenBLAS threads would spin beside it while it draws, on the cores the training needs
    from lsexp.tracking.worker import Worker

    uri = store(tmp_path, create=True)
    worker = Worker.spawn()
    worker.send(op="open", uri=uri, start_dir=str(tmp_path), out_dir=str(tmp_path), experiment_name="lsexp",
                run_name="one-core", tags={}, params={})
    worker.send(op="steps", rows=[{"step": 1, "loss": 2.3, "loss_scale": 128.0, "overflow": 0}],
                epoch_eval=[])
    deadline = time.time() + 60
    while time.time() < deadline and not _logged_steps(uri):
        time.sleep(0.1)
    busy = _cpu_seconds_of_other_threads(worker.pid)  # it has drawn its warm-up figure by now
    worker.send(op="finish", status="FINISHED")
    worker.messages.close()
    assert worker.wait() == 0
    assert busy < 0.05  # ~0.15 s when OpenBLAS threads spin through the warm-up figure
    client, _, (run,) = runs(uri)
    assert (run.info.status == "FINISHED"
            and "loss_scale.png" in {a.path for a in client.list_artifacts(run.info.run_id)})


def _cpu_seconds_of_other_threads(pid: int) -> float:
    ticks = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if int(task.name) != pid:
            fields = _stat(task)
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _logged_steps(uri: str) -> int:
    try:
        client, _, found = runs(uri)
    except Exception:  # the experiment does not exist yet
        return 0
    return sum(len(client.get_metric_history(r.info.run_id, "loss")) for r in found)


def _run_to_files(*args: str, cwd: Path) -> int:
    """Like run_cli, but the output goes to files: with pipes, subprocess.run would also wait for
    any worker holding them, and hide one that outlives the command."""
    log = cwd.parent / f"{cwd.name}.log"
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "lsexp", *args], cwd=cwd, stdout=out, stderr=out,
                              timeout=300).returncode


def test_a_rejected_config_leaves_no_tracking_worker_behind(tmp_path):
    assert _run_to_files("loss_scale=fixed_nodrop", "optimizer.loss_scale=1", cwd=tmp_path) == 2
    assert _lsexp_processes_in(tmp_path) == []  # the worker stopped, not left to finish its mlflow import
    assert list(tmp_path.iterdir()) == []


# ~12 s waiting out the early worker; tracking=none on the command line is in the default suite
@pytest.mark.slow
def test_tracking_turned_off_by_a_config_file_stops_the_early_worker(tmp_path):
    # the command line does not say tracking=none, so a worker starts early; the composed config then
    # does, and the worker must go before training, not compete with it for the cores
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "quiet.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /tracking: none\n")
    with open(tmp_path.parent / f"{tmp_path.name}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lsexp", "--config-dir", str(tmp_path / "conf"),
                                 "experiment=quiet", "train.max_steps=200", *FAST],
                                cwd=tmp_path, stdout=log, stderr=log)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob("outputs/*/*/.hydra/config.yaml")):
        time.sleep(0.05)
    time.sleep(1.0)  # the job has started (Hydra wrote its config) and is importing MindSpore or training
    workers_while_training = _lsexp_processes_in(tmp_path, workers_only=True)
    assert proc.poll() is None, "the run ended before the check; give it more steps"
    assert proc.wait(timeout=300) == 0
    assert workers_while_training == []
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 200
