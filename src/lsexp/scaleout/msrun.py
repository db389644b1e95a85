"""Data parallel through MindSpore's own launcher: `parallel=data parallel.workers=N`.

The job (the process Hydra runs) keeps its MLflow run and its output directory. It saves the
resolved config and what it decided at run time, and starts `msrun` with N ranks of
`python -m lsexp.scaleout.msrun`. Each rank joins the
collective group (MCCL on CPU, NCCL or HCCL on GPU and Ascend), sets DATA_PARALLEL, reads its own
shard of every epoch (num_shards, shard_id) and trains. The train step's
TrainOneStepCell inserts MindSpore's DistributedGradReducer, so the overflow check, which comes
after it, sees the averaged gradients and every rank makes the same skip decision.

Rank 0 alone evaluates and writes history.csv, summary.json and the checkpoint; every rank leaves
a digest of its trained parameters, and the job compares them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from omegaconf import DictConfig, OmegaConf

RANK_CONFIG = ".lsexp_rank_config.yaml"
RANK_DECIDED = ".lsexp_rank_decided.json"
LOG_DIR = "msrun_log"


class RankFailure(RuntimeError):
    """A rank died or msrun gave up; str() is the one line for the user."""


def problems(cfg: DictConfig) -> List[str]:
    """The parallel group's keys, and what data parallel asks of the data set and the train mode."""
    from lsexp.config import families
    from lsexp.config.schema import PARALLEL_MODES

    par, p = cfg.parallel, []
    if par.parallel_mode not in PARALLEL_MODES:
        return [f"parallel.parallel_mode={par.parallel_mode}: use data_parallel (parallel=data) or "
                f"stand_alone"]
    if par.parallel_mode != "data_parallel":
        return []
    if par.workers < 1:
        p.append(f"parallel.workers={par.workers}: must be >= 1")
    if families.of("dataset", cfg.dataset._target_) is None:
        p.append(f"parallel=data with dataset._target_={cfg.dataset._target_}: a data set of your own cannot "
                 f"be sharded by lsexp yet; use a built-in data set or parallel=none")
    if not cfg.dataset.drop_remainder:
        p.append("dataset.drop_remainder=false with parallel=data: every rank must take the same number "
                 "of steps; set dataset.drop_remainder=true")
    if cfg.train.mode != "graph":
        p.append(f"train.mode={cfg.train.mode} with parallel=data: data parallel runs in graph mode; "
                 f"set train.mode=graph")
    return p


