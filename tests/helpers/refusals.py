"""Every refusal the suite makes, recorded once and checked byte for byte on every run (tests/conftest.py
registers this module as a plugin).

A refusal is lsexp rejecting bad input: a `python -m lsexp ...` (or `-m lsexp.<module>`, the `lsexp`
script, a `python -c` running lsexp) that a test starts with subprocess.run and that exits 2 or prints an
`lsexp: config error` line; or a ConfigError that a test catches with pytest.raises (its str(): the lines
the command would print). Observed, not replaced: subprocess.run and pytest.raises are wrapped, take the
same arguments and return or raise the same, and this module only reads what they return. Each refusal
is keyed by the test's node id and its ordinal within the test (`tests/test_x.py::test_y[a] #2`), so the
keys do not depend on the order the tests run in.

Before recording and comparing, the stderr is normalised (normalise()): the test's tmp_path, pytest's
temporary folders, the virtual environment and the repository become placeholders, as do what changes
from run to run (ports the kernel hands out, MLflow run ids, a pytest -n worker's cores), and MindSpore's
own log lines are dropped.

    LSEXP_RECORD_REFUSALS=1 python -m pytest -n 2 ...   # record: the tests that ran replace their entries
    python -m pytest -n 2 ...                           # check (the default), against tests/refusals.json

In check mode a refusal whose key is in tests/refusals.json must match it exactly (exit code and stderr),
and a test that passes must make as many refusals as were recorded for it; else the test fails with a
diff. A refusal not in the file passes and is listed at the end of the session.

    python tests/helpers/refusals.py --merge JOURNAL   # a recording that died: $TMPDIR/lsexp-refusals-*.jsonl
    python tests/helpers/refusals.py --stats           # how many refusals tests/refusals.json holds
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

import pytest

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
RECORDING = TESTS / "refusals.json"
RECORD_ENV = "LSEXP_RECORD_REFUSALS"
JOURNAL_ENV = "LSEXP_REFUSALS_JOURNAL"  # the recording session's journal, one JSON line per refusal

# MindSpore's own log lines: [WARNING] ME(12345:1402...,MainProcess):2026-12-07-10:00:00.123.456 [...] ...
_MINDSPORE_LOG = re.compile(r"\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|EXCEPTION)\] [A-Z][A-Z0-9_]*\(\d+[,:]")
_CORES = re.compile(r"cores (\[[\d, ]*\])")
# a port the kernel handed out (free_port(), a cluster's), not a fixed one such as 5000 or 5432
_PORT = re.compile(r"(?:(?<=127\.0\.0\.1:)|(?<=localhost:)|(?<=\bport )|(?<=--port=))\d+\b")
_RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")  # an MLflow run's id, random


def _ephemeral_ports():
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_ports()
_PYTEST_TMP = re.compile(re.escape(tempfile.gettempdir()) + r"/pytest-of-[^/]+/pytest-\d+(?:/popen-gw\d+)?")


class _Test:
    """The test running in this process and what it refused so far."""

    item = None
    made = 0
    mismatches: list = []
    checked = 0
    unrecorded: list = []


_lock = threading.Lock()
_recorded: Optional[dict] = None  # tests/refusals.json, loaded once per process
_counts: Optional[dict] = None  # node id -> how many refusals tests/refusals.json has for it
_ran: set = set()  # the controller: the tests whose body ran in this session
_unrecorded: list = []  # the controller: keys of refusals made that tests/refusals.json lacks
_checked = 0
_restore: list = []


def recording() -> bool:
    return os.environ.get(RECORD_ENV, "") not in ("", "0")


def key_of(nodeid: str, n: int) -> str:
    return f"{nodeid} #{n}"


def _split_key(key: str):
    nodeid, _, n = key.rpartition(" #")
    return nodeid, int(n)


# --- normalising --------------------------------------------------------------------------------------
def normalise(text: Optional[str], tmp_paths=(), basetemps=()) -> Optional[str]:
    """stderr as it is recorded and compared: the test's folders, pytest's, the virtual environment's and
    the repository's as placeholders, and what changes from run to run (the ports the kernel hands out,
    MLflow's run ids, a pytest -n worker's cores), without MindSpore's log lines."""
    if text is None:
        return None
    lines = [line for line in text.splitlines(keepends=True) if not _MINDSPORE_LOG.match(line)]
    text = "".join(lines)
    for folder, name in [*((p, "<tmp_path>") for p in tmp_paths), *((p, "<basetemp>") for p in basetemps)]:
        text = text.replace(folder, name)
    text = _PYTEST_TMP.sub("<basetemp>", text)
    for folder, name in ((sys.prefix, "<venv>"), (str(REPO), "<repo>")):
        text = text.replace(folder, name)
    text = _PORT.sub(lambda m: "<port>" if _EPHEMERAL[0] <= int(m.group(0)) <= _EPHEMERAL[1] else m.group(0),
                     text)
    text = _RUN_ID.sub("<run id>", text)
    if hasattr(os, "sched_getaffinity"):  # a pytest -n worker's share of the cores, which its tests inherit
        own = str(sorted(os.sched_getaffinity(0)))
        text = _CORES.sub(lambda m: "cores <own cores>" if m.group(1) == own else m.group(0), text)
    return text


