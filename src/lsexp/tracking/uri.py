"""Tracking URIs as lsexp prints them, with credentials redacted, and the error of a store that cannot
be used, and the check of tracking.uri. A leaf: the validation, the store, the database and the server
all use it."""

from __future__ import annotations

import re
from typing import Optional

# user:password@ (up to the last @ of the authority: a password may hold one) and ?password=...
_CREDENTIALS = re.compile(r"(//)[^/\s]*@")
_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


class TrackingError(Exception):
    """The tracking store cannot be used; str() is the one-line message for the user."""


def redact(uri: str) -> str:
    """Drop user:password@ (and a password=... query parameter) from a URI, for anything that is
    logged or printed."""
    return _PASSWORD_PARAM.sub(r"\1***", _CREDENTIALS.sub(r"\1", uri))


def scrub(text: str, uri: Optional[str]) -> str:
    """A message with any URI in it redacted, and uri's password too wherever it appears, should a
    driver or server ever echo it."""
    from urllib.parse import unquote, urlsplit

    text = redact(text)
    try:
        password = urlsplit(uri or "").password
    except ValueError:  # e.g. a port that is not a number
        password = None
    for form in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(form, "***")
    return text


def problems(cfg) -> list:
    """The tracking group's keys: the backend, and a URI MLflow can take."""
    uri = cfg.tracking.uri
    if cfg.tracking.backend not in ("mlflow", "none"):
        return [f"tracking.backend={cfg.tracking.backend}: use tracking=mlflow or tracking=none"]
    if uri and not re.match(r"^(sqlite|https?|file|postgresql|mysql|mssql|databricks)[+a-z0-9]*:", uri):
        return [f"tracking.uri={redact(uri)}: not an MLflow tracking URI; use e.g. sqlite:///mlflow.db, "
                f"http://127.0.0.1:5000 or postgresql://user@host:5432/database"]
    return []
