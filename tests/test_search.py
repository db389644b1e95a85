"""hydra/sweeper=optuna through experiment=tune_dynamic: one parent, a child per trial, the best tagged."""

import pytest
import yaml

from conftest import run_cli


@pytest.mark.slow  # an Optuna sweep of 4 trials: ~60 s; CI runs it in the slow session
def test_tune_dynamic_runs_its_trials_and_tags_the_best(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli("experiment=tune_dynamic", "hydra.sweeper.n_trials=4", "train.max_steps=4",
                  f"tracking.uri={uri}", "train.progress=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Best parameters: {'loss_scale.init_loss_scale'" in out.stdout + out.stderr
    (results,) = tmp_path.glob("multirun/*/*/optimization_results.yaml")
    best = yaml.safe_load(results.read_text())["best_params"]

    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("lsexp").experiment_id])
    (parent,) = [r for r in found if r.data.tags.get("lsexp.sweep") == "true"]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 and {c.info.status for c in children} == {"FINISHED"}
    (winner,) = [c for c in children if c.data.tags.get("lsexp.best_trial") == "true"]
    assert parent.data.tags["lsexp.best_run_id"] == winner.info.run_id
    for key, value in best.items():
        assert winner.data.params[key] == str(float(value)) if key.endswith("init_loss_scale") else str(value)
        assert parent.data.params[f"best.{key}"] == str(value)
    # The objective is the held-out accuracy, so the winner's is the highest.
    accuracy = {c.info.run_id: c.data.metrics["eval_accuracy"] for c in children}
    assert accuracy[winner.info.run_id] == max(accuracy.values())
    assert parent.data.metrics["best_value"] == accuracy[winner.info.run_id]


def test_a_diverged_or_unscored_run_is_the_worst_value():
    import sys

    from conftest import compose_cfg
    from lsexp.app import objective

    loss, accuracy = compose_cfg(), compose_cfg("train.objective=eval_accuracy")
    assert objective(loss, {"diverged": False, "final_loss": 0.25}) == 0.25
    assert objective(loss, {"diverged": True, "final_loss": float("nan")}) == sys.float_info.max
    assert objective(accuracy, {"diverged": False, "final_loss": 0.2, "eval_accuracy": 0.9}) == 0.9
    assert objective(accuracy, {"diverged": True, "final_loss": 0.2, "eval_accuracy": 0.9}) == 0.0