def _folders(item):
    """The test's tmp_path, and pytest's base folder for this session, as the stderr may name them."""
    tmp_paths, basetemps = [], []
    tmp_path = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if tmp_path is not None:
        tmp_paths = sorted({str(tmp_path), os.path.realpath(tmp_path)}, key=len, reverse=True)
    factory = getattr(item.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    if base is not None:
        basetemps = [str(base)] + ([str(base.parent)] if hasattr(item.config, "workerinput") else [])
    return tmp_paths, basetemps


# --- observing ----------------------------------------------------------------------------------------
def _is_lsexp(args) -> bool:
    """Whether a subprocess.run argv runs lsexp: `-m lsexp`, `-m lsexp.<module>`, the lsexp script, or
    `python -c` code that imports lsexp."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = os.fsdecode(args).split()
    try:
        args = [os.fsdecode(a) for a in args]
    except TypeError:
        return False
    if args and os.path.basename(args[0]) == "lsexp":
        return True
    for flag, value in zip(args, args[1:]):
        if flag == "-m" and (value == "lsexp" or value.startswith("lsexp.")):
            return True
        if flag == "-c" and "lsexp" in value:
            return True
    return False


def _text(output) -> Optional[str]:
    if output is None or isinstance(output, str):
        return output
    return output.decode("utf-8", "backslashreplace")


def _observe_process(returncode: int, stdout, stderr, kwargs) -> None:
    err = _text(stdout if kwargs.get("stderr") == subprocess.STDOUT else stderr)
    if returncode == 2 or (err is not None and any(
            line.startswith("lsexp: config error") for line in err.splitlines())):
        observe(returncode, err)


def _run(run):
    @functools.wraps(run)
    def wrapper(*popenargs, **kwargs):
        if _Test.item is None or not _is_lsexp(popenargs[0] if popenargs else kwargs.get("args", ())):
            return run(*popenargs, **kwargs)
        try:
            out = run(*popenargs, **kwargs)
        except subprocess.CalledProcessError as err:  # check=True
            _observe_process(err.returncode, err.stdout, err.stderr, kwargs)
            raise
        _observe_process(out.returncode, out.stdout, out.stderr, kwargs)
        return out

    return wrapper


def _is_config_error(exc) -> bool:
    return any(c.__name__ == "ConfigError" and c.__module__.startswith("lsexp.")
               for c in type(exc).__mro__)


def _raises_exit(exit_):
    @functools.wraps(exit_)
    def __exit__(self, exc_type, exc_val, exc_tb):
        __tracebackhide__ = True
        caught = exit_(self, exc_type, exc_val, exc_tb)
        if caught and _Test.item is not None and _is_config_error(exc_val):
            observe(None, str(exc_val))
        return caught

    return __exit__


def observe(exit_code: Optional[int], stderr: Optional[str]) -> None:
    """One refusal by the running test: journalled when recording, else compared with the recording."""
    item = _Test.item
    with _lock:
        _Test.made += 1
        key = key_of(item.nodeid, _Test.made)
    entry = {"exit": exit_code, "stderr": normalise(stderr, *_folders(item))}
    if recording():
        _journal({"key": key, **entry})
        return
    recorded = load().get(key)
    if recorded is None:
        _Test.unrecorded.append(key)
    elif recorded != entry:
        _Test.mismatches.append(_difference(key, recorded, entry))
    else:
        _Test.checked += 1


def _difference(key: str, recorded: dict, now: dict) -> str:
    head = f"refusal {key} differs from {RECORDING.relative_to(REPO)}"
    lines = [head]
    if recorded["exit"] != now["exit"]:
        lines.append(f"exit code: recorded {recorded['exit']}, now {now['exit']}")
    if recorded["stderr"] != now["stderr"]:
        diff = difflib.unified_diff((recorded["stderr"] or "").splitlines(keepends=True),
                                    (now["stderr"] or "").splitlines(keepends=True), "recorded", "now")
        lines.append("".join(line if line.endswith("\n") else line + "\n\\ no newline at end\n"
                             for line in diff).rstrip("\n"))
    return "\n".join(lines)


# --- the recording ------------------------------------------------------------------------------------
def load() -> dict:
    global _recorded, _counts
    if _recorded is None:
        _recorded = json.loads(RECORDING.read_text()) if RECORDING.exists() else {}
        _counts = {}
        for key in _recorded:
            nodeid = _split_key(key)[0]
            _counts[nodeid] = _counts.get(nodeid, 0) + 1
    return _recorded


def _journal(entry: dict) -> None:
    import fcntl

    line = json.dumps({"nodeid": _Test.item.nodeid, **entry}, ensure_ascii=False) + "\n"
    with open(os.environ[JOURNAL_ENV], "a", encoding="utf-8") as journal:
        fcntl.flock(journal, fcntl.LOCK_EX)
        journal.write(line)
        journal.flush()


def merge(journal: Path, ran=()) -> dict:
    """tests/refusals.json anew: the refusals in the journal, in place of every entry of the tests that
    made them or ran (the set ran), and the other tests' entries as they were. Sorted by node id and
    ordinal, one key per refusal."""
    entries = dict(load())
    made = {}
    for line in journal.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        made[entry["key"]] = {"exit": entry["exit"], "stderr": entry["stderr"]}
    replaced = set(ran) | {_split_key(key)[0] for key in made}
    entries = {k: v for k, v in entries.items() if _split_key(k)[0] not in replaced} | made
    entries = dict(sorted(entries.items(), key=lambda kv: _split_key(kv[0])))
    RECORDING.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return made


def stats(entries: dict) -> str:
    process = sum(e["exit"] is not None for e in entries.values())
    tests = len({_split_key(k)[0] for k in entries})
    return (f"{len(entries)} refusals by {tests} tests: {process} through a subprocess, "
            f"{len(entries) - process} in process")


# --- the plugin (tests/conftest.py registers this module) ----------------------------------------------
def pytest_configure(config):
    import _pytest.raises

    raises = getattr(_pytest.raises, "RaisesExc", None)
    if raises is None:  # pytest < 8.4
        import _pytest.python_api

        raises = _pytest.python_api.RaisesContext
    _restore.extend([(subprocess, "run", subprocess.run), (raises, "__exit__", raises.__exit__)])
    subprocess.run = _run(subprocess.run)
    raises.__exit__ = _raises_exit(raises.__exit__)
    if recording() and not hasattr(config, "workerinput"):
        _same_lsexp_without_pythonpath()
        fd, path = tempfile.mkstemp(prefix="lsexp-refusals-", suffix=".jsonl")
        os.close(fd)
        os.environ[JOURNAL_ENV] = path  # the pytest -n workers, started later, inherit it


def _same_lsexp_without_pythonpath() -> None:
    """Some tests give their command a PYTHONPATH of their own, and it then imports lsexp from where the
    environment's install points: a recording must come from this checkout's code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", "import lsexp; print(lsexp.__file__)"], env=env,
                           capture_output=True, text=True).stdout.strip()
    if not found.startswith(str(REPO / "src") + os.sep):
        raise pytest.UsageError(
            f"{RECORD_ENV}: without PYTHONPATH, {sys.executable} imports lsexp from {found or 'nowhere'}, "
            f"not from {REPO / 'src'}; tests that set their command's PYTHONPATH would record that code's "
            f"refusals. Record with an environment where lsexp is this checkout (pip install -e .)")