def data_parallel(cfg: DictConfig) -> bool:
    return cfg.parallel.parallel_mode == "data_parallel"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg: DictConfig, decided, out_dir: Path) -> dict:
    """Run the job as cfg.parallel.workers ranks; returns rank 0's summary once every rank is done."""
    p = cfg.parallel
    OmegaConf.save(cfg, out_dir / RANK_CONFIG, resolve=True)
    (out_dir / RANK_DECIDED).write_text(json.dumps(decided.to_dict()))
    log_dir = out_dir / LOG_DIR
    cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run", f"--worker_num={p.workers}",
           f"--local_worker_num={p.workers}", f"--master_addr={p.master_addr}",
           f"--master_port={p.master_port or _free_port()}", f"--log_dir={log_dir}", "--join=True",
           f"--cluster_time_out={p.cluster_time_out}", "python", "-m", "lsexp.scaleout.msrun", str(out_dir)]
    # msrun starts the ranks as `python ...` from PATH: make that this interpreter, venv or not.
    env = dict(
        os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    # Its own session: a Ctrl-C reaches this job, which stops the ranks in order (rank 0 writes its history).
    proc = subprocess.Popen(
        cmd, start_new_session=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        code = None
        while code is None:
            # A short wait, not one until the end: the kernel may hand a Ctrl-C to any of this
            # process's threads (MindSpore's among them), and a main thread blocked in waitpid
            # would then not raise KeyboardInterrupt until msrun ended.
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=0.5)
    except BaseException:
        _stop(proc, out_dir)
        raise
    if code != 0:
        raise RankFailure(_why(log_dir, code))
    summary = json.loads((out_dir / "summary.json").read_text())
    digests = {path.name: path.read_text() for path in sorted(log_dir.glob("rank*.params_sha256"))}
    summary["world_size"] = int(p.workers)
    summary["ranks_identical"] = len(digests) == p.workers and len(set(digests.values())) == 1
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _rank_pids(out_dir: Path) -> List[int]:
    """The scheduler and rank processes of this run: msrun starts each in a session of its own."""
    mark = f"lsexp.scaleout.msrun {out_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if mark in Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" "):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _stop(proc: subprocess.Popen, out_dir: Path) -> None:
    """SIGTERM to every rank, which ends them like Ctrl-C (rank 0 writes its history), then msrun's
    own Ctrl-C, which SIGKILLs whatever is left; msrun alone would SIGKILL the ranks at once."""
    ranks = _rank_pids(out_dir)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in _rank_pids(out_dir)):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in _rank_pids(out_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _why(log_dir: Path, code: int) -> str:
    """The first rank whose log ends in an error, and that error's last line."""
    for log in sorted(log_dir.glob("worker_*.log")):
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error:" in line]
        if errors:
            return f"rank {log.stem.split('_')[-1]} failed: {errors[-1][:300]} (log: {log})"
    # no rank said why: msrun's scheduler may have (a rank that never joined, a port taken)
    scheduler = log_dir / "scheduler.log"
    if scheduler.exists():
        said = [line.strip() for line in scheduler.read_text(errors="replace").splitlines()
                if "ERROR" in line or "Error" in line or "failed" in line.lower()]
        if said:
            return f"msrun exited with {code}; its scheduler: {said[-1][:300]} (log: {scheduler})"
    return f"msrun exited with {code} before every rank finished; the ranks' logs are in {log_dir}"


def params_digest(step_cell, state=()) -> str:
    """sha256 of the trainable parameters, of the strategy's state (the scale and its scaler's counters,
    named by Strategy.state_names) and of a precision recipe's delayed scales and amax histories
    (lsexp_fp8.*, each history but the slot the last step recorded into), which data parallel keeps
    identical across ranks."""
    digest = hashlib.sha256()
    held = step_cell.parameters_dict()
    fp8 = [param for name, param in sorted(held.items()) if name.startswith("lsexp_fp8.")]
    kept = [held[name] for name in state if name in held]
    for param in list(step_cell.network.trainable_params()) + kept + fp8:
        digest.update(param.name.encode())
        value = param.asnumpy()
        if param.name.endswith(".pending"):  # a gradient's: this rank's own amax, reduced at the next step
            continue
        if param.name.endswith(".amax_history"):  # slot 0: likewise
            value = value[1:]
        digest.update(value.tobytes())
    return digest.hexdigest()


def _rank_main(out_dir: Path) -> int:
    from mindspore.communication import get_rank

    from lsexp import strategies
    from lsexp.device.decided import Decided
    from lsexp.training import job
    from lsexp.training.history import History
    from lsexp.training.plan import plan_of

    def stop(signum, frame):  # msrun's SIGTERM or the job's: end like Ctrl-C, history written
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    def first_rank_writes(history):  # rank 0's history on disk after every epoch: what the job tracks
        if get_rank() == 0:  # if the ranks are stopped
            history.write_csv(out_dir / "history.csv")

    def digest(step_cell):
        (out_dir / LOG_DIR / f"rank{get_rank()}.params_sha256").write_text(params_digest(step_cell, state))

    signal.signal(signal.SIGTERM, stop)
    cfg = OmegaConf.load(out_dir / RANK_CONFIG)
    decided = Decided.from_dict(json.loads((out_dir / RANK_DECIDED).read_text()))
    strategy = strategies.resolve(cfg)
    state = strategy.state_names(cfg.engine.name)
    try:
        history = History(on_epoch=first_rank_writes)
        job.run(cfg, job.Checked(strategy, plan_of(cfg)), decided, out_dir, history, on_done=digest)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(Path(sys.argv[1])))
