"""The `lsexp` command's first process, when it tracks: it runs the job in a child, waits for the
job and its tracking worker, and exits with the job's status.

Why: the job's interpreter takes ~0.4 s to tear down (garbage-collecting MindSpore's objects),
and the worker ~0.1 s to draw the run's figure, upload the artifacts and close the run. With the
job in a child the two overlap, and the command still returns only once the run is complete in
the store.

Signals: Ctrl-C in the terminal reaches the job directly (it is in the same process group); a
SIGINT or SIGTERM sent to this process is passed on to the job; if this process is killed
outright, the kernel sends the job SIGTERM. Either way the job writes its history and its run
ends KILLED, as when the job is signalled itself.

Imports nothing heavy: it runs before Hydra is imported.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

_WATCHED = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
_SI_KERNEL = 0x80  # si_code of a signal from the terminal, which sends it to the whole process group
_PR_SET_PDEATHSIG = 1


def fork_job() -> Optional[int]:
    """Fork the job. Returns in the job only, with the write end of a pipe on which the tracking
    worker reports its exit code to this process; this process supervises and exits. Returns None
    (no supervisor, the job is this process) where the platform lacks what this needs."""
    if not hasattr(os, "fork") or not hasattr(signal, "sigwaitinfo"):
        return None
    report_r, report_w = os.pipe()
    supervisor = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)  # so none slips by before the wait
    job = os.fork()
    if job == 0:
        os.close(report_r)
        _terminate_with(supervisor)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
        return report_w
    os.close(report_w)
    sys.exit(_supervise(job, report_r))


def _terminate_with(supervisor: int) -> None:
    """SIGTERM for the job when the supervisor dies (Linux), so `kill -9` of the command stops it."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the job then runs to its end
        return
    if os.getppid() != supervisor:  # it died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _supervise(job: int, report_r: int) -> int:
    status: Optional[int] = None
    while status is None:
        info = signal.sigwaitinfo(_WATCHED)
        if info.si_signo == signal.SIGCHLD:
            pid, wait_status = os.waitpid(job, os.WNOHANG)
            if pid:
                status = os.waitstatus_to_exitcode(wait_status)
        elif info.si_code != _SI_KERNEL:  # the terminal's Ctrl-C has reached the job already
            os.kill(job, info.si_signo)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
    try:
        # The worker's exit code once it has closed the run; nothing if it served no run (the
        # job stopped it) or if the job waited for it and reported itself.
        with os.fdopen(report_r) as report:
            worker_code = report.read().strip()
    except KeyboardInterrupt:  # the worker finishes the run on its own
        return 130
    if status < 0:  # killed by a signal, as a shell reports it
        return 128 - status
    return status or (1 if worker_code not in ("", "0") else 0)
