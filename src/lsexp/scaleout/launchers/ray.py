"""`hydra/launcher=ray`: hydra-ray-launcher, with what lsexp needs of it.

- Every job runs in a Ray worker process of its own (lsexp's config sets `max_calls: 1`): MindSpore
  takes its device, execution mode and kernel threads once per process, a job installs its own
  SIGTERM handler and tracking worker, and a worker that Ray reused would carry all that into the
  next job. A job is not retried when its worker dies (`max_retries: 0`): the retry would be a
  second run of the same job in the store.
- Every job's outcome is awaited before the sweep ends: a job whose worker died becomes a failed
  job (its MLflow run was ended KILLED by its tracking worker), and the others still finish.
- Ray's local start: no dashboard (seconds saved), and RAY_AUTH_MODE=disabled unless set, or Ray
  2.60 warns and writes an auth token. RAY_DEDUP_LOGS=0 unless set: Ray would fold the jobs' summary
  lines, which differ only in their numbers, into one. With `hydra.launcher.ray.init.address` set (`auto`, or
  host:port) the jobs go to that existing cluster, and the keys only a new cluster takes are dropped.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import List, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from omegaconf import OmegaConf, open_dict

from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher as _PluginLauncher
from lsexp.scaleout.launchers import close_lost_runs, failed, interrupted

log = logging.getLogger(__name__)
# how long a Ctrl-C'd sweep waits for its cancelled jobs to end their runs
_CANCEL_GRACE_S = 30.0

# ray.init refuses these when it connects to an existing cluster
_NEW_CLUSTER_ONLY = (
    "num_cpus",
    "num_gpus",
    "resources",
    "labels",
    "object_store_memory",
    "include_dashboard",
    "dashboard_host",
    "dashboard_port",
    "_system_config",
)


def init_kwargs(init) -> dict:
    kwargs = {k: v for k, v in OmegaConf.to_container(init, resolve=True).items() if v is not None}
    if kwargs.get("address"):
        for key in _NEW_CLUSTER_ONLY:
            kwargs.pop(key, None)
    else:
        # a new cluster, even if `ray start` left one (or the record of one) on this machine, which
        # ray.init() without an address would join
        kwargs["address"] = "local"
        # as the plugin does: Ray's default can be too little on a small CI machine
        kwargs.setdefault("object_store_memory", 78643200)
    return kwargs


def _run_job_in(cwd: str, hydra_context, sweep_config, task_function, singleton_state) -> JobReturn:
    """The plugin's job, from the sweep's start folder: a worker of a cluster started elsewhere
    (`ray start`) has that command's folder, where the sweep's relative paths would go astray."""
    # private, and the only way: the plugin runs each job through this function and exports none
    from hydra_plugins.hydra_ray_launcher._launcher_util import _run_job

    if os.path.isdir(cwd):
        os.chdir(cwd)  # the worker serves this one job (max_calls=1)
    return _run_job(hydra_context, sweep_config, task_function, singleton_state)


class RayLauncher(_PluginLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # Ray folds log lines that differ only in their numbers: every job's summary line but one
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        import ray

        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if not ray.is_initialized():
            kwargs = init_kwargs(self.ray_cfg.init)
            log.info(
                "Ray: %s",
                f"connecting to {kwargs['address']}"
                if kwargs["address"] != "local"
                else "starting a local cluster",
            )
            ray.init(**kwargs)
        log.info(f"Ray Launcher is launching {len(job_overrides)} jobs, sweep output dir: {sweep_dir}")
        remote = ray.remote(**OmegaConf.to_container(self.ray_cfg.remote, resolve=True))(_run_job_in)
        refs, overrides_of = [], []
        for idx, overrides in enumerate(job_overrides):
            idx = initial_job_idx + idx
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"job_id_for_{idx}"
                sweep_config.hydra.job.num = idx
            refs.append(
                remote.remote(
                    os.getcwd(), self.hydra_context, sweep_config, self.task_function, Singleton.get_state()
                )
            )
            overrides_of.append(list(overrides))
        results: List[JobReturn] = []
        try:
            for ref, overrides in zip(refs, overrides_of):
                try:
                    results.append(ray.get(ref))
                except (
                    ray.exceptions.RayError
                ) as err:  # the worker died (killed, out of memory) or Ray failed
                    log.error("job %s: %s", " ".join(overrides), str(err).splitlines()[0])
                    results.append(
                        failed(
                            overrides,
                            RuntimeError(
                                f"hydra/launcher=ray: the job {' '.join(overrides)} did not return: "
                                f"{str(err).splitlines()[0]}"
                            ),
                        )
                    )
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cancelling short
            for ref in refs[len(results):]:
                ray.cancel(ref)  # a KeyboardInterrupt in the job, which ends its run KILLED
            # Ray's shutdown at exit kills the workers with their children, tracking workers included:
            # the cancelled jobs end their runs first
            ray.wait(refs[len(results):], num_returns=len(refs) - len(results), timeout=_CANCEL_GRACE_S)
            interrupted(self.config, overrides_of[len(results):])
        close_lost_runs(
            self.config, [o for o, r in zip(overrides_of, results) if r.status != JobStatus.COMPLETED]
        )
        return results
