"""A training run: setup, the loop, and the finish that writes history.csv and summary.json (and a
checkpoint) on every exit."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from lsexp import amp, device
from lsexp.config.facts import run_name, step_batch, steps_per_epoch, total_steps
from lsexp.engines.stats import Layout
from lsexp.training import checkpoint
from lsexp.training.build import build, load_data, record_casts
from lsexp.training.evaluate import evaluate
from lsexp.training.history import History


@dataclass
class _Run:
    """What the loop carries from step to step, and what the summary is made from."""

    cfg: Any
    out_dir: Path
    history: History
    data: Any
    net: Any
    step_cell: Any
    last: int
    per_epoch: int
    done: int
    skipped: int
    primary: bool
    cpus: Optional[List[int]]
    shard: tuple
    probe: Any
    probe_steps: set
    summary: dict
    collapse: "_CollapseWatch"
    progress: "_Progress"
    started: float
    batch_cfg: Any = None  # the dataset config at a step's batch: accumulate_steps micro-batches
    layout: Any = None  # lsexp.engines.stats.Layout: how the step's vector reads by name
    clip_at: Optional[float] = None  # optimizer.clip_grad_norm, as float32, as the step compares it
    save_every: Optional[int] = None  # train.save_checkpoint_steps on rank 0 with train.checkpoint
    layers: Any = None  # lsexp.taps.cells.Taps whose statistics the step reports (telemetry=layers)
    layer_table: Any = None  # lsexp.training.telemetry.LayerTable: every step's rows for layers.csv
    precision_table: Any = None  # lsexp.precision.telemetry.PrecisionTable: precision.csv
    locator: Any = None  # lsexp.taps.locate.Locator: replays an overflowed step (telemetry.locate)
    first_nonfinite: Optional[dict] = None
    step: int = 0
    diverged_at: Optional[int] = None
    epoch_seconds: List[float] = field(default_factory=list)
    loop_started: float = 0.0

    @property
    def stopped(self) -> bool:
        return self.diverged_at is not None or self.collapse.step is not None


def train(job, history: History, on_done: Optional[Callable] = None) -> dict:
    """Run the job's training (lsexp.training.job); history fills as it goes. Writes history.csv and
    summary.json in the job's folder on every exit, so an interrupted run keeps what it did. Under data
    parallel only rank 0 evaluates and writes; on_done(step_cell) runs on every rank once training has
    finished."""
    run = _setup(job, history)
    try:
        _loop(run)
        run.summary["status"] = "finished"
        if on_done is not None:
            on_done(run.step_cell)
    except BaseException as exc:
        run.summary["status"] = "killed" if isinstance(exc, KeyboardInterrupt) else "failed"
        raise
    finally:
        _finish(run)
    return run.summary


def _setup(job, history: History) -> _Run:
    started = time.perf_counter()
    cfg, plan, strategy, out_dir, primary = job.cfg, job.plan, job.strategy, job.out_dir, job.primary
    probed = job.probed  # what the probes built, if they built the network: the step trains it
    data = probed.data if probed is not None and probed.data is not None else load_data(cfg)
    net = probed.net if probed is not None else None
    last, per_epoch = total_steps(cfg, data.num_train), steps_per_epoch(cfg, data.num_train)
    casts = record_casts(cfg, data, out_dir) if primary and amp.records(cfg.amp, job.target) else None
    net, step_cell, taps = build(job, last, net=net)
    done, skipped = checkpoint.resume(step_cell, cfg.train.resume, strategy, cfg.engine.name) \
        if cfg.train.resume else (0, 0)
    probe_steps = set(plan.histogram_steps)
    probe = None
    if probe_steps and primary:
        from lsexp.training.telemetry import GradientProbe

        probe = GradientProbe(step_cell, out_dir, draw=cfg.tracking.backend != "mlflow")
    summary = {
        "run_name": run_name(cfg, strategy.name),
        "strategy": strategy.name,
        "amp_level": cfg.amp.level,
        "device_target": job.target,
        "onednn_max_cpu_isa": device.onednn_isa_in_force(),
        "resumed_from_step": done,
        "status": "running",
    }
    if casts is not None:
        summary["casts"] = casts
    return _Run(
        cfg=cfg,
        out_dir=out_dir,
        history=history,
        data=data,
        net=net,
        step_cell=step_cell,
        last=last,
        per_epoch=per_epoch,
        done=done,
        skipped=skipped,
        primary=primary,
        cpus=job.decided.affinity_cpu_list,
        shard=job.decided.shard,
        probe=probe,
        probe_steps=probe_steps,
        summary=summary,
        collapse=_CollapseWatch(strategy.floor, cfg.train.collapse_patience),
        progress=_Progress(cfg, run_name(cfg, strategy.name), done, last, enabled=primary),
        started=started,
        step=done,
        save_every=cfg.train.save_checkpoint_steps if cfg.train.checkpoint and primary else None,
        batch_cfg=_step_batches(cfg),
        layout=Layout(step_cell.columns),
        clip_at=None if (clip := cfg.optimizer.clip_grad_norm) is None else float(np.float32(clip)),
        **_taps(job, taps, step_cell),
    )


def _taps(job, taps, step_cell) -> dict:
    """The run's side of lsexp.taps: the layer table of telemetry=layers, the locator of telemetry.locate
    (on rank 0, which replays its own shard)."""
    from lsexp.training.build import tapped_copy

    plan = job.plan
    out: Dict[str, Any] = {}
    if plan.precision is not None:
        from lsexp.precision.telemetry import PrecisionTable

        out["precision_table"] = PrecisionTable()
    if taps is not None and plan.records_layers:
        from lsexp.training.telemetry import LayerTable

        out.update(layers=taps, layer_table=LayerTable(taps.names, stats=plan.observe_layers,
                                                              records=plan.per_layer))
    if plan.locate and job.primary:
        from lsexp.taps.locate import Locator

        kept = list(zip(step_cell.weights, step_cell.shadow)) if step_cell.keep else []
        # under saturation the step's taps hide every inf, and per_layer's measure nothing without
        # telemetry.layers: the replay runs on a copy that keeps and measures them
        mine = None if plan.saturation or (plan.per_layer and not plan.observe_layers) else taps
        rule = job.strategy.layer_rule() if plan.per_layer else None
        copy = partial(tapped_copy, job.cfg, plan, job.out_dir, rule)  # built only when a replay needs it
        out["locator"] = Locator(step_cell.network, mine, kept, copy)
    return out


def _step_batches(cfg):
    """cfg.dataset, or with accumulation a copy whose batch is the step's k micro-batches, which the
    step splits in order: the epoch's order depends on the seed and epoch alone, so k micro-batches of b
    are the samples one batch of k*b takes."""
    if cfg.train.accumulate_steps == 1:
        return cfg.dataset
    d = cfg.dataset.copy()
    d.batch_size = step_batch(cfg)
    return d


def _loop(run: _Run) -> None:
    cfg, history = run.cfg, run.history
    run.loop_started = time.perf_counter()
    first = run.done // run.per_epoch
    for epoch in range(first, cfg.train.epochs):
        epoch_started = time.perf_counter()
        start = run.done % run.per_epoch if epoch == first else 0
        for x, y in run.data.batches(run.batch_cfg, epoch, start, run.shard):
            if run.step >= run.last or _step(run, epoch, x, y):
                break
        run.epoch_seconds.append(round(time.perf_counter() - epoch_started, 3))  # training only, not eval
        if run.primary and run.data.has_eval and not run.stopped and run.step > run.done:
            history.epoch_eval.append({"epoch": epoch + 1, "step": run.step, **evaluate(run.net, run.data)})
        if history.on_epoch is not None:
            history.on_epoch(history)
        if run.stopped or run.step >= run.last:
            break


def _step(run: _Run, epoch: int, x, y) -> bool:
    """One train step and its row; True when the run must stop (diverged or collapsed)."""
    run.step += 1
    step = run.step
    got, layers = run.layout.read(run.step_cell(x, y).asnumpy().tolist())  # the step's one host sync
    if step == run.done + 1 and run.cpus:
        device.bind_threads(list(run.cpus))
    loss, overflow, scale, skip = got["loss"], got["overflow"], got["loss_scale"], got["skipped"]
    if run.probe is not None and step in run.probe_steps:  # the gradients this step kept
        run.probe.capture(step, scale)
    run.skipped += int(skip)
    row = {"step": step, "epoch": epoch + 1, "loss": loss, "loss_scale": scale, "overflow": int(overflow),
           "skipped_steps": run.skipped}
    row.update((name, got[name]) for name in run.layout.history if name not in row)
    if run.clip_at is not None:  # the norm above clip_norm on a step that updated: it clipped
        row["clipped"] = int(not skip and row["global_norm"] > run.clip_at)
    if overflow:  # no headroom and no amax on a step whose gradients overflowed
        for column in run.layout.unmeasured:
            row[column] = math.nan
    if run.layer_table is not None:  # the taps' statistics follow the rest
        row.update(run.layer_table.add(step, scale, overflow, layers))
    if run.precision_table is not None:  # counted by the casts' own kernels, read before a replay's
        row.update(run.precision_table.add(step, overflow))
    if run.locator is not None:
        row.update(_locate(run, step, x, y, scale) if overflow else _CLEAN)
    run.history.rows.append(row)
    run.progress.update(loss, scale)
    if run.save_every and step % run.save_every == 0:  # read once in _setup: config lookups cost per step
        checkpoint.save(run.step_cell, run.out_dir / checkpoint.CHECKPOINT, step, run.skipped)
    if not math.isfinite(loss) or not got["params_finite"]:
        run.diverged_at = step
        return True
    return run.collapse.at(step, scale, overflow)


_CLEAN = {"first_nonfinite_layer": "", "first_nonfinite_pass": ""}


def _locate(run: _Run, step: int, x, y, scale: float) -> dict:
    """The overflowed step replayed through the taps, micro-batch by micro-batch: where its first inf or
    NaN arose, as history columns; the run's first is kept for the summary."""
    found = None
    b = run.cfg.dataset.batch_size
    for i in range(run.cfg.train.accumulate_steps):
        found = run.locator.locate(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b], scale)
        if found is not None:
            break
    if run.first_nonfinite is None:
        run.first_nonfinite = {"step": step, **(found or {"layer": None, "pass": "unlocated"})}
        if run.cfg.parallel.parallel_mode != "stand_alone":
            run.first_nonfinite["rank"] = 0
    if found is None:
        return {"first_nonfinite_layer": "", "first_nonfinite_pass": "unlocated"}
    return {"first_nonfinite_layer": found["layer"], "first_nonfinite_pass": found["pass"]}


