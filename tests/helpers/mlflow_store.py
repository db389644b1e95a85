"""A throwaway MLflow store for the tests, and what they read back from it."""

from pathlib import Path

from mlflow.tracking import MlflowClient

FAST = ["train.progress=false"]


def store(tmp_path: Path, create: bool = False) -> str:
    """A SQLite store in tmp_path; create=True makes its schema now, so that a test polling it while
    a job runs is not a second process migrating a new database at the same moment."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    if create:
        MlflowClient(uri).search_experiments()
    return uri


def runs(uri: str, experiment: str = "lsexp"):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, exp, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def job_dirs(root: Path):
    return sorted(p.parent for p in root.glob("multirun/*/*/*/history.csv"))
