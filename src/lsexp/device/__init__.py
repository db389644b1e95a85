"""Which device target a run can use, decided before MindSpore is imported, and setting it up.

MindSpore fails late and loudly on a target it cannot serve (deep inside graph compilation), so
the build's plugins and the machine's devices are checked first and reported as config errors.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

from lsexp.config.errors import ConfigError

TARGETS = ("CPU", "GPU", "Ascend")
# The values oneDNN 3.10 (MindSpore 2.10's) reads from ONEDNN_MAX_CPU_ISA; it ignores any other in silence.
ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
               "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL")
_ALIASES = {t.lower(): t for t in TARGETS + ("auto",)}


def _mindspore_lib() -> Optional[Path]:
    spec = importlib.util.find_spec("mindspore")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def _build_supports(target: str) -> bool:
    lib = _mindspore_lib()
    if lib is None:
        return False
    if target == "CPU":
        return True
    plugin = {"GPU": "gpu*", "Ascend": "ascend"}[target]
    return bool(glob.glob(str(lib / "plugin" / plugin)))


def _machine_has(target: str) -> bool:
    if target == "CPU":
        return True
    if target == "GPU":
        return bool(glob.glob("/dev/nvidia[0-9]*"))
    return bool(glob.glob("/dev/davinci[0-9]*")) or bool(os.environ.get("ASCEND_HOME_PATH"))


def _why_not(target: str) -> Optional[str]:
    if not _build_supports(target):
        return f"the installed MindSpore build has no {target} plugin"
    if not _machine_has(target):
        device = {"GPU": "NVIDIA GPU (/dev/nvidia*)", "Ascend": "Ascend NPU (/dev/davinci*)"}[target]
        return f"this machine has no {device}"
    return None


def resolve_target(name: str) -> str:
    """The concrete target for a configured name: `auto` picks an accelerator if one is usable."""
    target = _ALIASES[name.lower()]
    if target != "auto":
        return target
    for accelerator in ("Ascend", "GPU"):
        if _why_not(accelerator) is None:
            return accelerator
    return "CPU"


def problems(cfg) -> List[str]:
    """The device group's keys: device.overflow_mode and device.status_check (lsexp.taps.saturating),
    then the target, its cores and oneDNN's cap."""
    return _overflow_mode_problems(cfg) + device_problems(cfg.device)


def _overflow_mode_problems(cfg) -> List[str]:
    from lsexp.config.schema import OVERFLOW_MODES

    mode = cfg.device.get("overflow_mode", "infnan")
    if mode not in OVERFLOW_MODES:
        return [f"device.overflow_mode={mode}: no such mode; use infnan (inf and NaN, as GPUs and CPUs "
                f"report an overflow) or saturation (Ascend's saturation mode, emulated)"]
    if mode != "saturation":
        return []
    p = []
    if cfg.amp.level == "O0":
        p.append("device.overflow_mode=saturation with amp.level=O0: float32 does not overflow where float16 "
                 "saturates; use amp=O2 (or amp=O1, O3)")
    if cfg.parallel.parallel_mode == "data_parallel":
        p.append("device.overflow_mode=saturation with parallel=data: the emulated status flag is not yet "
                 "reduced over the ranks; use parallel=none")
    if str(cfg.device.device_target) == "Ascend":
        p.append("device.overflow_mode=saturation with device=ascend: the chip has the mode itself; set "
                 "INF_NAN_MODE_ENABLE=0 (910B/C) and keep device.overflow_mode=infnan, or emulate it on CPU")
    return p


def device_problems(dev) -> List[str]:
    name = str(dev.device_target)
    if name.lower() not in _ALIASES:
        return [f"device.device_target={name}: unknown target; use device=cpu, gpu, ascend or auto"]
    if dev.device_id < 0:
        return [f"device.device_id={dev.device_id}: must be >= 0"]
    if dev.threads_num is not None and dev.threads_num < 1:
        return [f"device.threads_num={dev.threads_num}: must be >= 1, or null for MindSpore's default"]
    cpus = dev.get("affinity_cpu_list")
    if cpus is not None:
        allowed = _allowed_cpus()
        if allowed is None:
            return [
                f"device.affinity_cpu_list={list(cpus)}: this system cannot bind threads to cores; use null"
            ]
        if not cpus or not set(cpus) <= set(allowed):
            return [
                f"device.affinity_cpu_list={list(cpus)}: this process may run on cores {allowed}; "
                f"pick among them, or null"
            ]
    isa = dev.get("onednn_max_cpu_isa")
    if isa is not None and str(isa).upper() not in ONEDNN_ISAS + ("AUTO",):
        return [
            f"device.onednn_max_cpu_isa={isa}: not an instruction set oneDNN knows; use auto (measured once "
            f"on this machine), null for all the CPU has, or one of {', '.join(ONEDNN_ISAS)}"
        ]
    target = resolve_target(name)
    why = _why_not(target)
    if why:
        return [f"device.device_target={target}: {why}; use device=cpu, or device=auto to take what is there"]
    return []