def _finish(run: _Run) -> None:
    """The summary, history.csv, summary.json and the last checkpoint, however the loop ended."""
    cfg, summary = run.cfg, run.summary
    run.progress.close()
    loop_seconds = time.perf_counter() - run.loop_started if run.loop_started else 0.0
    if cfg.train.checkpoint and run.step > run.done and run.primary:
        checkpoint.save(run.step_cell, run.out_dir / checkpoint.CHECKPOINT, run.step, run.skipped)
    summary.update(_summarise(run.history, cfg, run.step, run.diverged_at, run.step_cell.scale_now()))
    summary.update(run.collapse.summary())
    summary["epoch_seconds"] = run.epoch_seconds
    if run.data.reference_loss is not None:
        summary["reference_loss"] = run.data.reference_loss
    if run.data.cache is not None:  # dataset.cache's choice: memory or stream
        summary["dataset_cache"] = run.data.cache
    if run.locator is not None:
        summary["first_nonfinite"] = run.first_nonfinite
    if run.layer_table is not None:
        summary["layers"] = run.layer_table.means()
    if run.precision_table is not None:
        summary["precision"] = run.precision_table.means()
    summary["wall_seconds"] = round(time.perf_counter() - run.started, 3)
    summary["steps_per_second"] = round((run.step - run.done) / loop_seconds, 3) if loop_seconds > 0 else None
    if run.primary:
        if run.layer_table is not None:
            run.layer_table.write(run.out_dir)
        if run.precision_table is not None:
            run.precision_table.write(run.out_dir)
        run.history.write_csv(run.out_dir / "history.csv")
        (run.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _release_graphs()


def _release_graphs() -> None:
    # The jobs of a basic or joblib sweep, and Ray's reused workers, train one network after
    # another in one process; MindSpore keeps every compiled graph and its memory until told.
    import gc

    import mindspore as ms
    from mindspore import nn

    # ms_memory_recycle walks MindSpore's cache of compiled cells, and a Cell's __del__ takes its entry
    # out of that cache. A Cell finalised during the walk (by the collector, or by a runtime thread
    # dropping its last reference while the walk's native calls let it run) fails the walk with
    # "dictionary changed size during iteration": every Cell is held for the walk, the collector off.
    alive = [o for o in gc.get_objects() if issubclass(type(o), nn.Cell)]  # type(): a weak proxy is no Cell
    enabled = gc.isenabled()
    gc.disable()
    try:
        ms.ms_memory_recycle()
    finally:
        if enabled:
            gc.enable()
        del alive


class _CollapseWatch:
    """A dynamic scale that has backed off to its floor and still overflows step after step: no scale
    can help any more, so the run stops (DeepSpeed's "Current loss scale already at minimum")."""

    def __init__(self, floor: Optional[float], patience: Optional[int]):
        self.floor, self.patience = floor, patience
        self.streak = 0
        self.step: Optional[int] = None

    def at(self, step: int, scale: float, overflow: float) -> bool:
        if self.floor is None or not self.patience:
            return False
        self.streak = self.streak + 1 if overflow and scale <= self.floor else 0
        if self.streak >= self.patience:
            self.step = step
        return self.step is not None

    def summary(self) -> dict:
        out = {"collapsed": self.step is not None, "collapsed_at_step": self.step}
        if self.step is not None:
            out.update(collapse_floor=self.floor, collapse_patience=self.patience)
        return out


def _summarise(history: History, cfg, step: int, diverged_at: Optional[int], scale_now) -> dict:
    rows = history.rows
    epoch_losses: Dict[int, List[float]] = {}
    for row in rows:
        epoch_losses.setdefault(row["epoch"], []).append(row["loss"])
    out = {
        "steps": step,
        "skipped_steps": rows[-1]["skipped_steps"] if rows else 0,
        "overflow_steps": [row["step"] for row in rows if row["overflow"]],
        "final_loss": rows[-1]["loss"] if rows else None,
        "final_loss_scale": scale_now,
        "epoch_loss": {str(e): float(np.mean(v)) for e, v in epoch_losses.items()},
        "diverged": diverged_at is not None,
        "diverged_at_step": diverged_at,
    }
    if rows and "clipped" in rows[0]:
        out["clipped_steps"] = sum(row["clipped"] for row in rows)
    if history.epoch_eval:
        out["eval_accuracy"] = history.epoch_eval[-1]["eval_accuracy"]
        out["eval_loss"] = history.epoch_eval[-1]["eval_loss"]
        out["epoch_eval"] = history.epoch_eval  # per epoch, for a job that tracks what its ranks trained
    if cfg.train.checkpoint:
        out["checkpoint"] = checkpoint.CHECKPOINT
    return out


class _Progress:
    """A tqdm bar showing loss and scale; a no-op when train.progress=false."""

    def __init__(self, cfg, name: str, done: int, last: int, enabled: bool = True):
        self.bar = None
        if cfg.train.progress and enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=last, initial=done, desc=name, unit="step", leave=False, dynamic_ncols=True)

    def update(self, loss: float, scale: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", scale=f"{scale:g}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
