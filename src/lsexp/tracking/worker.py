"""The tracking worker: a process that owns one job's MLflow run, fed JSON lines on a pipe.

Importing mlflow and opening its store costs ~1.5 s of CPU, and drawing the run's figure ~0.5 s
more; in the job's process that would add straight to the run's wall time. Here it runs beside
the job, forked from it before Hydra composes the config, so the imports overlap Hydra and MindSpore's
own imports, when the job uses one core, instead of the training, which keeps MindSpore's
runtime threads busy on every core. The worker also ends the run (KILLED) when the job's
process dies without a word: its input pipe then closes.

It imports nothing of Hydra, MindSpore or numpy (`python -X importtime -c 'import lsexp.tracking.worker'`).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, TextIO

from lsexp.tracking import protocol, summary
from lsexp.tracking.store import (
    MAX_METRICS_PER_BATCH,
    client_for,
    configured_uri,
    ensure_experiment,
    log_params,
    resolve_uri,
    with_retry,
)
from lsexp.tracking.uri import redact, scrub

DONE = "lsexp-tracking-worker-done"  # the worker's last line on its done pipe, with its exit code
_early: Optional["Worker"] = None
# Hydra's flags that print something and exit without running a job.
_NO_RUN_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-sc",
                 "--shell-completion"}


# --- the job's side: starting a worker -------------------------------------------------------
_STOPS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _stops_held():
    """SIGINT and SIGTERM blocked while the worker is made, so that it starts with them blocked (a
    signal mask outlives fork and exec) and none reaches it before it ignores them."""
    maker = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        if os.getpid() == maker:  # a forked worker keeps them blocked until it ignores them
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def _ignore_stops() -> None:
    """A job stopped with its whole process tree (Slurm's scancel signals every process of a job, a
    kill of a process group each member) took its worker with it, before the worker could open or
    end the run. The worker ends when its job says so or dies (its input closes); SIGKILL stops it.
    SIGTERM also starts the worker's own deadline (_Deadline)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _DEADLINE.start)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


class _Deadline:
    """SIGTERM reaching the worker means its job is being stopped with it: Slurm's scancel signals every
    process of a job and SIGKILLs them all KillWait later (30 s by default, and in the tests' cluster). A
    job inside a long MindSpore call (compiling its step, say, on a slow machine) runs its
    Python handler only when the call returns, and the SIGKILL would take the worker before the job
    closed its run, leaving it RUNNING. So GRACE seconds after SIGTERM the worker ends a run still open
    KILLED itself; if the job closes it later, its own status, tags and artifacts are written over."""

    GRACE = 5.0

    def __init__(self):
        self.run: Optional["MlflowRun"] = None
        self.closed = False
        self.passed = False  # GRACE has run out: a run opened from now on is ended at once

    def opened(self, run: "MlflowRun") -> None:
        self.run = run
        if self.passed:
            self._end()

    def start(self, signum, frame) -> None:
        import threading


        timer = threading.Timer(self.GRACE, self._end)
        timer.daemon = True
        timer.start()

    def _end(self) -> None:
        self.passed = True
        run = self.run
        if run is None or self.closed:
            return
        with contextlib.suppress(Exception):  # the job's own close, or the worker's, tells the store
            said = f"stopped (SIGTERM) and not closed {self.GRACE:g} s later"
            with_retry(run.client.set_tag, run.run_id, "lsexp.error", said)
            with_retry(run.client.set_terminated, run.run_id, "KILLED")


_DEADLINE = _Deadline()


