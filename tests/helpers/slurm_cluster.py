"""A throwaway single-node Slurm cluster for the tests: Debian's Slurm 22.05 daemons (slurmctld and
slurmd for the node `localhost`), their config, state, spool and logs in a folder of their own,
on free ports, removed on stop. Clients find it through $SLURM_CONF (`env()`).

No accounting (no slurmdbd): `sacct` then knows nothing, which is the case where submitit cannot
tell that a job was lost; lsexp's submitit launchers must not hang on it.

Authentication is MUNGE's: a munged already serving /run/munge is used, otherwise one is started
as the munge user (and left running, like the system service it stands in for).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional

from conftest import free_port  # noqa: F401  (the tests call it as <cluster module>.free_port)

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "munge")


def missing() -> Optional[str]:
    """Why a cluster cannot be started here, or None."""
    for tool in DAEMONS + CLIENTS:
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return (f"Slurm's {tool} is not installed "
                    "(apt-get install -y slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


def _munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        if cred.returncode != 0:
            return False
        return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_munge() -> None:
    if _munge_works():
        return
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    run_dir.chmod(0o755)
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "--create"], check=True, timeout=30)
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, timeout=30)
    deadline = time.time() + 20
    while not _munge_works():
        if time.time() > deadline:
            raise RuntimeError("munged started but munge -n | unmunge still fails")
        time.sleep(0.2)


class Cluster:
    def __init__(self, cpus: int = 2) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lsexp-slurm-", dir="/tmp"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        self.cpus = cpus
        self.name = f"lsexp{os.getpid()}"
        self.procs: list = []

    def env(self) -> Dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir()
        self.conf.write_text(f"""\
ClusterName={self.name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0,sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=30
InactiveLimit=0
MinJobAge=300
MpiDefault=none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")

    def _daemon(self, *cmd: str) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "w")
        # -D: in the foreground, so that stop() ends exactly the processes started here.
        self.procs.append(subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                                           env=dict(os.environ, **self.env()), start_new_session=True))

    def start(self, timeout: float = 60) -> "Cluster":
        ensure_munge()
        self._write_conf()
        self._daemon("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._daemon("slurmd", "-D", "-f", str(self.conf), "-N", "localhost")
        deadline = time.time() + timeout
        while True:
            state = self.run("sinfo", "-h", "-N", "-o", "%t", check=False).strip()
            if state == "idle":
                return self
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: {self.logs()}")
            if time.time() > deadline:
                raise RuntimeError(f"the node is not idle after {timeout} s (sinfo: {state!r}): "
                                   f"{self.logs()}")
            time.sleep(0.2)

    def run(self, *cmd: str, check: bool = True) -> str:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, **self.env()))
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
        return out.stdout

    def queue(self) -> list:
        """(job id, state) of every job Slurm still knows."""
        lines = self.run("squeue", "-h", "-o", "%i %T").split("\n")
        return [tuple(line.split()) for line in lines if line.strip()]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}"
                         for p in sorted((self.root / "log").glob("*")))

    def stop(self) -> None:
        try:
            if self.procs:
                self.run("scancel", "--full", "-u", "root", check=False)
            for proc in reversed(self.procs):
                proc.terminate()
            for proc in reversed(self.procs):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
