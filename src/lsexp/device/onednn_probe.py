"""The measuring side of `device.onednn_max_cpu_isa=auto` (lsexp.device.onednn, which decides and
caches): a probe process per candidate cap, each timing a small training step on request, and the
turns they take.

Nothing here imports MindSpore but the probe itself, in its own process.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, Optional, Tuple

CANDIDATES = (None, "AVX2")  # None: all the CPU has, oneDNN's own choice
PROBE_TIMEOUT_S = 60.0  # the whole measurement, start-up and compilation included
ROUNDS = (4, 12)  # turns per candidate: at least, at most
ROUNDS_BUDGET_S = 4.0  # after the least, no new round past this
ENV = "ONEDNN_MAX_CPU_ISA"


class CalibrationError(Exception):
    """Why no decision could be made or kept; the run goes on with all the CPU has."""


def _serve(isa: Optional[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if isa is not None:
        env[ENV] = isa
    env.setdefault("GLOG_v", "3")  # MindSpore's start-up chatter would fill the pipe
    # the probe is onednn's command with --serve, whose main runs serve() below: a process list shows
    # a calibration's probes as lsexp.device.onednn's
    return subprocess.Popen(
        [sys.executable, "-m", "lsexp.device.onednn", "--serve"],
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