class Worker:
    """The job's handle on a tracking worker: a pipe for its messages, a pipe for its done line."""

    def __init__(self, pid: int, messages: TextIO, done: TextIO, popen: Optional[subprocess.Popen] = None,
                 supervised: bool = False):
        self.pid, self.messages, self.done, self._popen = pid, messages, done, popen
        self.supervised = supervised  # it also reports to the command's supervisor, which waits for it

    @classmethod
    def spawn(cls) -> "Worker":
        # A session of its own: Ctrl-C in the terminal goes to the job, which then ends the run.
        with _stops_held():
            proc = subprocess.Popen([sys.executable, "-m", "lsexp.tracking.worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
        return cls(proc.pid, proc.stdin, proc.stdout, proc)

    @classmethod
    def fork(cls, report_fd: Optional[int] = None) -> "Worker":
        """A copy of this process, for a worker started before anything heavy is imported: it skips
        a new interpreter's start-up (~75 ms of CPU) and begins importing mlflow that much sooner.
        It writes its exit code to report_fd, the supervisor's pipe, if there is one."""
        if not hasattr(os, "fork"):
            return cls.spawn()
        messages_r, messages_w = os.pipe()
        done_r, done_w = os.pipe()
        with _stops_held():
            pid = os.fork()
        if pid == 0:
            try:
                os.close(messages_w)  # or the job's death would never close the worker's input
                os.close(done_r)
                os.setsid()  # as spawn does
                os.dup2(2, 1)  # a library's prints go to stderr, as in spawn, not into the job's stdout
                main(open(messages_r), open(done_w, "w"), report_fd)
            finally:
                os._exit(1)
        os.close(messages_r)
        os.close(done_w)
        if report_fd is not None:
            os.close(report_fd)  # the worker's copy is the one the supervisor waits on
        return cls(pid, open(messages_w, "w"), open(done_r), supervised=report_fd is not None)

    def send(self, message: protocol.Message) -> None:
        self.messages.write(protocol.encode(message))
        self.messages.flush()

    def alive(self) -> bool:
        return self._reap(block=False) is None

    def wait(self) -> int:
        """The worker's exit code as soon as it says it is done, without waiting ~20 ms more for the
        kernel to take down its process."""
        for line in self.done:
            if line.startswith(DONE):
                return int(line.split()[1])
        return self._reap(block=True)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._reap(block=True)

    def _reap(self, block: bool) -> Optional[int]:
        if self._popen is not None:
            return self._popen.wait() if block else self._popen.poll()
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored): gone, how is unknown
            return -1
        return os.waitstatus_to_exitcode(status) if pid else None


def wanted(argv: List[str]) -> bool:
    """Whether a command line may track: not if it turns tracking off or only asks Hydra for
    help or the config."""
    if any(arg in ("tracking=none", "tracking.backend=none") for arg in argv):
        return False
    return not any(arg.partition("=")[0] in _NO_RUN_FLAGS for arg in argv)


def start_early(report_fd: Optional[int]) -> None:
    """Fork a worker before Hydra composes the config. One that the run does not claim is
    stopped before it has touched any store."""
    global _early
    _early = Worker.fork(report_fd)
    atexit.register(discard)


def claim() -> Worker:
    """The early worker if there is one still waiting, else a new one. Later workers are spawned:
    forking a process that has MindSpore's threads running is not safe."""
    global _early
    worker, _early = _early, None
    if worker is not None and worker.alive():
        return worker
    return Worker.spawn()


def discard() -> None:
    """Stop an early worker no run has claimed (tracking turned off by the config, a parallel
    launcher's jobs in other processes, a rejected config)."""
    global _early
    worker, _early = _early, None
    if worker is not None:
        worker.kill()


# --- the worker's side -----------------------------------------------------------------------
class MlflowRun:
    """One job's MLflow run, created from the job's `open` message."""

    def __init__(self, uri: str, start_dir: str, experiment_name: str, run_name: str, tags: Dict[str, str],
                 params: Dict[str, str]):
        uri = resolve_uri(uri, start_dir)
        self.client = client_for(uri)
        experiment_id = ensure_experiment(self.client, experiment_name, uri)
        self.run_name = run_name
        run = with_retry(self.client.create_run, experiment_id, tags=tags, run_name=run_name)
        self.run_id = run.info.run_id
        log_params(self.client, self.run_id, params)
        self.rows: List[dict] = []
        from lsexp.figures import RunFigure

        # Laid out now, while the job compiles, rather than after the training.
        self.figure = RunFigure(run_name)

    def log_steps(self, rows: List[dict], epoch_eval: List[dict]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, row["step"])
            for row in rows
            for key, value in row.items()
            # first_nonfinite_layer and _pass are words
            if key not in ("step", "epoch", "skipped_steps") and not isinstance(value, str)
        ]
        # The UI charts metrics on a linear axis, where 128 vanishes beside 2^24: log2 separates them.
        metrics += [
            Metric(
                "loss_scale_log2",
                math.log2(row["loss_scale"]) if row["loss_scale"] > 0 else float("nan"),
                now,
                row["step"],
            )
            for row in rows
        ]
        metrics += [
            Metric(key, value, now, e["step"])
            for e in epoch_eval
            for key, value in e.items()
            if key not in ("epoch", "step")
        ]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            with_retry(self.client.log_batch, self.run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])
        self.rows += rows

    def finish(self, out_dir: Path, status: str, error: Optional[str]) -> None:
        """Summary metrics, tags and artifacts from what the job left in out_dir; then end the run."""
        try:
            found = summary.read_json(out_dir / "summary.json")
            with_retry(self.client.log_batch, self.run_id, metrics=summary.metrics(found),
                       tags=summary.tags(found, error))
            if self.rows:
                self.figure.save(self.rows, out_dir / "loss_scale.png")
            summary.log_artifacts(self.client, self.run_id, out_dir)
            summary.tag_first_nonfinite(self.client, self.run_id, found)
            summary.log_telemetry(self.client, self.run_id, out_dir)
        finally:
            with_retry(self.client.set_terminated, self.run_id, status)


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def serve(lines) -> int:
    """Serve one job's run from its messages: open, steps (once an epoch), finish."""
    os.nice(5)  # let training win when both want a core
    # numpy's OpenBLAS threads spin after each call, taking a core from training for no gain: the
    # worker's numpy work (the figure's transforms) is tiny. Read when numpy loads, which is below.
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # Import mlflow before the job's first message arrives: the job is still composing its config.
    import mlflow.tracking  # noqa: F401

    run: Optional[MlflowRun] = None
    out_dir: Optional[Path] = None
    uri: Optional[str] = None
    # What the run ends as if the job's process goes away without saying: its input just closes.
    status, error, code = "KILLED", "the lsexp process ended without closing its run", 0
    try:
        for line in lines:
            msg = protocol.decode(line)
            if isinstance(msg, protocol.Open):
                out_dir, uri = Path(msg.out_dir), msg.uri
                run = MlflowRun(
                    msg.uri, msg.start_dir, msg.experiment_name, msg.run_name, msg.tags, msg.params
                )
                _DEADLINE.opened(run)
            elif isinstance(msg, protocol.Steps):
                run.log_steps(msg.rows, msg.epoch_eval)
            elif isinstance(msg, protocol.Finish):
                status, error = msg.status, msg.error
                break
    except Exception as err:  # its line, and the run's lsexp.error tag, never carry the URI's password
        status, error, code = "FAILED", scrub(_one_line(err), configured_uri(uri)), 1
        print(f"lsexp: tracking error: {error}", file=sys.stderr)
    if run is not None:
        try:
            _DEADLINE.closed = True  # from here the worker closes the run itself
            run.finish(out_dir, status, error)
        except Exception as err:
            print(f"lsexp: tracking error: {scrub(_one_line(err), configured_uri(uri))}", file=sys.stderr)
            code = 1
    if code and out_dir is not None:  # here, not in the job, which may have handed the run over
        print(
            f"lsexp: tracking error: tracking.uri={redact(configured_uri(uri))}: the run was not "
            f"fully logged to MLflow (see the line above); its records are in {out_dir}",
            file=sys.stderr,
        )
    return code


def main(lines: TextIO, done: TextIO, report_fd: Optional[int] = None) -> None:
    """Serve, say done on the done channel (and to the supervisor), and exit."""
    sys.stdout = sys.stderr  # the done channel carries the done line alone; a library's prints go to stderr
    _ignore_stops()
    code = serve(lines)
    sys.stderr.flush()
    with contextlib.suppress(BrokenPipeError):  # a job that handed its run over may be gone
        print(DONE, code, file=done, flush=True)
    if report_fd is not None:
        os.write(report_fd, f"{code}\n".encode())
    # Everything is committed; skip the interpreter teardown (~0.5 s with mlflow and matplotlib
    # loaded), which the job would otherwise wait for.
    os._exit(code)


if __name__ == "__main__":
    main(sys.stdin, sys.stdout)
