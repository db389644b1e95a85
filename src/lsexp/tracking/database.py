"""Database tracking stores (PostgreSQL; MySQL and SQL Server as far as SQLAlchemy goes): whether the
driver is installed and the database answers, checked in one quick connect before anything runs;
and MLflow's tables created by one process at a time on PostgreSQL.

SQLAlchemy is imported only here, and only for a database URI (~0.1 s): the commands' fast paths
never import this module for SQLite or HTTP stores.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Iterator

from lsexp.tracking.uri import TrackingError, redact, scrub

DIALECTS = ("postgresql", "mysql", "mssql")  # MLflow's database stores besides SQLite
CONNECT_TIMEOUT_S = 5
SCHEMA_LOCK_TIMEOUT = "300s"  # another process creating MLflow's tables takes ~5 s
# pg_advisory_lock's key for "MLflow's tables are being created": any fixed 32-bit number.
_SCHEMA_LOCK_KEY = zlib.crc32(b"lsexp: mlflow schema")
# What each driver module is installed by.
_INSTALL = {
    "psycopg": 'pip install -e ".[postgres]" (or pip install "psycopg[binary]")',
    "psycopg2": "pip install psycopg2-binary, or use postgresql:// (psycopg 3, the postgres extra)",
    "MySQLdb": "pip install mysqlclient",
    "pymysql": "pip install pymysql",
    "pyodbc": "pip install pyodbc",
}


def backend(uri: str) -> str:
    """postgresql for postgresql+psycopg2://..., and so on; '' for a URI without a scheme."""
    scheme, sep, _ = uri.partition("://")
    return scheme.split("+", 1)[0] if sep else ""


def is_database(uri: str) -> bool:
    return backend(uri) in DIALECTS


def _engine(uri: str):
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    url = sqlalchemy.engine.make_url(uri)
    # libpq's and the MySQL drivers' own option; without it a host that drops packets hangs for minutes
    args = {"connect_timeout": CONNECT_TIMEOUT_S} if backend(uri) in ("postgresql", "mysql") else {}
    return sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=args)


def _clean(text, uri: str) -> str:
    """A driver's message on one line, without the password (should a driver ever echo it)."""
    return scrub(" ".join(str(text).split()), uri) or "no reason given"


def check(uri: str, key: str = "tracking.uri") -> None:
    """Connect once, or raise TrackingError with one line naming the key, the URI without its
    credentials, what is wrong and the fix."""
    import sqlalchemy.exc

    shown = f"{key}={redact(uri)}"
    off = ", or use tracking=none" if key == "tracking.uri" else ""
    try:
        engine = _engine(uri)
    except ModuleNotFoundError as err:  # SQLAlchemy imports the dialect's driver here
        fix = _INSTALL.get(err.name or "", f"install the Python module {err.name}")
        raise TrackingError(f"{shown}: the database driver is not installed (no module named "
                            f"{err.name!r}); {fix}{off}") from None
    except (sqlalchemy.exc.ArgumentError, ValueError) as err:  # a malformed URL or port, an unknown dialect
        raise TrackingError(f"{shown}: not a database URL SQLAlchemy can use ({_clean(err, uri)}); "
                            f"use e.g. postgresql://user:password@host:5432/database{off}") from None
    # Anything else must become the one line too: Hydra turns a callback's exception into a warning
    # and goes on to train.
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.DBAPIError as err:
        password = (
            "the password (in the URI, $PGPASSWORD or ~/.pgpass)"
            if backend(uri) == "postgresql"
            else "the password"
        )
        raise TrackingError(
            f"{shown}: cannot connect to the database ({_clean(err.orig, uri)}); start it, or "
            f"fix the URI's host, port, database or user, or {password}{off}"
        ) from None
    except Exception as err:
        raise TrackingError(
            f"{shown}: cannot use the database ({type(err).__name__}: {_clean(err, uri)}); fix the URI{off}"
        ) from None
    finally:
        engine.dispose()


@contextlib.contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Held while MLflow opens a PostgreSQL store, whose first opening creates the tables.

    MLflow creates them unguarded, so processes opening a new database at the same moment collide
    (IntegrityError on pg_type or alembic_version) and all but one fail. Under this lock the first
    one creates them and the others wait, then find them. It is PostgreSQL's own advisory lock, so
    it holds across machines, and it goes with the connection if its holder dies."""
    if backend(uri) != "postgresql":
        yield
        return
    import sqlalchemy

    engine = _engine(uri)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"SET lock_timeout = '{SCHEMA_LOCK_TIMEOUT}'")
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": _SCHEMA_LOCK_KEY})
    finally:
        engine.dispose()
