"""sweep.resume: a job of a sweep run again into its old sweep folder decides, from the store, whether it
has anything left to do. The decision is the job's own, so it holds under every launcher (basic, joblib,
Ray, Slurm):

- its run under the sweep's parent FINISHED with the same fingerprint: it is not trained again, and its
  summary comes from that run;
- its run FINISHED with another fingerprint: the config changed; the job refuses in one line, naming the
  key that differs, before it opens a run;
- otherwise (FAILED, KILLED, left RUNNING by a SIGKILL, or never started): it trains again. Its old runs
  stay in the store, tagged superseded (one left RUNNING ends KILLED), and its old files move to
  superseded/<run id>/ in the job's folder.

A run's fingerprint is a hash of its flat params (the resolved config and what was decided at run
time, such as the oneDNN ISA actually used), without the keys that name places or runs or steer the
sweep itself, which change no number.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Dict, Optional

from lsexp.config.errors import Refused

JOB_TAG, FINGERPRINT_TAG, SUPERSEDED_TAG = "lsexp.job", "lsexp.fingerprint", "lsexp.superseded"
# keys that change no number: where the store and the checkpoint are, how runs are named and shown,
# what the sweep does around its jobs, and which cores a job was given
UNFINGERPRINTED = ("tracking.", "train.resume", "train.progress", "sweep.", "device.affinity_cpu_list")
# what a job leaves in its folder; Hydra's own .hydra/ and the job's log stay
KEPT = (".hydra", "superseded")


def fingerprinted(params: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in params.items() if not k.startswith(UNFINGERPRINTED)}


def fingerprint(params: Dict[str, str]) -> str:
    text = "\n".join(f"{k}={v}" for k, v in sorted(fingerprinted(params).items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def child_runs(client, parent_run_id: str, where: str = "", superseded: bool = False):
    """The runs under a sweep's parent (with `where`, a further filter), oldest first; without the runs a
    resumed sweep superseded unless `superseded`. The one search every reader of a sweep shares."""
    from mlflow.entities import ViewType

    parent = client.get_run(parent_run_id)
    found = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent_run_id}'" + (f" and {where}" if where else ""),
        run_view_type=ViewType.ALL, order_by=["attributes.start_time ASC"])
    return found if superseded else [r for r in found if r.data.tags.get(SUPERSEDED_TAG) != "true"]


def job_runs(client, parent_run_id: str, job: int):
    """The job's runs under the parent that no rerun has superseded, oldest first."""
    return child_runs(client, parent_run_id, f"tags.`{JOB_TAG}` = '{job}'")


def decide(client, parent_run_id: str, job: int, params: Dict[str, str], label: str,
           out_dir: Path) -> Optional[dict]:
    """The finished run's summary if the job is done; None if it must train (its old runs superseded).
    Refuses in one line if the job finished under another config."""
    from lsexp.tracking.store import with_retry

    runs = job_runs(client, parent_run_id, job)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    if finished:
        run = finished[-1]
        if run.data.tags.get(FINGERPRINT_TAG) == fingerprint(params):
            return summary_of(run)
        old, new = fingerprinted(run.data.params), fingerprinted(params)
        key = next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)), "the decided values")
        raise Refused(f"lsexp: sweep.resume: job {job} ({label}) finished in run {run.info.run_id} with "
                      f"{key}={old.get(key)}, and now has {key}={new.get(key)}; resume with the sweep's own "
                      "overrides, or start a new sweep in another hydra.sweep.dir")
    for run in runs:
        with_retry(client.set_tag, run.info.run_id, SUPERSEDED_TAG, "true")
        if run.info.status == "RUNNING":  # its job was killed outright (SIGKILL) and never ended it
            with_retry(client.set_terminated, run.info.run_id, "KILLED")
        _move_aside(out_dir, run.info.run_id)
    return None


def _move_aside(out_dir: Path, run_id: str) -> None:
    """The superseded run's files to superseded/<run id>/, so the rerun writes into an empty folder and
    nothing the old run wrote is lost."""
    old = [p for p in out_dir.iterdir() if p.name not in KEPT and not p.name.endswith(".log")]
    if not old:
        return
    aside = out_dir / "superseded" / run_id
    aside.mkdir(parents=True, exist_ok=True)
    for path in old:
        shutil.move(str(path), str(aside / path.name))


def summary_of(run) -> dict:
    """What a job returns, from its finished run in the store."""
    m, tags = run.data.metrics, run.data.tags
    summary = {
        "run_name": run.info.run_name,
        "run_id": run.info.run_id,
        "resumed_from_store": True,
        "final_loss": m.get("final_loss"),
        "final_loss_scale": m.get("final_loss_scale"),
        "skipped_steps": int(m.get("skipped_steps", 0)),
        "diverged": tags.get("lsexp.diverged") == "true",
        "collapsed": tags.get("lsexp.collapsed") == "true",
    }
    if "eval_accuracy" in m:
        summary["eval_accuracy"] = m["eval_accuracy"]
    return summary
