"""Credentials in a tracking URI never show: not in params, tags, artifacts or error lines."""

import pytest

from lsexp.store import redact, scrub

SECRET = "Zq7x"


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
    text = scrub("login for team with p@ss-Zq7x (p%40ss-Zq7x) at postgresql://team:p%40ss-Zq7x@db/mlflow", uri)
    assert SECRET not in text and "postgresql://db/mlflow" in text
