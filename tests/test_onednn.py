"""device.onednn_max_cpu_isa=auto: the decision rule with a fake timer, the cache and its lock, the
failures that fall back to null in one line, and a real calibration of real oneDNN on this machine."""

import json
import platform
import threading
import time
from pathlib import Path

import pytest

from conftest import run_cli
from helpers.mlflow_store import runs, store
from lsexp.device import onednn

X86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="oneDNN's ISA cap is x86's")


class FakeTimer:
    """Seconds per step per candidate, and the share of the CPUs others took, as the probes would
    report them; records the candidates of each call."""

    def __init__(self, seconds, delay=0.0, others=0.0):
        self.seconds, self.delay, self.others, self.calls = seconds, delay, others, []

    def __call__(self, candidates):
        self.calls.append(candidates)
        time.sleep(self.delay)
        return {isa: self.seconds[isa] for isa in candidates}, self.others


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LSEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(onednn, "_decided", {})
    return tmp_path / "cache" / onednn.CACHE_FILE


@pytest.mark.parametrize("null, avx2, chosen", [
    (0.240, 0.017, "AVX2"),  # the reference-loop convolutions of this project's AVX-512 machines
    (0.0120, 0.0100, "AVX2"),  # exactly the margin: 1.2x
    (0.0119, 0.0100, None),  # just under it: near-equal candidates keep all the CPU has
    (0.010, 0.013, None),  # the cap slows the step
])
def test_a_cap_is_taken_only_when_clearly_faster(null, avx2, chosen):
    assert onednn.choose({None: null, "AVX2": avx2}) == chosen


def test_calibrates_once_in_order_caches_and_later_reads_spend_no_time(cache):
    timer = FakeTimer({None: 0.24, "AVX2": 0.017})
    said = []
    entry = onednn.cached_or_calibrated(timer, announce=said.append)
    assert timer.calls == [(None, "AVX2")]  # all the CPU has and the cap, measured once
    assert (entry["onednn_max_cpu_isa"] == "AVX2"
            and entry["seconds_per_step"] == {"null": 0.24, "AVX2": 0.017})
    assert len(said) == 2 and "onednn_max_cpu_isa=AVX2" in said[1] and str(cache) in said[1]
    stored = json.loads(cache.read_text())
    assert [e["key"] for e in stored.values()] == [onednn.machine_key()]

    def no_timer(candidates):
        raise AssertionError("a cached decision must not be measured again")

    assert onednn.cached_or_calibrated(no_timer)["onednn_max_cpu_isa"] == "AVX2"
    assert onednn.auto_isa(measure=no_timer) == "AVX2"


def test_a_calibration_on_a_busy_machine_says_so_and_again_measures_anew(cache):
    said = []
    entry = onednn.cached_or_calibrated(FakeTimer({None: 0.24, "AVX2": 0.017}, others=0.48),
                                        announce=said.append)
    assert entry["others_cpu_share"] == 0.48 and len(said) == 3
    assert "other processes used 48% of the CPUs" in said[2] and "--again" in said[2]
    quiet = FakeTimer({None: 0.010, "AVX2": 0.011})
    said.clear()
    entry = onednn.cached_or_calibrated(quiet, announce=said.append, again=True)
    assert quiet.calls and entry["onednn_max_cpu_isa"] is None and len(said) == 2
    assert [e["onednn_max_cpu_isa"] for e in json.loads(cache.read_text()).values()] == [None]


def test_another_machine_kind_in_the_same_cache_gets_its_own_entry(cache, monkeypatch):
    onednn.cached_or_calibrated(FakeTimer({None: 0.24, "AVX2": 0.017}))
    monkeypatch.setattr(onednn, "_onednn_version", lambda: "9.9.9")  # e.g. a MindSpore upgrade
    timer = FakeTimer({None: 0.010, "AVX2": 0.011})
    assert onednn.cached_or_calibrated(timer)["onednn_max_cpu_isa"] is None and len(timer.calls) == 1
    assert len(json.loads(cache.read_text())) == 2


