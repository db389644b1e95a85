"""`device.onednn_max_cpu_isa=auto`: the oneDNN instruction-set cap measured once per machine.

On some AVX-512 CPUs, MindSpore 2.10's oneDNN runs NCHW forward convolutions through its reference
loop (`ONEDNN_VERBOSE=1` shows `jit_uni_ncsp:conv+ref:any`), where a cap at AVX2 takes its GEMM
kernels; on other CPUs the cap gains nothing. So, as cuDNN's benchmark mode and FFTW's wisdom do,
the first run on a machine times a small training step once per candidate, each in its own process
(oneDNN reads its cap once per process), and caches the decision for every later run and job.

The cache is keyed by what the decision depends on (the CPU's model and flags, MindSpore's and
oneDNN's versions), so a shared home folder serves several kinds of machine. A capped candidate is
taken only when it is clearly faster: between near-equal candidates a cleared cache must not flip
the choice, because the cap also changes the convolutions' rounding.

    python -m lsexp.runtime.onednn          # calibrate now (or show the cached decision) and print it
    python -m lsexp.runtime.onednn --again  # measure again and replace this machine's decision
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

CANDIDATES = (None, "AVX2")  # None: all the CPU has, oneDNN's own choice
MARGIN = 1.2  # a cap must be this much faster than all the CPU has
PROBE_TIMEOUT_S = 60.0  # the whole measurement, start-up and compilation included
ROUNDS = (4, 12)  # turns per candidate: at least, at most
ROUNDS_BUDGET_S = 4.0  # after the least, no new round past this
BUSY = 0.25  # a calibration while other processes took this share of the CPUs says so
CACHE_FILE = "onednn-isa.json"
ENV = "ONEDNN_MAX_CPU_ISA"

Measure = Callable[[Tuple[Optional[str], ...]], Tuple[Dict[Optional[str], float], Optional[float]]]


class CalibrationError(Exception):
    """Why no decision could be made or kept; the run goes on with all the CPU has."""


def cache_dir() -> Path:
    """$LSEXP_CACHE_DIR, else the XDG cache folder's lsexp/ (~/.cache/lsexp)."""
    if os.environ.get("LSEXP_CACHE_DIR"):
        return Path(os.environ["LSEXP_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "lsexp"


def _cpu() -> Dict[str, str]:
    model, flags = "", ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name.strip() == "model name" and not model:
                model = value.strip()
            elif name.strip() == "flags" and not flags:
                flags = " ".join(sorted(value.split()))
            if model and flags:
                break
    return {"cpu": model, "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:16]}


def _onednn_version() -> str:
    """The version of the oneDNN MindSpore ships, read from the library without starting MindSpore."""
    import ctypes
    import importlib.util

    spec = importlib.util.find_spec("mindspore")
    if spec is None or spec.origin is None:
        return "none"
    lib = Path(spec.origin).parent / "lib" / "libdnnl.so.3"

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int)]

    try:
        dnnl = ctypes.CDLL(str(lib))
    except OSError:
        return "none"
    dnnl.dnnl_version.restype = ctypes.POINTER(Version)
    v = dnnl.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def machine_key() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        mindspore = version("mindspore")
    except PackageNotFoundError:
        mindspore = "none"
    return {**_cpu(), "mindspore": mindspore, "onednn": _onednn_version()}


def _key_id(key: Dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def choose(seconds_per_step: Dict[Optional[str], float]) -> Optional[str]:
    """The fastest capped candidate if it beats all the CPU has by MARGIN, else None."""
    base = seconds_per_step[None]
    capped = {isa: s for isa, s in seconds_per_step.items() if isa is not None}
    if not capped:
        return None
    best = min(capped, key=capped.get)
    return best if capped[best] * MARGIN <= base else None


def _serve(isa: Optional[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if isa is not None:
        env[ENV] = isa
    env.setdefault("GLOG_v", "3")  # MindSpore's start-up chatter would fill the pipe
    return subprocess.Popen(
        [sys.executable, "-m", "lsexp.runtime.onednn", "--serve"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answer(proc: subprocess.Popen, isa: Optional[str], deadline: float):
    """The probe's next JSON line, or CalibrationError if it dies or the deadline passes first."""
    import select

    name = isa or "all the CPU has"
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            raise CalibrationError(f"the probe with {name} took over {PROBE_TIMEOUT_S:.0f} s")
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            tail = (proc.stderr.read().strip().splitlines() or ["no output"])[-1]
            raise CalibrationError(f"the probe with {name} failed ({tail[:200]})")
        with contextlib.suppress(ValueError):
            return json.loads(line)


def _cpu_seconds(pids) -> Tuple[float, float]:
    """CPU seconds the whole machine, and the given processes, have used since boot (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    machine = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    own = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as fh:
            own += sum(int(v) for v in fh.read().rsplit(")", 1)[1].split()[11:13])  # utime, stime
    return machine / tick, own / tick


def measure(candidates=CANDIDATES) -> Tuple[Dict[Optional[str], float], Optional[float]]:
    """Seconds per step of the probe under each candidate cap, each in its own process (oneDNN reads
    its cap once per process), and the share of the CPUs other processes used meanwhile (None where
    the system does not say). The processes start and compile together, then take turns, a few steps
    each, over several rounds, never two at once: a load that comes and goes then lands on every
    candidate alike, where timing one after the other let a busy spell decide. Each candidate's
    figure is the median over rounds of its fastest step in a round."""
    procs = {isa: _serve(isa) for isa in candidates}
    pids = [proc.pid for proc in procs.values()]
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    try:
        for isa, proc in procs.items():
            _answer(proc, isa, deadline)  # compiled and warm
        fastest = {isa: [] for isa in candidates}
        started = time.monotonic()
        try:
            used_before = _cpu_seconds(pids)
        except OSError:
            used_before = None
        for turn in range(ROUNDS[1]):
            if turn >= ROUNDS[0] and time.monotonic() - started > ROUNDS_BUDGET_S:
                break
            order = candidates if turn % 2 == 0 else candidates[::-1]
            for isa in order:
                procs[isa].stdin.write("turn\n")
                procs[isa].stdin.flush()
                fastest[isa].append(_answer(procs[isa], isa, deadline))
        others = None
        if used_before is not None:
            machine, own = (after - before for after, before in zip(_cpu_seconds(pids), used_before))
            others = max(0.0, machine - own) / ((time.monotonic() - started) * (os.cpu_count() or 1))
    finally:
        for proc in procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()  # a probe ends at the end of its input
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    return {isa: statistics.median(times) for isa, times in fastest.items()}, others


def calibrate(measure: Measure = measure) -> dict:
    started = time.perf_counter()
    seconds, others = measure(CANDIDATES)
    entry = {
        "onednn_max_cpu_isa": choose(seconds),
        "seconds_per_step": {str(isa or "null"): round(seconds[isa], 6) for isa in CANDIDATES},
        "calibration_seconds": round(time.perf_counter() - started, 2),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if others is not None:
        entry["others_cpu_share"] = round(others, 3)
    return entry


def _read(path: Path) -> dict:
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):  # no cache yet; whether one can be made is for later
        return {}
    except OSError as err:
        raise CalibrationError(f"cannot read {path} ({err.strerror})") from None
    try:
        entries = json.loads(text)
        if not isinstance(entries, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        raise CalibrationError(
            f"{path} is not a calibration cache (not a JSON object); delete it to calibrate again"
        ) from None
    return entries


def _write(path: Path, entries: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)  # whole or not at all, for readers that do not take the lock


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    import fcntl

    with open(folder / f"{CACHE_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the kernel lets go if this process dies
        yield


def cached_or_calibrated(
    measure: Measure = measure, announce: Callable[[str], None] = print, again: bool = False
) -> dict:
    """This machine's entry from the cache; calibrated and cached first if there is none (or if
    `again`). Jobs that start together wait on one lock, and the first calibrates while the others
    wait."""
    folder = cache_dir()
    path = folder / CACHE_FILE
    key = machine_key()
    entry = None if again else _read(path).get(_key_id(key))
    if entry is not None:
        return entry
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = _locked(folder)
        lock.__enter__()
    except OSError as err:
        raise CalibrationError(
            f"cannot write the cache folder {folder} ({err.strerror}); set LSEXP_CACHE_DIR "
            f"to a folder you can write"
        ) from None
    try:
        entries = _read(path)
        entry = None if again else entries.get(_key_id(key))
        if entry is None:
            announce(
                "lsexp: timing oneDNN's instruction sets on this machine, once "
                "(device.onednn_max_cpu_isa=auto)"
            )
            entry = {**calibrate(measure), "key": key}
            entries[_key_id(key)] = entry
            try:
                _write(path, entries)
            except OSError as err:
                raise CalibrationError(
                    f"cannot write {path} ({err.strerror}); set LSEXP_CACHE_DIR to a folder you can write"
                ) from None
            timings = ", ".join(
                f"{isa} {s * 1000:.1f} ms/step" for isa, s in entry["seconds_per_step"].items()
            )
            announce(
                f"lsexp: onednn_max_cpu_isa={entry['onednn_max_cpu_isa'] or 'null'} ({timings}; "
                f"{entry['calibration_seconds']:.1f} s), cached in {path}"
            )
            if entry.get("others_cpu_share", 0) > BUSY:
                announce(
                    f"lsexp: other processes used {entry['others_cpu_share']:.0%} of the CPUs meanwhile, "
                    f"which can hide a cap's gain; on a quiet machine, `python -m lsexp.runtime.onednn "
                    f"--again` measures again"
                )
    finally:
        lock.__exit__(None, None, None)
    return entry


_decided: Dict[str, Optional[str]] = {}  # per process: oneDNN reads its cap once anyway


def auto_isa(
    warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr), measure: Measure = measure
) -> Optional[str]:
    """The cap `auto` stands for: ONEDNN_MAX_CPU_ISA where the user set it, else this machine's
    calibrated decision. Anything that keeps a decision from being made or kept gives one warning
    line and None (all the CPU has), the behaviour without a cap."""
    if os.environ.get(ENV):
        return os.environ[ENV].upper()
    if "auto" not in _decided:
        try:
            _decided["auto"] = cached_or_calibrated(measure)["onednn_max_cpu_isa"]
        except CalibrationError as err:
            warn(
                f"lsexp: warning: device.onednn_max_cpu_isa=auto: {err}; running with null (all the CPU has)"
            )
            _decided["auto"] = None
    return _decided["auto"]


def serve(turn_s: float = 0.25, least: int = 2) -> None:
    """Answer each line of input with the fastest step of a turn (at least `least` steps, then until
    turn_s has passed) of a small float32 training step with the layer kinds the built-in
    models use: 2-D convolutions (LeNet5, ResNet), dense layers (all) and attention (Transformer)."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    def answer(value) -> None:
        print(json.dumps(value), flush=True)

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)

    class Probe(nn.Cell):
        def __init__(self):
            super().__init__()
            self.convs = nn.SequentialCell(
                nn.Conv2d(1, 6, 5, pad_mode="valid"),
                nn.ReLU(),
                nn.MaxPool2d(2, 2),
                nn.Conv2d(6, 16, 5, pad_mode="valid"),
                nn.ReLU(),
                nn.MaxPool2d(2, 2),
                nn.Conv2d(16, 16, 3, pad_mode="same"),
                nn.ReLU(),
                nn.Flatten(),
            )
            self.dense = nn.SequentialCell(nn.Dense(16 * 5 * 5, 120), nn.ReLU(), nn.Dense(120, 10))
            self.attention = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)

        def construct(self, image, tokens):
            return self.dense(self.convs(image)).mean() + self.attention(tokens).mean()

    net = Probe()
    optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)

    @ms.jit
    def step(image, tokens):
        loss, grads = grad_fn(image, tokens)
        return ops.depend(loss, optimizer(grads))

    rng = np.random.default_rng(0)
    image = ms.Tensor(rng.standard_normal((32, 1, 32, 32), dtype=np.float32))
    tokens = ms.Tensor(rng.standard_normal((32, 16, 32), dtype=np.float32))
    for _ in range(2):  # compilation, then oneDNN's first-call primitive creation
        step(image, tokens).asnumpy()
    answer("ready")
    for _ in sys.stdin:
        times = []
        started = time.perf_counter()
        while len(times) < least or time.perf_counter() - started < turn_s:
            t = time.perf_counter()
            step(image, tokens).asnumpy()
            times.append(time.perf_counter() - t)
        answer(min(times))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--serve"]:
        serve()
        return 0
    if argv not in ([], ["--again"]):
        print(f"lsexp: unknown arguments {' '.join(argv)}; use --again to calibrate again", file=sys.stderr)
        return 2
    try:
        entry = cached_or_calibrated(again=argv == ["--again"])
    except CalibrationError as err:
        print(f"lsexp: {err}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in entry.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
