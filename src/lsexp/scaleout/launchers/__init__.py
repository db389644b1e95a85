"""Sweeps on other machines' processes through Hydra's launcher plugins, installed as extras:
`hydra/launcher=ray` (hydra-ray-launcher, `pip install -e ".[ray]"`), `hydra/launcher=submitit_local`
and `submitit_slurm` (hydra-submitit-launcher, `pip install -e ".[slurm]"`).

lsexp's own configs for them sit in conf/hydra/launcher/ and take precedence over the plugins'
(same option names, lsexp's defaults); Hydra checks each against the plugin's schema of the same
name, so a mistyped key is refused as with the plugin alone. Their `_target_` is in
hydra_plugins.lsexp_launchers (Hydra takes launchers from that package only), which hands the
sweep to its implementation here (ray.py, submitit.py). What they add to the plugins: every job's
outcome is awaited (a failed or lost job becomes a failed job, never a hang, and the others still
finish), a lost job's MLflow run is closed, and a job runs in a process of its own.

Nothing here imports Ray or submitit: the wrappers do, once the launcher is used.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Dict, List, NoReturn, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from lsexp.config.errors import Halt, Refused

# option -> (the plugin's package, its config module, the pip extra that installs it)
PLUGINS: Dict[str, Tuple[str, str, str]] = {
    "ray": ("hydra-ray-launcher", "hydra_plugins.hydra_ray_launcher._config", "ray"),
    "submitit_local": ("hydra-submitit-launcher", "hydra_plugins.hydra_submitit_launcher.config", "slurm"),
    "submitit_slurm": ("hydra-submitit-launcher", "hydra_plugins.hydra_submitit_launcher.config", "slurm"),
}
_TARGETS = {
    "hydra_plugins.lsexp_launchers.launchers.RayLauncher": "ray",
    "hydra_plugins.lsexp_launchers.launchers.SubmititLocalLauncher": "submitit_local",
    "hydra_plugins.lsexp_launchers.launchers.SubmititSlurmLauncher": "submitit_slurm",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def problem(config: DictConfig) -> Optional[str]:
    """One line on what keeps this sweep's launcher from working, or None."""
    target = OmegaConf.select(config, "hydra.launcher._target_")
    option = _TARGETS.get(str(target))
    if option is None:
        return None
    package, module, extra = PLUGINS[option]
    if not _installed(module):
        return (f"hydra/launcher={option}: {package} is not installed; "
                f'pip install -e ".[{extra}]" (or pip install {package})')
    if option == "ray":
        return _ray_problem(config.hydra.launcher)
    return _submitit_problem(option, config.hydra.launcher)


def _ray_problem(launcher: DictConfig) -> Optional[str]:
    if not _installed("ray"):
        return 'hydra/launcher=ray: ray is not installed; pip install -e ".[ray]"'
    address = OmegaConf.select(launcher, "ray.init.address")
    if address and str(address) not in ("auto", "local"):
        why = _unreachable(str(address))
        if why:  # ray.init would retry for minutes
            return (f"hydra.launcher.ray.init.address={address}: no Ray cluster answers there ({why}); "
                    f"start one (ray start --head) or leave the address null for a local one")
    num_cpus = OmegaConf.select(launcher, "ray.remote.num_cpus")
    if num_cpus is not None and num_cpus <= 0:
        return f"hydra.launcher.ray.remote.num_cpus={num_cpus}: must be > 0 (the CPUs each job reserves)"
    return None


def _submitit_problem(option: str, launcher: DictConfig) -> Optional[str]:
    if not _installed("submitit"):
        return f'hydra/launcher={option}: submitit is not installed; pip install -e ".[slurm]"'
    timeout_min = launcher.get("timeout_min")
    if timeout_min is None or timeout_min < 1:
        return f"hydra.launcher.timeout_min={timeout_min}: must be >= 1 (minutes a job may run)"
    delay = launcher.get("signal_delay_s")
    if delay is not None and timeout_min * 60 <= 2 * delay:
        # Slurm would send USR2 before the job has even started, before submitit's handler exists.
        return (
            f"hydra.launcher.timeout_min={timeout_min}: Slurm signals a job signal_delay_s={delay} s "
            f"before its time limit, so {timeout_min * 60} s leaves it no time to run; set timeout_min "
            f"to at least {2 * delay // 60 + 1} or lower hydra.launcher.signal_delay_s"
        )
    if option == "submitit_slurm":
        import shutil

        if shutil.which("sbatch") is None:
            return (
                "hydra/launcher=submitit_slurm: Slurm's sbatch is not on PATH; run the sweep on a "
                "machine that submits to Slurm, or use hydra/launcher=submitit_local"
            )
    return None