def pytest_unconfigure(config):
    while _restore:
        owner, name, value = _restore.pop()
        setattr(owner, name, value)


def _start(item):
    _Test.item, _Test.made, _Test.mismatches, _Test.checked, _Test.unrecorded = item, 0, [], 0, []


def _fail_if_different(item, when: str, error: Optional[BaseException], count: bool = False) -> None:
    if count and error is None and not recording():
        load()
        recorded = _counts.get(item.nodeid, 0)
        if _Test.made < recorded:
            missing = ", ".join(f"#{n}" for n in range(_Test.made + 1, recorded + 1))
            _Test.mismatches.append(f"{item.nodeid} made {_Test.made} refusal(s) where "
                                    f"{RECORDING.relative_to(REPO)} has {recorded}: {missing} no longer made")
    summary = []
    if recording() and _Test.made:
        summary.append(f"recorded {_Test.made}")
    if _Test.checked:
        summary.append(f"checked {_Test.checked}")
    summary += [f"not recorded: {key}" for key in _Test.unrecorded]
    _Test.checked, _Test.unrecorded = 0, []
    mismatches, _Test.mismatches = _Test.mismatches, []
    if summary:
        item.add_report_section(when, "lsexp refusals", "\n".join(summary))
    if not mismatches:
        return
    message = "\n\n".join(mismatches)
    if error is not None:  # the test failed anyway: the differences go into its report
        item.add_report_section(when, "lsexp refusals that differ", message)
        return
    pytest.fail(message + "\n(LSEXP_RECORD_REFUSALS=1 records them anew: docs/testing.md)", pytrace=False)


