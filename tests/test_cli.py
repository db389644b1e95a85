"""The command line as a user types it."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import run_cli


def test_default_command_writes_history_and_summary(tmp_path):
    out = run_cli("train.max_steps=3", "tracking=none", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/history.csv")]
    header = (run_dir / "history.csv").read_text().splitlines()[0]
    assert header == ("step,epoch,loss,loss_scale,overflow,skipped_steps,lr,"
                      "first_nonfinite_layer,first_nonfinite_pass")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["status"] == "finished"
    assert summary["first_nonfinite"] is None  # the locator is on, and O0 at a scale of 1 does not overflow
    console = out.stdout + out.stderr
    assert "lenet5-synthetic-O0-fixed_drop: 3 steps" in console  # the closing summary line
    assert "amp.level=O0 computes in float32" in console


def test_console_script_runs(tmp_path):
    out = subprocess.run([str(Path(sys.executable).parent / "lsexp"), "train.max_steps=2", "tracking=none",
                          "train.progress=false"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow  # builds and installs a wheel: ~30 s; CI runs it in the slow session
def test_built_wheel_carries_the_configs(tmp_path):
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                    str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("lsexp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lsexp/conf/config.yaml" in names and "lsexp/conf/loss_scale/dynamic.yaml" in names
    assert "lsexp/experiments/seed_blog.yaml" in names
    # Installed on its own (ahead of the checkout on sys.path), it composes and runs from its own files.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    env = {"PYTHONPATH": str(site)}
    code = "import lsexp.config.paths as p; print(p.conf_dir())"
    where = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           cwd=tmp_path)
    assert where.stdout.strip() == str(site / "lsexp" / "conf")
    out = run_cli("experiment=seed_blog", "amp=O0", "train.max_steps=2", "tracking=none",
                  "train.progress=false", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert len(list(tmp_path.glob("multirun/*/*/*/history.csv"))) == 3


@pytest.mark.slow
def test_seed_blog_full_ten_epochs_per_epoch_loss_matches_the_article(tmp_path):
    out = run_cli("experiment=seed_blog", "amp=O0", "tracking=none", "train.progress=false", cwd=tmp_path,
                  timeout=1200)
    assert out.returncode == 0, out.stderr
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("multirun/*/*/*/summary.json")]
    assert sorted(s["strategy"] for s in summaries) == ["dynamic", "fixed_drop", "fixed_nodrop"]
    for s in summaries:
        assert s["steps"] == 320 and len(s["epoch_loss"]) == 10
        assert all(2.28 <= v <= 2.34 for v in s["epoch_loss"].values()), s


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_all_strategy_amp_combinations_on_the_command_line(tmp_path, mode):
    amps = "O0,O1,O2,O3" if mode == "graph" else "O2"
    out = run_cli("-m", "loss_scale=fixed_drop,fixed_nodrop,dynamic", f"amp={amps}", f"train.mode={mode}",
                  "train.max_steps=10", "tracking=none", "train.progress=false", cwd=tmp_path, timeout=1800)
    assert out.returncode == 0, out.stderr
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("multirun/*/*/*/summary.json")]
    assert len(summaries) == (12 if mode == "graph" else 3)
    assert all(s["status"] == "finished" and s["steps"] >= 1 for s in summaries)
