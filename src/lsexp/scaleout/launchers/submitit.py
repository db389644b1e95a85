"""`hydra/launcher=submitit_local` and `submitit_slurm`: hydra-submitit-launcher, with what lsexp
needs of it.

- The job folder (`submitit_folder`) is made absolute before submitting, so that it does not move
  with a job that changes its working directory.
- Every job's outcome is awaited, and none forever: submitit learns that a Slurm job ended from
  `sacct`; on a cluster without accounting a job that died without writing its result (killed by
  `scancel`, the OOM killer, a node failure) stays "UNKNOWN" to it, and its own launcher then waits
  for ever. Here a job that has left Slurm's queue without a result for LOST_AFTER_S seconds is
  failed, and the sweep goes on with the others.
- Ctrl-C of the sweep cancels the jobs still queued or running (each ends its MLflow run KILLED), and
  a second Ctrl-C does not cut the cancelling short.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from omegaconf import OmegaConf

from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _plugin
from lsexp.scaleout.launchers import close_lost_runs, failed, interrupted

log = logging.getLogger(__name__)

LOST_AFTER_S = float(os.environ.get("LSEXP_SLURM_LOST_AFTER_S", "30"))
_POLL_S = 1.0
_SQUEUE_EVERY_S = 5.0


def _sacct_works(job_id: str) -> bool:
    try:
        return subprocess.run(["sacct", "-n", "-X", "-j", job_id.split("_")[0]], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class _Waiter:
    """Awaits submitit jobs; fails a Slurm job that left the queue without a result."""

    def __init__(self, executor: str):
        self.executor = executor
        self.gone_since: Dict[str, float] = {}
        self.last_squeue = 0.0
        self.active: Optional[set] = None

    def _in_queue(self, job_ids: List[str]) -> Optional[set]:
        """The given jobs that Slurm still has pending, running or completing; None if squeue fails."""
        if time.time() - self.last_squeue < _SQUEUE_EVERY_S and self.active is not None:
            return self.active
        self.last_squeue = time.time()
        try:
            out = subprocess.run(
                ["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(job_ids)],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            return None  # the controller does not answer: nothing can be concluded
        self.active = {line.strip() for line in out.stdout.splitlines() if line.strip()}
        return self.active

    def lost(self, job, waiting: List[Any]) -> bool:
        if self.executor != "slurm" or job.watcher.get_state(job.job_id, mode="cache").upper() != "UNKNOWN":
            return False  # sacct knows the job, so submitit will see it end
        active = self._in_queue([j.job_id for j in waiting])
        if active is None or job.job_id in active:
            self.gone_since.pop(job.job_id, None)
            return False
        since = self.gone_since.setdefault(job.job_id, time.time())
        return time.time() - since > LOST_AFTER_S and not job.done()

    def wait(self, jobs: List[Any], overrides: List[List[str]]) -> List[JobReturn]:
        results: List[Optional[JobReturn]] = [None] * len(jobs)
        try:
            while any(r is None for r in results):
                waiting = [j for j, r in zip(jobs, results) if r is None]
                for i, job in enumerate(jobs):
                    if results[i] is not None:
                        continue
                    if job.done():
                        try:
                            results[i] = job.results()[0]
                        except Exception as err:  # submitit's UncompletedJobError, FailedJobError
                            results[i] = failed(
                                overrides[i],
                                RuntimeError(
                                    f"hydra/launcher=submitit_{self.executor}: job {job.job_id} "
                                    f"({' '.join(overrides[i])}) did not return: {str(err).splitlines()[0]}"
                                ),
                            )
                    elif self.lost(job, waiting):
                        results[i] = failed(
                            overrides[i],
                            RuntimeError(
                                f"hydra/launcher=submitit_slurm: job {job.job_id} "
                                f"({' '.join(overrides[i])}) left "
                                f"Slurm's queue without a result (killed, or its node failed); its log is in "
                                f"{job.paths.folder}"
                            ),
                        )
                    if results[i] is not None and results[i].status.name != "COMPLETED":
                        log.error("%s", results[i]._return_value)
                if any(r is None for r in results):
                    time.sleep(_POLL_S)
        except KeyboardInterrupt:
            # A second Ctrl-C, or lsexp's supervisor passing on a SIGINT sent to the whole process
            # group, must not cut the cancelling short: it once left all but the first job running.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.cancel([job for job, result in zip(jobs, results) if result is None])
            raise
        return results  # type: ignore[return-value]

    def cancel(self, jobs: List[Any]) -> None:
        if self.executor != "slurm":
            for job in jobs:
                job.cancel(check=False)
            return
        ids = [job.job_id for job in jobs]
        # A plain scancel sends a running job SIGTERM, which submitit ignores until lsexp's handler
        # replaces its own: a job still starting up then ran to its end. SIGINT, Ctrl-C, stops a job
        # at any point (before lsexp's handler, as Python's KeyboardInterrupt). The pending jobs go
        # first, as scancel retries a signal for seconds on a job it cannot alter yet, time in which
        # one could start; a last plain scancel takes what is left, a job not in its step yet.
        for command in (["scancel", "--state=PENDING", *ids], ["scancel", "--signal=INT", *ids],
                        ["scancel", *ids]):
            try:  # best effort, and quiet: scancel complains of the pending jobs it cannot signal
                subprocess.run(command, capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass


class _Launcher(_plugin.BaseSubmititLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None
        params = dict(self.params)
        folder = os.path.abspath(params.pop("submitit_folder"))
        init_params = {"folder": folder}
        if "max_num_timeout" in params:
            init_params[f"{self._EXECUTOR}_max_num_timeout"] = params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init_params)
        base = set(OmegaConf.structured(_plugin.BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in params.items()}
        )
        sweep_dir = os.path.abspath(str(self.config.hydra.sweep.dir))
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {self.config.hydra.sweep.dir}")
        os.makedirs(sweep_dir, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        job_params = []
        for idx, overrides in enumerate(job_overrides):
            idx = initial_job_idx + idx
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append(
                (list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
            )
        jobs = executor.map_array(self, *zip(*job_params))
        log.info("submitted %s", " ".join(j.job_id for j in jobs))
        if self._EXECUTOR == "slurm" and jobs and not _sacct_works(jobs[0].job_id):
            # submitit would call sacct again and again, printing its error and a warning each time,
            # and learn nothing: the jobs' result files and lsexp's queue check tell when they end.
            jobs[0].watcher._make_command = lambda: None
            log.info(
                "this cluster keeps no accounting (sacct), so a job that leaves the queue without a "
                "result is failed after %g s",
                LOST_AFTER_S,
            )
        try:
            results = _Waiter(self._EXECUTOR).wait(list(jobs), [list(o) for o in job_overrides])
        except KeyboardInterrupt:  # the waiter has cancelled the unfinished jobs
            interrupted(self.config, [list(o) for o in job_overrides])
        close_lost_runs(
            self.config, [o for o, r in zip(job_overrides, results) if r.status.name != "COMPLETED"]
        )
        return results


class LocalLauncher(_Launcher):
    _EXECUTOR = "local"


class SlurmLauncher(_Launcher):
    _EXECUTOR = "slurm"
