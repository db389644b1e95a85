"""Which device target a run can use, decided before MindSpore is imported, and setting it up.

MindSpore fails late and loudly on a target it cannot serve (deep inside graph compilation), so
the build's plugins and the machine's devices are checked first and reported as config errors.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path
from typing import List, Optional

TARGETS = ("CPU", "GPU", "Ascend")
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


def device_problems(dev) -> List[str]:
    name = str(dev.device_target)
    if name.lower() not in _ALIASES:
        return [f"device.device_target={name}: unknown target; use device=cpu, gpu, ascend or auto"]
    if dev.device_id < 0:
        return [f"device.device_id={dev.device_id}: must be >= 0"]
    if dev.threads_num is not None and dev.threads_num < 1:
        return [f"device.threads_num={dev.threads_num}: must be >= 1, or null for MindSpore's default"]
    target = resolve_target(name)
    why = _why_not(target)
    if why:
        return [f"device.device_target={target}: {why}; use device=cpu, or device=auto to take what is there"]
    return []


_device_set: Optional[tuple] = None  # MindSpore takes the device once, before the first kernel runs
_threads_set: Optional[int] = None  # and its kernel threads once per process


def threads_for(configured: Optional[int], parallel_jobs: int) -> Optional[int]:
    """device.threads_num as given, or, for jobs that share the machine, its cores split among them:
    the CPU step is bound by MindSpore's executor, not by kernel threads, so two 1-thread jobs side
    by side finish sooner than one after the other with every core each."""
    if configured is not None or parallel_jobs <= 1:
        return configured
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // parallel_jobs)


def configure(dev, mode: str) -> str:
    """Point MindSpore at the target and execution mode; returns the target in use. Callable again
    (a traced batch runs in PyNative before a graph-mode run) with the same device."""
    global _device_set, _threads_set
    import mindspore as ms

    target = resolve_target(str(dev.device_target))
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    if _device_set != (target, dev.device_id):
        ms.set_device(target, dev.device_id)
        _device_set = (target, dev.device_id)
    threads = dev.get("threads_num")
    if threads is not None and _threads_set is None:
        # MindSpore refuses a second setting; a reused sweep worker keeps its first job's value,
        # which is the same for every job of one sweep.
        ms.device_context.cpu.op_tuning.threads_num(int(threads))
        _threads_set = int(threads)
    return target
