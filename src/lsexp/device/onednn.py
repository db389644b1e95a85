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

    python -m lsexp.device.onednn          # calibrate now (or show the cached decision) and print it
    python -m lsexp.device.onednn --again  # measure again and replace this machine's decision
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

from lsexp.config.paths import cache_dir
from lsexp.device.onednn_probe import CANDIDATES, ENV, CalibrationError, measure, serve

MARGIN = 1.2  # a cap must be this much faster than all the CPU has
BUSY = 0.25  # a calibration while other processes took this share of the CPUs says so
CACHE_FILE = "onednn-isa.json"

Measure = Callable[[Tuple[Optional[str], ...]], Tuple[Dict[Optional[str], float], Optional[float]]]


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
                    f"which can hide a cap's gain; on a quiet machine, `python -m lsexp.device.onednn "
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
