"""pytest plugin of the time split (sitecustomize.py beside it): one JSON line per test, from the
process that runs it, with the test's wall time (setup, call and teardown) and what of it went to
MindSpore's import, its graph compiler and its compiled graphs. Load it with -p timesplit_plugin."""

import json
import os
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import sitecustomize

    out = os.environ.get("LSEXP_TIMESPLIT_DIR")
    if not out or not hasattr(sitecustomize, "snapshot"):
        yield
        return
    os.environ["LSEXP_TIMESPLIT_PLUGIN_PID"] = str(os.getpid())
    before, started = sitecustomize.snapshot(), time.perf_counter()
    yield
    after = sitecustomize.snapshot()
    line = {key: after[key] - before[key] for key in after}
    line.update(test=item.nodeid, wall=time.perf_counter() - started, kind="test")
    with open(os.path.join(out, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
