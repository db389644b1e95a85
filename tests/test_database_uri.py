"""A database tracking URI that cannot work is refused in one line before anything runs; credentials
never show. Needs no database: the cases here fail before connecting (tests/test_postgres.py has
the ones that need a real PostgreSQL)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import run_cli
from lsexp.tracking.uri import redact, scrub

SECRET = "Zq7x"
URI = f"postgresql://team:{SECRET}%40pw@127.0.0.1:5432/mlflow"


def _driver_missing(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is not None,
                              reason=f"{module} is installed here; its missing-driver line is checked "
                                     "where it is not "
                                     f"(the default CI suite runs before the postgres extra is installed)")


def _one_line(out, prefix: str) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), out.stderr
    assert SECRET not in out.stdout + out.stderr and "team@" not in lines[0]
    return lines[0]


PSYCOPG2_URI = URI.replace("postgresql:", "postgresql+psycopg2:")


@pytest.mark.parametrize("uri, fix, mode", [
    pytest.param(URI, 'pip install -e ".[postgres]"', "run", marks=_driver_missing("psycopg"),
                 id="psycopg-run"),
    pytest.param(PSYCOPG2_URI, "pip install psycopg2-binary", "run", marks=_driver_missing("psycopg2"),
                 id="psycopg2-run"),
    # a sweep is refused before its sweep folder is made
    pytest.param(PSYCOPG2_URI, "pip install psycopg2-binary", "sweep", marks=_driver_missing("psycopg2"),
                 id="psycopg2-sweep"),
])
def test_a_missing_database_driver_is_one_line_before_training(tmp_path, uri, fix, mode):
    sweep = ["-m", "train.max_steps=2,3"] if mode == "sweep" else ["train.max_steps=2"]
    out = run_cli(*sweep, f"tracking.uri={uri}", cwd=tmp_path, timeout=120)
    line = _one_line(out, f"lsexp: tracking error: tracking.uri={uri.split('//')[0]}"
                          "//127.0.0.1:5432/mlflow: ")
    assert "the database driver is not installed" in line and fix in line
    assert list(tmp_path.iterdir()) == []  # no output or sweep folder, no store


def test_server_refuses_what_cannot_be_a_team_store_in_one_line(tmp_path):
    def server(*args):
        return subprocess.run([sys.executable, "-m", "lsexp", "server", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=env)

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_BACKEND_STORE_URI"}

    assert "--backend-store-uri is not set" in _one_line(server(), "lsexp server: ")
    line = _one_line(server("--backend-store-uri", f"http://team:{SECRET}@127.0.0.1:5000"), "lsexp server: ")
    assert line.startswith("lsexp server: --backend-store-uri=http://127.0.0.1:5000: not a database URI")
    line = _one_line(server("--backend-store-uri", "postgresql+nosuchdriver://127.0.0.1/x"), "lsexp server: ")
    assert "not a database URL SQLAlchemy can use" in line
    assert "--workers=0: must be 1 or more" in _one_line(server("--backend-store-uri", URI, "--workers", "0"),
                                                         "lsexp server: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri, shown", [
    ("postgresql://team:s3cret@db:5432/mlflow", "postgresql://db:5432/mlflow"),
    ("postgresql://team:p@ss@db/mlflow", "postgresql://db/mlflow"),  # an unencoded @ in the password
    ("postgresql://team@db/mlflow?password=s3cret&sslmode=require",
     "postgresql://db/mlflow?password=***&sslmode=require"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_redact_drops_credentials(uri, shown):
    assert redact(uri) == shown
    said = "failed, see user@example.com"
    assert redact(f"tracking.uri={uri} {said}") == f"tracking.uri={shown} {said}"


def test_scrub_drops_a_password_a_message_echoes():
    uri = "postgresql://team:p%40ss-Zq7x@db/mlflow"
    text = scrub("login for team with p@ss-Zq7x (p%40ss-Zq7x) at postgresql://team:p%40ss-Zq7x@db/mlflow",
                 uri)
    assert SECRET not in text and "postgresql://db/mlflow" in text
