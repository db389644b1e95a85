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
