"""The lsexp processes a test started, read from /proc."""

import os
from pathlib import Path


def lsexp_processes_in(cwd: Path, workers_only: bool = False):
    """lsexp processes started from cwd (they inherit the command's directory): the command, its
    job, tracking workers. A forked worker has the command's command line; any worker leads a
    session of its own."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if any(part.startswith(b"lsexp") for part in cmdline) and Path(os.readlink(proc / "cwd")) == cwd:
                session = int(proc_stat(proc)[3])
                if not workers_only or session == int(proc.name):
                    found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def proc_stat(proc: Path):
    """The fields of a /proc/<pid> (or /proc/<pid>/task/<tid>) stat file after the command name:
    state, ppid, pgrp, session, ..."""
    return (proc / "stat").read_text().rpartition(")")[2].split()


def parent_pid(pid: int) -> int:
    return int(proc_stat(Path(f"/proc/{pid}"))[1])
