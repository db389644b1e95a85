"""A study run for real as a small sweep through the CLI, into its own MLflow store, and its table."""

import csv

from conftest import run_cli


def study_sweep(tmp_path, *overrides):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli(*overrides, f"tracking.uri={uri}", "train.progress=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    (parent,) = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return client, parent, children


def study_table(tmp_path, client, parent, study):
    (folder,) = tmp_path.glob("multirun/*/*/study")
    assert {p.name for p in folder.iterdir()} == {f"{study}.csv", f"{study}.md", f"{study}.png"}
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "study")}
    assert logged == {f"study/{study}.csv", f"study/{study}.md", f"study/{study}.png"}
    assert parent.data.tags["lsexp.study"] == study
    with open(folder / f"{study}.csv") as f:
        return list(csv.DictReader(f))


def interval(values):
    """mean, std and the 95% Student's t interval, by hand, to check a table's cells against."""
    import math
    import statistics

    import numpy as np
    from scipy.stats import t as student_t

    mean, std = float(np.mean(values)), statistics.stdev(values)
    half = student_t.ppf(0.975, len(values) - 1) * std / math.sqrt(len(values))
    return mean, std, mean - half, mean + half


def cell_values(cell: str):
    """A table's `mean ± std [low, high]` cell as four floats."""
    import re

    return tuple(float(x) for x in re.fullmatch(r"(\S+) ± (\S+) \[(\S+), (\S+)\]", cell).groups())
