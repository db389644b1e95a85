"""Issue 21's scenario, under any launcher: a 6-job sweep (3 strategies x 2 seeds, O2, 20 steps) stopped
as its fourth job (job 3) starts, then run again with sweep.resume=true; what must hold of the store and
the job folders before and after."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Set

from conftest import run_cli
from helpers.mlflow_store import FAST, runs, store
from helpers.processes import lsexp_processes_in

SWEEP = ["-m", "loss_scale=fixed_drop,dynamic,dynamic_hysteresis", "train.seed=1,2", "amp=O2",
         "train.max_steps=20", *FAST]
SKIPPED = "with the same config (sweep.resume); not trained again"
TRAINED = " 20 steps, final loss"


def sweep_args(root: Path, *extra: str) -> List[str]:
    return [*SWEEP, f"tracking.uri={store(root)}", f"hydra.sweep.dir={root / 'sweep'}", *extra]


def family(uri: str):
    """(the sweep's parents, their children) in the store"""
    try:
        _, _, found = runs(uri)
    except AttributeError:  # no experiment yet
        return [], []
    parents = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    return parents, [r for r in found if "mlflow.parentRunId" in r.data.tags]


def histories(root: Path) -> Dict[str, bytes]:
    """history.csv by job, named by its overrides (the folder's name without the job number)."""
    return {p.parent.name.split("-", 1)[1]: p.read_bytes() for p in (root / "sweep").glob("*/history.csv")}


def _job_started(root: Path, job: int) -> bool:
    """Whether the job has opened its run: the job writes its config.yaml right after asking its tracking
    worker to open the run, and then builds its network and step, which takes seconds. Its run's
    appearance in the store is no such mark: the worker is niced, and on busy cores it opened job 3's
    run only as the job was finishing."""
    return any((root / "sweep").glob(f"{job}-*/config.yaml"))


def _job_has_run(root: Path, job: int) -> bool:
    """Whether the job's run is in the store, read from the SQLite file itself (milliseconds, where a new
    MLflow client takes a second)."""
    try:
        with sqlite3.connect(f"file:{root / 'm.db'}?mode=ro", uri=True, timeout=5) as db:
            found = db.execute("select 1 from tags where key = 'lsexp.job' and value = ?", (str(job),))
            return found.fetchone() is not None
    except sqlite3.OperationalError:  # locked by a writer
        return False


def _slurm_logs(root: Path) -> List[Path]:
    return sorted((root / "sweep" / ".submitit").glob("*/*_log.*"))


def _settled(uri: str, timeout: float) -> None:
    """Until no child run is RUNNING: a launcher's cancelled job ends its run after the command exits."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, children = family(uri)
        if all(c.info.status != "RUNNING" for c in children):
            return
        time.sleep(0.5)


def interrupt(root: Path, args: Sequence[str], how: str, env=None) -> str:
    """Start the sweep, and once job 3 has opened its run (it then builds its step for seconds) stop it:
    `SIGINT`, Ctrl-C, which the terminal sends to the whole group, or `SIGKILL`, a lost machine: the
    command, its jobs and their tracking workers (in sessions of their own, which end a job's run even
    when the job is killed outright) all at once, so nothing ends a run. SIGKILL is for the basic
    launcher, whose job is the command itself: it is held (SIGSTOP) until its worker has the run in
    the store, which a niced worker on busy cores may take longer to do than the job takes to train."""
    uri = store(root, create=True)
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", *args], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, **(env or {})))
    try:
        deadline = time.time() + 600
        while not _job_started(root, 3):
            assert time.time() < deadline, "job 3 opened no run"
            assert proc.poll() is None, proc.communicate()[0][-5000:]
            time.sleep(0.02)
        if how == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            while not _job_has_run(root, 3):
                assert time.time() < deadline, "job 3's run never reached the store"
                time.sleep(0.05)
            for pid in [proc.pid, *lsexp_processes_in(root)]:
                os.kill(pid, signal.SIGKILL)
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, output[-5000:]
    if how == "SIGINT":
        _settled(uri, 120)
    return output


def check_interrupted(uri: str, how: str, output: str) -> Set[str]:
    """What the stop left: the parent KILLED (RUNNING when nothing could end it), jobs 0 and 1 FINISHED,
    job 3 not; returns the jobs that finished. After SIGINT job 3's run may be missing: its niced worker
    may not have opened it yet when Slurm's SIGKILL, KillWait after the SIGTERM, takes the worker too (seen
    on a 2-core AMD EPYC); after SIGKILL the job was held until its run was in the store."""
    (parent,), children = family(uri)
    assert parent.info.status == ("KILLED" if how == "SIGINT" else "RUNNING"), output[-5000:]
    status = {c.data.tags["lsexp.job"]: c.info.status for c in children}
    assert len(status) == len(children), "a job opened two runs"
    left = {"KILLED"} if how == "SIGINT" else {"RUNNING"}
    assert set(status.values()) <= {"FINISHED"} | left, (status, output[-5000:])
    finished = {job for job, s in status.items() if s == "FINISHED"}
    assert {"0", "1"} <= finished and "3" not in finished, (status, output[-5000:])
    assert "3" in status or how == "SIGINT", (status, output[-5000:])
    return finished


def resume(root: Path, args: Sequence[str], finished: Set[str], env=None) -> None:
    """Run the sweep again with sweep.resume=true and check the store: the same parent FINISHED, one
    FINISHED current run per job, the finished jobs' runs kept (not trained again, and said so), every
    unfinished run superseded and KILLED, and nothing RUNNING."""
    uri = store(root)
    (old,), before = family(uri)
    kept = {c.info.run_id for c in before if c.info.status == "FINISHED"}
    unfinished = {c.info.run_id: c.data.tags["lsexp.job"] for c in before if c.info.status != "FINISHED"}
    logged = set(_slurm_logs(root))
    out = run_cli(*args, "sweep.resume=true", cwd=root, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-5000:]
    # what the jobs said: in the command's output, or in a Slurm job's log file
    said = out.stdout + out.stderr + "".join(p.read_text(errors="replace") for p in _slurm_logs(root)
                                             if p not in logged)
    assert said.count(SKIPPED) == len(finished), said[-5000:]
    assert said.count(TRAINED) == 6 - len(finished), said[-5000:]
    (parent,), children = family(uri)
    assert parent.info.run_id == old.info.run_id and parent.info.status == "FINISHED"
    current = [c for c in children if c.data.tags.get("lsexp.superseded") != "true"]
    superseded = [c for c in children if c.data.tags.get("lsexp.superseded") == "true"]
    assert sorted(c.data.tags["lsexp.job"] for c in current) == ["0", "1", "2", "3", "4", "5"]
    assert {c.info.status for c in current} == {"FINISHED"}
    assert kept <= {c.info.run_id for c in current}, "a finished job was trained again"
    assert {c.info.run_id: c.data.tags["lsexp.job"] for c in superseded} == unfinished
    assert {c.info.status for c in superseded} <= {"KILLED"}
