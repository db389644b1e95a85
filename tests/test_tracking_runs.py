"""One run in MLflow against real stores (a temporary SQLite file, a real `mlflow server`): its params,
metrics, tags and artifacts, and the one-line refusals of a store it cannot use."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import free_port, run_cli, stop_group
from helpers.mlflow_store import FAST, runs, store
from lsexp.training.history import read_history


@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_single_run_logs_params_metrics_tags_and_artifacts(tmp_path):
    uri = store(tmp_path)
    out = run_cli("amp=O2", "loss_scale=dynamic", "loss_scale.scale_window=3", "train.max_steps=12",
                  "inject.overflow_steps=[2]", f"tracking.uri={uri}", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client, exp, found = runs(uri)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = found
    assert run.info.status == "FINISHED" and run.info.run_name == "lenet5-synthetic-O2-dynamic"
    params = run.data.params
    assert params["loss_scale.scale_window"] == "3" and params["amp.level"] == "O2"
    assert (params["optimizer.loss_scale"] == "1.0"
            and params["loss_scale._target_"].endswith("DynamicLossScaleManager"))
    tags = run.data.tags
    assert tags["lsexp.strategy"] == "dynamic" and tags["lsexp.amp_level"] == "O2"
    assert tags["lsexp.device_target"] == "CPU" and tags["lsexp.model"] == "lenet5"
    assert tags["lsexp.dataset"] == "synthetic" and tags["lsexp.diverged"] == "false"
    assert tags["lsexp.mindspore_version"].startswith("2.10")

    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    rows = read_history(run_dir / "history.csv")
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("loss", "loss_scale", "overflow"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(r["step"], pytest.approx(r[key])) for r in rows]
    metrics = run.data.metrics
    assert metrics["skipped_steps"] == summary["skipped_steps"] >= 1
    assert metrics["overflow_count"] == len(summary["overflow_steps"])
    assert metrics["final_loss_scale"] == summary["final_loss_scale"]
    assert {"final_loss", "steps_per_second"} <= metrics.keys() and "diverged_at_step" not in metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "history.csv", "summary.json", "loss_scale.png"}
    # the store sits in the named file; nothing was written where the command was started besides outputs/
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_default_store_is_mlflow_db_in_the_start_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out = subprocess.run([sys.executable, "-m", "lsexp", "train.max_steps=2", *FAST], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    _, _, found = runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [r.info.status for r in found] == ["FINISHED"]


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_diverged_run_is_tagged_and_has_the_step(tmp_path):
    uri = store(tmp_path)
    out = run_cli("loss_scale=fixed_nodrop", "train.max_steps=6", "inject.overflow_steps=[4]",
                  f"tracking.uri={uri}", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _, _, (run,) = runs(uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["lsexp.diverged"] == "true" and run.data.metrics["diverged_at_step"] == 4


def test_credentials_in_the_tracking_uri_are_never_logged():
    from conftest import compose_cfg
    from lsexp.tracking.run import flat_params

    params = flat_params(compose_cfg("tracking.uri=http://alice:s3cret@127.0.0.1:5000"))
    assert params["tracking.uri"] == "http://127.0.0.1:5000"
    assert not any("s3cret" in v for v in params.values())


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not start")
        yield url
    finally:
        stop_group(proc)


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_http_tracking_server(tmp_path, mlflow_server):
    out = run_cli("amp=O2", "loss_scale=dynamic", "train.max_steps=5", f"tracking.uri={mlflow_server}", *FAST,
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    client, _, (run,) = runs(mlflow_server)
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "loss_scale")) == 5
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"history.csv", "loss_scale.png"}


def test_unreachable_server_is_one_line_before_training(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    out = run_cli("train.max_steps=5", f"tracking.uri={url}", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and lines[0].startswith("lsexp: tracking error:")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_a_store_that_cannot_be_written_is_one_line_and_keeps_the_records(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the store's folder should be")
    out = run_cli("train.max_steps=3", f"tracking.uri=sqlite:///{blocked}/m.db", *FAST, cwd=tmp_path)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("lsexp: tracking error:")]
    assert len(errors) == 2 and "Traceback" not in out.stderr, out.stderr
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
