"""Where a test's time goes, for docs/testing.md: with this folder on PYTHONPATH and LSEXP_TIMESPLIT_DIR
set, every Python process (the pytest workers and each process a test starts) appends one JSON line at
exit to LSEXP_TIMESPLIT_DIR/<pid>.jsonl: the test it ran under (PYTEST_CURRENT_TEST, which a child
inherits), its lifetime, the time its `import mindspore` and `import mlflow` took, and the time spent
in MindSpore's graph compiler and in running compiled graphs. A pytest worker writes one line per test
instead (tests/helpers/timesplit/timesplit_plugin.py). Measurement only: nothing here changes what runs.

    LSEXP_TIMESPLIT_DIR=/tmp/split PYTHONPATH=tests/helpers/timesplit \\
        python -m pytest -n 2 -p timesplit_plugin -m "not msrun and ..."
    python tests/helpers/timesplit/report.py /tmp/split
"""

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

OUT = os.environ.get("LSEXP_TIMESPLIT_DIR")
STARTED = time.perf_counter()
TOTALS = {"import_mindspore": 0.0, "import_mlflow": 0.0, "compile": 0.0, "run_graph": 0.0,
          "compiles": 0, "graph_runs": 0}


def _timed(totals_key, count_key, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[totals_key] += time.perf_counter() - t
            TOTALS[count_key] += 1
    wrapper.__wrapped__ = fn
    return wrapper


def _instrument_mindspore():
    from mindspore.graph import api

    ex = api._CellGraphExecutor
    ex.compile = _timed("compile", "compiles", ex.compile)
    ex.run = _timed("run_graph", "graph_runs", ex.run)
    jit = api._JitExecutor
    jit.compile = _timed("compile", "compiles", jit.compile)


class _TimedImport(importlib.abc.MetaPathFinder):
    """Times the first import of mindspore and of mlflow, submodules it pulls in included."""

    def find_spec(self, name, path=None, target=None):
        if name not in ("mindspore", "mlflow"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, exec_module = spec.loader, spec.loader.exec_module

        def timed_exec(module):
            t = time.perf_counter()
            try:
                exec_module(module)
            finally:
                TOTALS[f"import_{name}"] += time.perf_counter() - t
            if name == "mindspore":
                _instrument_mindspore()

        loader.exec_module = timed_exec
        return spec


def snapshot():
    return dict(TOTALS)


def _write_exit():
    if os.environ.get("LSEXP_TIMESPLIT_PLUGIN_PID") == str(os.getpid()):
        return  # a pytest worker: the plugin wrote a line per test
    line = dict(TOTALS, test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
                argv=" ".join(sys.argv[:4])[:200], lifetime=time.perf_counter() - STARTED, kind="process")
    with open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def _exit_after_writing(code):
    _write_exit()
    _os_exit(code)


if OUT:
    sys.meta_path.insert(0, _TimedImport())
    atexit.register(_write_exit)
    # lsexp's command ends its processes with os._exit (MindSpore's teardown is slow), which skips atexit
    _os_exit = os._exit
    os._exit = _exit_after_writing
