"""The MLflow store as lsexp uses it: which URI, a client that waits out SQLite's locks, the experiment.

Kept free of Hydra and MindSpore imports: the tracking worker imports it first thing.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Dict, Optional

from lsexp.tracking.uri import TrackingError, redact

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # without it MLflow 3's UI opens on its GenAI page
MAX_PARAMS_PER_BATCH = 100  # MLflow's limit for one log_batch call
MAX_METRICS_PER_BATCH = 1000

def configured_uri(uri: Optional[str]) -> str:
    """The URI a run will use, as far as it is known without importing mlflow (MLflow's own
    precedence: the argument, then $MLFLOW_TRACKING_URI, then its default store)."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


def resolve_uri(uri: Optional[str], start_dir: Optional[str] = None) -> str:
    """The configured URI or MLflow's default, with a relative SQLite path made absolute against
    the directory the command was started from (jobs of a sweep may run elsewhere)."""
    uri = configured_uri(uri)
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(start_dir or os.getcwd(), uri[len(prefix):]).resolve())
    return uri


def check_reachable(uri: str, key: str = "tracking.uri") -> None:
    """Fail fast, in one line, instead of MLflow's minutes of HTTP retries, or a database store's
    missing driver or refused login showing only once the training is over."""
    if uri.startswith(("postgresql", "mysql", "mssql")):
        from lsexp.tracking import database

        if database.is_database(uri):
            database.check(uri, key)
        return
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.request  # here: ~15 ms that every command would otherwise import before it forks

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as reply:
            reply.read()
    # Any error (a port that is no number is http.client.InvalidURL): Hydra would turn it into a
    # warning and train.
    except Exception as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"{key}={redact(uri)}: cannot reach the MLflow server ({reason}); start it "
            f"(mlflow server --host 127.0.0.1 --port 5000), fix the URI, or use tracking=none"
        ) from None


def with_retry(fn, *args, **kwargs):
    """Call an MLflow client method, waiting out SQLite's 'database is locked' when parallel
    jobs write to one file."""
    for attempt in range(12):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # MlflowException or sqlalchemy OperationalError, depending on the path
            if "locked" not in str(err).lower() or attempt == 11:
                raise
            time.sleep(min(0.05 * 2**attempt, 2.0) * (1 + random.random()))


def client_for(uri: str):
    from mlflow.tracking import MlflowClient

    if uri.startswith("postgresql"):  # MLflow creates a new database's tables unguarded
        from lsexp.tracking.database import schema_lock

        with schema_lock(uri):
            return MlflowClient(tracking_uri=uri)
    for attempt in range(5):
        try:
            return with_retry(MlflowClient, tracking_uri=uri)
        except Exception as err:  # another process is creating the same new SQLite store
            if "already exists" not in str(err).lower() or attempt == 4:
                raise
            time.sleep(0.5)


def log_params(client, run_id: str, params: Dict[str, str]) -> None:
    from mlflow.entities import Param

    batch = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(batch), MAX_PARAMS_PER_BATCH):
        with_retry(client.log_batch, run_id, params=batch[i:i + MAX_PARAMS_PER_BATCH])


def ensure_experiment(client, name: str, uri: str) -> str:
    experiment = with_retry(client.get_experiment_by_name, name)
    if experiment is not None:
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # made elsewhere: open it on the runs table too
            with_retry(client.set_experiment_tag, experiment.experiment_id, EXPERIMENT_KIND_TAG,
                       "custom_model_development")
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        # Keep artifacts next to the database file rather than in whatever directory ran first.
        location = (Path(uri[len("sqlite:///"):]).parent / "mlruns").resolve().as_uri()
    try:
        return with_retry(client.create_experiment, name, artifact_location=location,
                          tags={EXPERIMENT_KIND_TAG: "custom_model_development"})
    except Exception as err:
        if "already exists" not in str(err).lower():  # another job created it first
            raise
        return with_retry(client.get_experiment_by_name, name).experiment_id