def test_jobs_that_start_together_calibrate_once_and_never_time_each_other(cache):
    timer = FakeTimer({None: 0.24, "AVX2": 0.017}, delay=0.3)
    busy, overlaps, results = threading.Lock(), [], []

    def timed(candidates):
        if not busy.acquire(blocking=False):
            overlaps.append(candidates)
            return timer(candidates)
        try:
            return timer(candidates)
        finally:
            busy.release()

    # each thread opens the lock file itself, as each job's process does; flock holds them apart
    threads = [threading.Thread(target=lambda: results.append(
                   onednn.cached_or_calibrated(timed, announce=str)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert timer.calls == [(None, "AVX2")] and not overlaps
    assert [r["onednn_max_cpu_isa"] for r in results] == ["AVX2"] * 4


def test_an_isa_the_user_exported_wins_over_the_calibration(cache, monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx")
    assert onednn.auto_isa(measure=FakeTimer({})) == "AVX" and not cache.exists()


def test_a_broken_cache_file_warns_once_and_runs_uncapped(cache):
    cache.parent.mkdir()
    cache.write_text('{"half a file')
    lines = []
    assert onednn.auto_isa(warn=lines.append, measure=FakeTimer({None: 0.24, "AVX2": 0.017})) is None
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("lsexp: warning: device.onednn_max_cpu_isa=auto: ")
    assert str(cache) in lines[0] and "delete it" in lines[0] and "running with null" in lines[0]


def test_an_unwritable_cache_folder_warns_once_and_runs_uncapped(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LSEXP_CACHE_DIR", str(tmp_path / "a-file" / "cache"))  # not creatable, even as root
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(onednn, "_decided", {})
    lines = []
    assert onednn.auto_isa(warn=lines.append, measure=FakeTimer({None: 0.24, "AVX2": 0.017})) is None
    assert len(lines) == 1 and "cannot write the cache folder" in lines[0] and "LSEXP_CACHE_DIR" in lines[0]


def test_a_failing_probe_warns_once_runs_uncapped_and_caches_nothing(cache):
    def failing(candidates):
        raise onednn.CalibrationError("the probe with all the CPU has failed (Segmentation fault)")

    lines = []
    assert onednn.auto_isa(warn=lines.append, measure=failing) is None
    assert lines == ["lsexp: warning: device.onednn_max_cpu_isa=auto: the probe with all the CPU has failed "
                     "(Segmentation fault); running with null (all the CPU has)"]
    assert not cache.exists() or json.loads(cache.read_text()) == {}


@X86
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_a_real_calibration_times_real_onednn_within_its_budget(cache):
    started = time.perf_counter()
    entry = onednn.cached_or_calibrated(announce=str)
    took = time.perf_counter() - started
    assert entry["onednn_max_cpu_isa"] == onednn.choose(
        {None if k == "null" else k: v for k, v in entry["seconds_per_step"].items()})
    assert (set(entry["seconds_per_step"]) == {"null", "AVX2"}
            and all(v > 0 for v in entry["seconds_per_step"].values()))
    assert took < 30, took  # 15 s on an idle machine (README, Performance); the suite may share the cores
    assert 0 <= entry["others_cpu_share"] <= 1
    assert not [line for line in _command_lines() if b"lsexp.device.onednn\0--serve" in line], \
        "a probe outlived its calibration"


def _command_lines():
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            yield path.read_bytes()
        except OSError:  # ended meanwhile
            pass


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
@X86
def test_the_cli_records_the_cached_decision_and_does_not_calibrate_again(tmp_path, monkeypatch):
    # an in-process run of this suite may have exported its cap, which a user's export would be
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    # A planted decision that no calibration here would make: the run must read it, not measure.
    folder = tmp_path / "cache"
    folder.mkdir()
    key = onednn.machine_key()
    (folder / onednn.CACHE_FILE).write_text(json.dumps({onednn._key_id(key): {
        "key": key, "onednn_max_cpu_isa": "AVX", "seconds_per_step": {"null": 1.0, "AVX": 0.5}}}))
    out = run_cli("train.max_steps=2", f"tracking.uri={store(tmp_path)}", "train.progress=false",
                  "hydra.run.dir=run", cwd=tmp_path,
                  env={"LSEXP_CACHE_DIR": str(folder), "ONEDNN_VERBOSE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "timing oneDNN" not in out.stdout + out.stderr
    assert any(line.rstrip().endswith("isa:Intel AVX")
               for line in out.stdout.splitlines()), out.stdout[-1500:]
    assert json.loads((tmp_path / "run/summary.json").read_text())["onednn_max_cpu_isa"] == "AVX"
    _, _, found = runs(store(tmp_path))
    assert found[0].data.params["device.onednn_max_cpu_isa"] == "AVX"


def test_a_config_error_never_waits_for_calibration_and_help_never_calibrates(tmp_path):
    env = {"LSEXP_CACHE_DIR": str(tmp_path / "cache")}
    out = run_cli("train.epochs=0", cwd=tmp_path, env=env)
    assert out.returncode == 2 and "train.epochs=0" in out.stderr
    assert run_cli("--help", cwd=tmp_path, env=env).returncode == 0
    assert not (tmp_path / "cache").exists()
