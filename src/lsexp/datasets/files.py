"""Checks on a data set's files that run before MindSpore is imported: one line naming dataset.path,
what is wrong, the files expected and where to get them."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional


def problem(path, what: str, expected: str, source: str) -> str:
    return f"dataset.path={path}: {what}; expected {expected} ({source})"


def folder(path: Optional[str], expected: str, source: str) -> tuple[Optional[Path], List[str]]:
    if path is None:
        return None, [problem(path, "no folder given", expected, source)]
    p = Path(path).expanduser()
    if not p.is_dir():
        return None, [problem(path, "no such folder", expected, source)]
    return p, []


CACHES = ("auto", "memory", "stream")
MB = 2 ** 20


def cache_problems(d, record_bytes: Optional[int]) -> List[str]:
    """dataset.cache and dataset.cache_max_mb; record_bytes is what the records would take in memory
    (None while the files themselves are wrong)."""
    p = []
    if d.cache not in CACHES:
        p.append(f"dataset.cache={d.cache}: use one of {', '.join(CACHES)}")
    if d.cache_max_mb < 0:
        p.append(f"dataset.cache_max_mb={d.cache_max_mb}: must be >= 0 (MB); e.g. 1024")
    free = _available_bytes()
    if d.cache == "memory" and record_bytes is not None and free is not None and record_bytes > free:
        # Refused here rather than killed by the kernel part way through reading them.
        p.append(f"dataset.cache=memory: the records take {record_bytes / MB:.0f} MB, more than the "
                 f"{free / MB:.0f} MB this machine has available; use dataset.cache=stream")
    return p


def _available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # not Linux: nothing to check against
