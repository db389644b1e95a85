import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from lsexp.config import paths
from lsexp.config.registry import register_configs

register_configs()


def compose_cfg(*overrides: str, hydra_cfg: bool = False):
    """The config `python -m lsexp <overrides>` would run, composed by Hydra itself."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(paths.conf_dir()), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def run_cli(*args: str, cwd: Path, env=None, timeout=600) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "lsexp", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM a server started in its own session, with its children; SIGKILL what outlasts timeout."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def made_once(tmp_path_factory, name: str, make) -> Path:
    """The folder make(folder) fills, once per test session: under pytest -n the first worker to ask
    makes it under a lock while the others wait, then all read it. (xdist_group does not keep a module's
    tests on one worker under pytest 9.2, whose node ids pytest-xdist 3.8 can no longer tag with the
    group: pytest-xdist #1386.)"""
    import fcntl

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    root = tmp_path_factory.getbasetemp().parent  # this session's, shared by its workers
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").exists():
            folder.mkdir(exist_ok=True)
            make(folder)
            (folder / ".made").touch()
    return folder


@pytest.fixture
def train_run(tmp_path):
    """Run a composed config in this process through the real training path;
    returns (summary, history rows, dir)."""
    from lsexp.app import train_here
    from lsexp.training.history import read_history

    counter = iter(range(1000))

    def _run(*overrides: str):
        cfg = compose_cfg("tracking=none", "train.progress=false", *overrides)
        out = tmp_path / f"run{next(counter)}"
        out.mkdir()
        summary = train_here(cfg, out)
        return summary, read_history(out / "history.csv"), out

    return _run


def machine_cpus() -> list:
    """The cores this test session may use, as they were before a pytest -n worker bound itself to its
    share (the controller writes them into LSEXP_TEST_CPUS for its workers)."""
    if os.environ.get("LSEXP_TEST_CPUS"):
        return [int(c) for c in os.environ["LSEXP_TEST_CPUS"].split(",")]
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _bind_worker(workerinput) -> None:
    """Under pytest -n N, worker i and every process its tests start run on their own share of the
    cores, as lsexp binds the parallel jobs of a joblib sweep (lsexp.device.cpu_share): unbound,
    two MindSpore processes' actor and kernel threads wait on each other's time slices. Tests that need
    the whole machine ask for it with the `whole_machine` fixture. LSEXP_TEST_BIND=0 leaves them unbound."""
    cpus, n = machine_cpus(), int(workerinput.get("workercount", 1))
    if os.environ.get("LSEXP_TEST_BIND", "1") == "0" or not cpus or len(cpus) < n or n < 2:
        return
    i = int(workerinput["workerid"].removeprefix("gw"))
    share = len(cpus) // n
    os.sched_setaffinity(0, cpus[i * share:(i + 1) * share])


@pytest.fixture
def whole_machine():
    """Every core of the machine for this test and the processes it starts (a test of core binding);
    the worker's own share again afterwards."""
    if not hasattr(os, "sched_setaffinity"):
        yield []
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, machine_cpus())
    try:
        yield machine_cpus()
    finally:
        os.sched_setaffinity(0, own)


def pytest_configure(config):
    # Every refusal a test makes (exit 2 and its stderr, or a ConfigError it catches) is checked against
    # tests/refusals.json, byte for byte; LSEXP_RECORD_REFUSALS=1 records them (tests/helpers/refusals.py)
    from helpers import refusals

    config.pluginmanager.register(refusals, "lsexp-refusals")
    # device.onednn_max_cpu_isa=auto: every test, and every process a test starts, shares one
    # calibrated decision, made once per checkout in pytest's own cache folder (.pytest_cache/),
    # instead of the user's. Tests of the calibration itself point LSEXP_CACHE_DIR elsewhere.
    if getattr(config, "cache", None) is not None:
        os.environ.setdefault("LSEXP_CACHE_DIR", str(config.cache.mkdir("lsexp")))
    if hasattr(config, "workerinput"):
        _bind_worker(config.workerinput)
    else:
        os.environ.setdefault("LSEXP_TEST_CPUS", ",".join(map(str, machine_cpus())))
        # Calibrate here, before pytest -n starts its workers: with tests running beside it the probe's
        # timings are too noisy to trust (under -n 2 a first CI run measured AVX2 0.279 s against
        # 0.320 s a step, below the 1.2 margin, and took null, 8x slower on convolutions).
        from lsexp.device.onednn import auto_isa

        auto_isa()


DURATIONS = Path(__file__).parent / "durations.json"


def pytest_collection_modifyitems(session, config, items):
    """The longest tests first, by their times in tests/durations.json (a test not in it counts as
    short): under pytest -n the last test to start then is a short one, where in file order a
    four-minute test could start last and leave the other core idle. The order changes what runs when,
    not what runs. python tests/helpers/durations.py JUNIT_XML... writes the file anew."""
    import json

    if not DURATIONS.exists():
        return
    seconds = json.loads(DURATIONS.read_text())
    order = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-seconds.get(item.nodeid, 0.0), order[item.nodeid]))
