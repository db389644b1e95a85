"""The team server on PostgreSQL: how long `lsexp server` takes to answer, what it holds in memory,
and what the database check costs a command.

    python benchmarks/team_server.py [repeats]

Needs Debian's PostgreSQL 15 (apt-get install -y postgresql) and the postgres extra. Starts a
throwaway cluster (tests/helpers/pg_cluster.py), then, `repeats` times each:
- `lsexp server --workers 1` from its start until /health answers, on a new database (MLflow creates
  its tables) and on one that has them;
- the memory of the server's processes (`mlflow server` and its uvicorn worker), RSS and PSS, once it
  has served one 5-step run's logging;
- the database check alone in a new interpreter (importing SQLAlchemy and psycopg, one connect);
- the whole `lsexp` command refused for a wrong password.
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import pg_cluster  # noqa: E402

USER, PASSWORD = "bench", "bench-pw"


def start_server(db: str, cwd: Path):
    port = pg_cluster.free_port()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lsexp", "server", "--backend-store-uri", db,
                             "--port", str(port), "--artifacts-destination", str(cwd / "artifacts")],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"lsexp server exited {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url, time.perf_counter() - start
        except OSError:
            time.sleep(0.05)


def stop_server(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


def group_memory_mib(pgid: int):
    """RSS and PSS summed over the processes of a process group (PSS counts shared pages once)."""
    rss = pss = 0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or os.getpgid(int(proc.name)) != pgid:
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (OSError, ProcessLookupError):
            continue
    return rss / 1024, pss / 1024


def timed(cmd, cwd) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(repeats: int) -> None:
    reason = pg_cluster.missing()
    if reason:
        raise SystemExit(reason)
    cluster = pg_cluster.Cluster().start()
    try:
        cluster.create_role(USER, PASSWORD)
        new_db, existing_db, memory = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(repeats):
                cluster.create_database(f"b{i}", USER)
                db = cluster.uri(USER, PASSWORD, f"b{i}")
                cwd = Path(tmp) / f"r{i}"
                cwd.mkdir()
                for times in (new_db, existing_db):
                    proc, url, seconds = start_server(db, cwd)
                    times.append(seconds)
                    if times is existing_db:
                        subprocess.run([sys.executable, "-m", "lsexp", "train.max_steps=5",
                                        "train.progress=false", f"tracking.uri={url}"], cwd=cwd, check=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        memory.append(group_memory_mib(proc.pid))
                    stop_server(proc)
            db = cluster.uri(USER, PASSWORD, "b0")
            check = [float(subprocess.run(
                [sys.executable, "-c", "import time; t = time.perf_counter(); "
                 "from lsexp.tracking.store import check_reachable; "
                 f"check_reachable({db!r}); print(time.perf_counter() - t)"],
                capture_output=True, text=True, check=True).stdout) for _ in range(repeats)]
            wrong = cluster.uri(USER, "wrong", "b0")
            refused = [timed([sys.executable, "-m", "lsexp", "train.max_steps=2",
                              f"tracking.uri={wrong}"], tmp)
                       for _ in range(repeats)]
    finally:
        cluster.stop()

    def line(what, values, unit="s", fmt="{:.2f}"):
        shown = ", ".join(fmt.format(v) for v in values)
        print(f"{what:<52} median {fmt.format(statistics.median(values))} {unit} [{shown}]")

    line("lsexp server until /health, new database", new_db)
    line("lsexp server until /health, tables in place", existing_db)
    line("server processes' RSS after one run (MiB)", [m[0] for m in memory], "MiB", "{:.0f}")
    line("server processes' PSS after one run (MiB)", [m[1] for m in memory], "MiB", "{:.0f}")
    line("database check in a new interpreter", check, "s", "{:.3f}")
    line("lsexp command refused (wrong password)", refused)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
