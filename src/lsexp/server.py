"""`lsexp server`: a team's MLflow tracking server, its runs in a database (PostgreSQL), its artifacts
served through it.

It checks what it can in one line each (the database's driver and login, the artifact folder, the
port), then becomes `mlflow server` (exec: its signals, its exit code) with
- the database URI passed in the environment, not on the command line, so that `ps` does not show
  a password in it;
- --serve-artifacts: clients upload and download artifacts through the server, so none of them
  needs access to the artifact store, and the runs of every machine land in one place;
- MLflow's job runner off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false): it serves GenAI features
  lsexp does not use, with extra processes.
Options it does not know go to `mlflow server` as they are (e.g. --allowed-hosts).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

PROG = "lsexp server"


class _Refused(Exception):
    """str() is the one line for the user."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description="Start the team's MLflow tracking server: runs in a database, artifacts served "
        "through the server. Runs then log to it with tracking.uri=http://HOST:PORT. Options not "
        "listed here go to `mlflow server` as they are.",
    )
    parser.add_argument(
        "--backend-store-uri",
        default=os.environ.get("MLFLOW_BACKEND_STORE_URI"),
        help="the database, e.g. postgresql://mlflow@127.0.0.1:5432/mlflow (the password from "
        "$PGPASSWORD or ~/.pgpass, or in the URI); default: $MLFLOW_BACKEND_STORE_URI",
    )
    parser.add_argument(
        "--artifacts-destination",
        default="mlartifacts",
        help="where the server keeps the runs' artifacts: a folder (created if missing) or an "
        "object store URI such as s3://bucket/path (default: ./mlartifacts)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 for other machines, with --allowed-hosts (default: %(default)s)",
    )
    parser.add_argument("--port", type=int, default=5000, help="(default: %(default)s)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes; each holds its own copy of MLflow in memory (default: %(default)s)",
    )
    return parser


def command(argv: Sequence[str]) -> Tuple[List[str], Dict[str, str], str]:
    """The checked `mlflow server` command line, its environment and a line saying what it serves;
    _Refused if something cannot work."""
    args, extra = _parser().parse_known_args(list(argv))
    from lsexp.tracking import database
    from lsexp.tracking.store import check_reachable
    from lsexp.tracking.uri import TrackingError, redact

    uri = args.backend_store_uri
    if not uri:
        raise _Refused(
            "--backend-store-uri is not set; give the database, e.g. --backend-store-uri "
            "postgresql://mlflow@127.0.0.1:5432/mlflow, or set MLFLOW_BACKEND_STORE_URI"
        )
    if not (database.is_database(uri) or uri.startswith("sqlite:///")):
        raise _Refused(
            f"--backend-store-uri={redact(uri)}: not a database URI; give e.g. "
            f"postgresql://mlflow@127.0.0.1:5432/mlflow"
        )
    if args.workers < 1:
        raise _Refused(f"--workers={args.workers}: must be 1 or more")
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        with socket.create_server((args.host, args.port), family=family):
            pass
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise _Refused(
            f"--port={args.port}: cannot listen on {args.host}:{args.port} ({reason}); "
            f"pick another --port, or stop what uses it"
        ) from None
    try:
        check_reachable(uri, "--backend-store-uri")
    except TrackingError as err:
        raise _Refused(str(err)) from None
    destination = args.artifacts_destination
    if "://" not in destination:
        try:
            Path(destination).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _Refused(
                f"--artifacts-destination={destination}: cannot create it ({err.strerror}); "
                f"point it at a folder the server can write"
            ) from None
        destination = str(Path(destination).resolve())
    env = dict(os.environ, MLFLOW_BACKEND_STORE_URI=uri)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--serve-artifacts",
        "--artifacts-destination",
        destination,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        str(args.workers),
        *extra,
    ]
    host = "<this machine>" if args.host in ("0.0.0.0", "::") else args.host
    return (
        cmd,
        env,
        (
            f"runs in {redact(uri)}, artifacts in {destination}; "
            f"log to it with tracking.uri=http://{host}:{args.port}"
        ),
    )


def main(argv: Sequence[str] = ()) -> int:
    try:
        cmd, env, serving = command(argv)
    except _Refused as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    print(f"{PROG}: {serving}", file=sys.stderr, flush=True)
    os.execve(sys.executable, cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
