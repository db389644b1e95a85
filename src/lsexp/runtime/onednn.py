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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

CANDIDATES = (None, "AVX2")  # None: all the CPU has, oneDNN's own choice
MARGIN = 1.2  # a cap must be this much faster than all the CPU has
PROBE_TIMEOUT_S = 60.0
CACHE_FILE = "onednn-isa.json"
ENV = "ONEDNN_MAX_CPU_ISA"

Measure = Callable[[Optional[str]], float]


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


def measure(isa: Optional[str]) -> float:
    """Seconds per step of the probe in a fresh process with oneDNN capped at isa (None: uncapped)."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if isa is not None:
        env[ENV] = isa
    env.setdefault("GLOG_v", "3")  # MindSpore's start-up chatter would fill the captured output
    try:
        out = subprocess.run(
            [sys.executable, "-m", "lsexp.runtime.onednn", "--probe"],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise CalibrationError(
            f"the probe with {isa or 'all the CPU has'} took over {PROBE_TIMEOUT_S:.0f} s"
        ) from None
    lines = out.stdout.strip().splitlines()
    if out.returncode or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise CalibrationError(f"the probe with {isa or 'all the CPU has'} failed ({tail[:200]})")
    return float(json.loads(lines[-1])["seconds_per_step"])


def calibrate(measure: Measure = measure) -> dict:
    """Time every candidate, one after another (never two at once: they would time each other)."""
    started = time.perf_counter()
    seconds = {isa: measure(isa) for isa in CANDIDATES}
    return {
        "onednn_max_cpu_isa": choose(seconds),
        "seconds_per_step": {str(isa or "null"): round(s, 6) for isa, s in seconds.items()},
        "calibration_seconds": round(time.perf_counter() - started, 2),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


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


def cached_or_calibrated(measure: Measure = measure, announce: Callable[[str], None] = print) -> dict:
    """This machine's entry from the cache; calibrated and cached first if there is none. Jobs that
    start together wait on one lock, and the first calibrates while the others wait."""
    folder = cache_dir()
    path = folder / CACHE_FILE
    key = machine_key()
    entry = _read(path).get(_key_id(key))
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
        entry = entries.get(_key_id(key))
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


def probe(steps: int = 30, budget_s: float = 0.5, least: int = 3) -> float:
    """Median seconds per step of a small float32 training step with the layer kinds the built-in
    models use: 2-D convolutions (LeNet5, ResNet), dense layers (all) and attention (Transformer)."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

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
    times = []
    started = time.perf_counter()
    while len(times) < least or (len(times) < steps and time.perf_counter() - started < budget_s):
        t = time.perf_counter()
        step(image, tokens).asnumpy()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--probe"]:
        print(json.dumps({"seconds_per_step": probe()}))
        return 0
    try:
        entry = cached_or_calibrated()
    except CalibrationError as err:
        print(f"lsexp: {err}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in entry.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