_device_set: Optional[tuple] = None  # MindSpore takes the device once, before the first kernel runs
_threads_set: Optional[int] = None  # and its kernel threads once per process
_isa_set: Optional[str] = None  # and oneDNN its ISA cap, at its first kernel


def threads_for(configured: Optional[int], parallel_jobs: int) -> Optional[int]:
    """device.threads_num as given, or, for jobs that share the machine, its cores split among them:
    the CPU step is bound by MindSpore's executor, not by kernel threads, so two 1-thread jobs side
    by side finish sooner than one after the other with every core each."""
    if configured is not None or parallel_jobs <= 1:
        return configured
    cores = len(_allowed_cpus() or []) or os.cpu_count() or 1
    return max(1, cores // parallel_jobs)


def _allowed_cpus() -> Optional[List[int]]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else None


@contextlib.contextmanager
def cpu_share(configured: Optional[List[int]], parallel_jobs: int) -> Iterator[Optional[List[int]]]:
    """The cores this job's threads are bound to: device.affinity_cpu_list as given, or, for jobs of a
    sweep that run side by side on this machine, a share of its cores that no other job holds.

    A job's MindSpore actor and kernel threads hand work to each other at every kernel; unbound,
    two jobs' threads share both cores and wait on each other's time slices (a 4-job LeNet5 sweep on
    2 cores: 1.21x over the basic launcher unbound, 1.52x bound; README, Performance). A share is held
    by an flock, which the kernel lets go when its process dies, so a lost job never keeps one. When
    none is free (two sweeps at once), the job runs unbound."""
    allowed = _allowed_cpus()
    if configured is not None or parallel_jobs <= 1 or allowed is None or len(allowed) < parallel_jobs:
        try:
            yield configured
        finally:
            if configured is not None:  # the next job of this process starts as this one did
                bind_threads(allowed)
        return
    import fcntl

    per_job = len(allowed) // parallel_jobs
    folder = Path(tempfile.gettempdir()) / "lsexp-cpu-shares"
    folder.mkdir(exist_ok=True)
    for k in range(parallel_jobs):
        cpus = allowed[k * per_job : (k + 1) * per_job]
        lock = open(folder / ("cpus-" + "-".join(map(str, cpus))), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        try:
            yield cpus
        finally:
            bind_threads(allowed)
            lock.close()
        return
    yield None


def bind_threads(cpus: List[int]) -> None:
    """Bind every thread of this process to cpus. Called once MindSpore has started its thread pools
    and run a step: binding before that changes the numbers a run computes (`taskset -c 0` changes the
    default run's history from step 66 on), binding after it does not."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def onednn_isa(dev) -> Optional[str]:
    """The cap device.onednn_max_cpu_isa stands for: `auto` is this machine's calibrated decision on
    CPU (lsexp.onednn) and no cap on an accelerator, whose host kernels are not the step's cost."""
    isa = dev.get("onednn_max_cpu_isa")
    if isa is None or str(isa).lower() != "auto":
        return None if isa is None else str(isa).upper()
    if resolve_target(str(dev.device_target)) != "CPU":
        return None
    from lsexp.device.onednn import auto_isa

    return auto_isa()


def onednn_isa_in_force() -> Optional[str]:
    """The cap this process runs oneDNN with, as configure set it (None: all the CPU has)."""
    return None if _isa_set in (None, "null") else _isa_set


def configure(dev, mode: str, threads_num: Optional[int] = None, isa: Optional[str] = None) -> str:
    """Point MindSpore at the target and execution mode, with the job's kernel threads and oneDNN cap
    (lsexp.device.decided); returns the target in use. Callable again (a traced batch runs in PyNative
    before a graph-mode run) with the same device."""
    global _device_set, _threads_set
    import mindspore as ms

    target = resolve_target(str(dev.device_target))
    _cap_onednn_isa(isa)

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    if _device_set != (target, dev.device_id):
        ms.set_device(target, dev.device_id)
        _device_set = (target, dev.device_id)
    threads = threads_num
    if threads is not None and _threads_set is None:
        # MindSpore refuses a second setting; a reused sweep worker keeps its first job's value,
        # which is the same for every job of one sweep.
        ms.device_context.cpu.op_tuning.threads_num(int(threads))
        _threads_set = int(threads)
    return target


def _cap_onednn_isa(isa: Optional[str]) -> None:
    global _isa_set
    asked = isa if isa is not None else "null"
    if _isa_set is None:
        if isa is not None:  # oneDNN reads it when it first dispatches a kernel, which is after this
            os.environ["ONEDNN_MAX_CPU_ISA"] = asked
        _isa_set = asked
    elif asked != _isa_set:
        # A sweep's jobs share their process (basic, joblib), where oneDNN keeps its first cap.
        raise ConfigError(
            [
                f"device.onednn_max_cpu_isa={asked}: this process already runs oneDNN with "
                f"onednn_max_cpu_isa={_isa_set}, which it reads once; run each value as its own "
                f"`python -m lsexp`, not as jobs of one sweep"
            ]
        )
