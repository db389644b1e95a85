"""A run stopped by a signal, Ctrl-C or a kill outright still ends KILLED in MLflow, with its history."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.mlflow_store import FAST, runs, store
from helpers.processes import lsexp_processes_in, parent_pid
from lsexp.training.history import read_history


# Ctrl-C in a terminal is in the default suite (below); these in CI's slow session
@pytest.mark.parametrize("how", [pytest.param("SIGINT", marks=pytest.mark.slow),
                                 pytest.param("SIGTERM", marks=pytest.mark.slow),
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
            (job,) = [pid for pid in lsexp_processes_in(tmp_path) if parent_pid(pid) == proc.pid]
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


def _start_and_train_a_while(tmp_path: Path, uri: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", "train.epochs=30", f"tracking.uri={uri}", *FAST],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_an_epoch(uri)  # past the first epoch, which is streamed to the store as it ends
    time.sleep(1)  # and into the next, whose steps only the history on disk has when the job is killed
    return proc


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_a_job_killed_outright_still_ends_its_run(tmp_path):
    uri = store(tmp_path, create=True)
    proc = _start_and_train_a_while(tmp_path, uri)
    (job,) = [pid for pid in lsexp_processes_in(tmp_path) if parent_pid(pid) == proc.pid]
    os.kill(job, signal.SIGKILL)  # no handler, no finally
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL  # as a shell reports it
    client, _, (run,) = runs(uri)  # the command has waited for the worker
    assert run.info.status == "KILLED"
    assert len(client.get_metric_history(run.info.run_id, "loss")) >= 32


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_the_command_killed_outright_stops_the_job_with_its_history(tmp_path):
    # the job runs in a child of the command's process; the kernel sends it SIGTERM when that dies
    uri = store(tmp_path, create=True)
    proc = _start_and_train_a_while(tmp_path, uri)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.time() + 60
    while time.time() < deadline and (_running(uri) or lsexp_processes_in(tmp_path)):
        time.sleep(0.5)
    client, _, (run,) = runs(uri)
    assert run.info.status == "KILLED"
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    rows = read_history(run_dir / "history.csv")
    assert len(client.get_metric_history(run.info.run_id, "loss")) == len(rows) > 32
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"
