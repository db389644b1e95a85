"""A throwaway PostgreSQL cluster for the tests: Debian's PostgreSQL 15 binaries, on 127.0.0.1 at a
free port, its data in a folder of its own, removed on stop.

initdb and pg_ctl refuse to run as root, so as root they run as the `postgres` user, in a folder
that user owns (pytest's own temporary folders are 0700 root). The superuser connects through a
Unix socket in that folder without a password; everyone else over TCP with a password.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional
from urllib.parse import quote

from conftest import free_port  # noqa: F401  (the tests call it as <cluster module>.free_port)

PG_BIN = Path(os.environ.get("LSEXP_PG_BIN", "/usr/lib/postgresql/15/bin"))


def missing() -> Optional[str]:
    """Why a cluster cannot be started here, or None."""
    for tool in ("initdb", "pg_ctl", "psql"):
        if not (PG_BIN / tool).exists() and not (tool == "psql" and shutil.which("psql")):
            return (f"PostgreSQL's {tool} is not in {PG_BIN} (apt-get install -y postgresql, "
                    f"or set LSEXP_PG_BIN to its bin folder)")
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run initdb and pg_ctl as"
    return None


class Cluster:
    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lsexp-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.root.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")

    def _as_owner(self, *cmd: str) -> List[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)

    def _run(self, *cmd: str) -> str:
        out = subprocess.run(self._as_owner(*cmd), capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: "
                               f"{out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def start(self) -> "Cluster":
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")
        return self

    def psql(self, sql: str) -> str:
        psql = str(PG_BIN / "psql") if (PG_BIN / "psql").exists() else "psql"
        return self._run(psql, "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                         "-v", "ON_ERROR_STOP=1", "-At", "-c", sql)

    def create_role(self, user: str, password: str) -> None:
        """A role that logs in over TCP with the password."""
        self.psql(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")

    def create_database(self, name: str, owner: str) -> None:
        self.psql(f"CREATE DATABASE {name} OWNER {owner}")

    def uri(self, user: str, password: str, name: str) -> str:
        return f"postgresql://{user}:{quote(password, safe='')}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
