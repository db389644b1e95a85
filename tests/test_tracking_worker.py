"""The early tracking worker: forked before Hydra, it keeps to one core and never outlives a refused
command."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.mlflow_store import FAST, runs, store
from helpers.processes import lsexp_processes_in, proc_stat


# --- the early tracking worker -----------------------------------------------------------------
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
    from lsexp.tracking.protocol import Finish, Open, Steps
    from lsexp.tracking.worker import Worker

    uri = store(tmp_path, create=True)
    worker = Worker.spawn()
    worker.send(Open(uri=uri, start_dir=str(tmp_path), out_dir=str(tmp_path), experiment_name="lsexp",
                     run_name="one-core", tags={}, params={}))
    worker.send(Steps(rows=[{"step": 1, "loss": 2.3, "loss_scale": 128.0, "overflow": 0}], epoch_eval=[]))
    deadline = time.time() + 60
    while time.time() < deadline and not _logged_steps(uri):
        time.sleep(0.1)
    busy = _cpu_seconds_of_other_threads(worker.pid)  # it has drawn its warm-up figure by now
    worker.send(Finish(status="FINISHED"))
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
            fields = proc_stat(task)
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
    assert lsexp_processes_in(tmp_path) == []  # the worker stopped, not left to finish its mlflow import
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
    workers_while_training = lsexp_processes_in(tmp_path, workers_only=True)
    assert proc.poll() is None, "the run ended before the check; give it more steps"
    assert proc.wait(timeout=300) == 0
    assert workers_while_training == []
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 200