def _phase(when: str, count: bool = False):
    @pytest.hookimpl(wrapper=True)
    def hook(item):
        if when == "setup":
            _start(item)
        try:
            result = yield
        except BaseException as error:
            _fail_if_different(item, when, error)
            raise
        _fail_if_different(item, when, None, count)
        return result

    return hook


pytest_runtest_setup = _phase("setup")
pytest_runtest_call = _phase("call", count=True)
pytest_runtest_teardown = _phase("teardown")


def pytest_runtest_logfinish(nodeid, location):
    _Test.item = None


def pytest_runtest_logreport(report):
    """In the controller (and in a run without -n): which tests ran, and the refusals not recorded."""
    global _checked
    if report.when == "call":
        _ran.add(report.nodeid)
    for title, text in report.sections:  # a report has the sections of its test's earlier phases too
        if title == f"Captured lsexp refusals {report.when}":
            for line in text.splitlines():
                if line.startswith("not recorded: "):
                    _unrecorded.append(line.removeprefix("not recorded: "))
                elif line.startswith("checked "):
                    _checked += int(line.removeprefix("checked "))


def pytest_sessionfinish(session, exitstatus):
    """The controller of a recording session merges the journal into tests/refusals.json."""
    global _recorded
    config = session.config
    if not recording() or hasattr(config, "workerinput") or JOURNAL_ENV not in os.environ:
        return
    journal = Path(os.environ[JOURNAL_ENV])
    made = merge(journal, _ran)
    journal.unlink()
    _recorded = None
    config._lsexp_refusals = (f"recorded {stats(made)}; {RECORDING.relative_to(REPO)} now holds "
                              f"{stats(load())}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    if recording():
        text = getattr(config, "_lsexp_refusals", None)
        if text:
            terminalreporter.write_sep("-", "lsexp refusals")
            terminalreporter.write_line(text)
        return
    if not (_checked or _unrecorded):
        return
    terminalreporter.write_sep("-", "lsexp refusals")
    terminalreporter.write_line(f"{_checked} refusals checked against {RECORDING.relative_to(REPO)}; "
                                f"{len(_unrecorded)} made that it does not hold")
    for key in sorted(_unrecorded)[:20]:
        terminalreporter.write_line(f"  {key}")
    if len(_unrecorded) > 20:
        terminalreporter.write_line(f"  ... and {len(_unrecorded) - 20} more")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--merge"] and len(sys.argv) == 3:
        print(f"{stats(merge(Path(sys.argv[2])))} merged into {RECORDING}")
    elif sys.argv[1:] == ["--stats"]:
        print(stats(load()))
    else:
        sys.exit("usage: python tests/helpers/refusals.py --merge JOURNAL | --stats")