def _unreachable(address: str) -> Optional[str]:
    import socket

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return "not host:port"
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        return err.strerror or str(err)
    return None


def threads_per_job(launcher: DictConfig) -> Optional[int]:
    """The CPUs a scheduler reserves for each job (Ray's num_cpus, Slurm's cpus_per_task), which its
    MindSpore kernel threads should not exceed; None when the launcher says nothing of it."""
    cpus = OmegaConf.select(launcher, "ray.remote.num_cpus")
    if cpus is None:
        cpus = launcher.get("cpus_per_task")
    if cpus is None:
        return None
    return max(1, int(cpus))


def failed(overrides: Sequence[str], error: BaseException):
    """A job that did not return, as Hydra's launchers report one (shared by Ray and submitit, so that
    neither needs the other's plugin installed)."""
    from hydra.core.utils import JobReturn, JobStatus

    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
    ret.return_value = error
    return ret


def close_lost_runs(config: DictConfig, lost: List[Sequence[str]], grace_s: float = 15.0) -> None:
    """End as KILLED the MLflow runs of jobs whose process was lost with their tracking worker (a
    Slurm job killed outright: its tracking worker is killed with it). A run
    whose worker is alive ends on its own within the grace; only one still RUNNING after it is closed."""
    import logging
    import time
    from pathlib import Path

    if not lost or config.tracking.backend != "mlflow":
        return
    from lsexp.tracking.run import PARENT_FILE
    from lsexp.tracking.store import client_for, resolve_uri, with_retry
    from lsexp.tracking.uri import redact

    parent_file = Path(str(config.hydra.sweep.dir)) / PARENT_FILE
    if not parent_file.exists():
        return
    parent = parent_file.read_text().strip()
    client = client_for(resolve_uri(config.tracking.uri, os.getcwd()))
    experiment = with_retry(client.get_run, parent).info.experiment_id
    wanted = {redact(" ".join(overrides)) for overrides in lost}
    query = f"tags.mlflow.parentRunId = '{parent}' and attributes.status = 'RUNNING'"
    deadline = time.time() + grace_s
    while True:
        running = [
            r
            for r in with_retry(client.search_runs, [experiment], query)
            if r.data.tags.get("lsexp.overrides") in wanted
        ]
        if not running or time.time() > deadline:
            break
        time.sleep(1)
    for run in running:
        logging.getLogger(__name__).warning(
            "closing the run %s (%s) of a lost job as KILLED",
            run.info.run_id,
            run.data.tags.get("lsexp.overrides"),
        )
        with_retry(
            client.set_tag,
            run.info.run_id,
            "lsexp.error",
            "the job's process was lost (killed, or its node failed) before its run was closed",
        )
        with_retry(client.set_terminated, run.info.run_id, "KILLED")


def interrupted(config: DictConfig, cancelled: List[Sequence[str]]) -> NoReturn:
    """Ctrl-C of a sweep whose jobs run in other processes, after the launcher has cancelled the
    unfinished ones: each ends its run KILLED as it stops, and a run that a job stopped too hard to end
    is closed here, so nothing stays RUNNING; then one line, and exit 130 as an interrupted job does
    (lsexp.app reports the refusal)."""
    close_lost_runs(config, cancelled)
    raise Halt(Refused(f"lsexp: interrupted; the sweep's unfinished jobs were cancelled. To continue, run "
                       f"the same command with sweep.resume=true hydra.sweep.dir={config.hydra.sweep.dir}",
                       exit_code=130))
