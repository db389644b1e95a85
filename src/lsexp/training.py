"""A training run: a validated config in, history.csv, summary.json (and a checkpoint) out."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from lsexp import device
from lsexp.config import ConfigError, run_name, scale_floor, step_problems, strategy, total_steps, steps_per_epoch

EVAL_BATCH = 256  # samples per eval forward: few compiled shapes, and activations that stay small

HISTORY_COLUMNS = ("step", "epoch", "loss", "loss_scale", "overflow", "skipped_steps")
INTEGER_COLUMNS = ("step", "epoch", "overflow", "skipped_steps")  # the rest, telemetry's included, are floats
CHECKPOINT = "checkpoint.ckpt"


@dataclass
class History:
    """Every step of a run, kept on the host; written out even when the run is interrupted."""

    rows: List[Dict[str, float]] = field(default_factory=list)
    epoch_eval: List[Dict[str, float]] = field(default_factory=list)  # {"epoch", "step", "eval_accuracy", "eval_loss"}
    on_epoch: Optional[Callable[["History"], None]] = None  # e.g. stream to the tracker between epochs

    def write_csv(self, path: Path) -> None:
        columns = list(HISTORY_COLUMNS) + [k for k in (self.rows[0] if self.rows else {}) if k not in HISTORY_COLUMNS]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)


def read_history(path: Path) -> List[Dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: int(v) if k in INTEGER_COLUMNS else float(v) for k, v in row.items()}
                for row in csv.DictReader(f)]


def _build(cfg, target: str, out_dir: Path, last_step: int, rank: int = 0):
    import mindspore as ms
    from hydra.utils import get_method, instantiate
    from mindspore import nn

    from lsexp.loss import SoftmaxCrossEntropy
    from lsexp.loss_scaling import build_optimizer

    ms.set_seed(cfg.train.seed)
    net = instantiate(cfg.model, _convert_="all")
    dtype = ms.float16 if cfg.amp.dtype == "float16" else ms.bfloat16
    # O1 rewrites the network into Python source under ./rewritten_network, which graph mode
    # reads back when it compiles: keep it in the run's directory, not wherever lsexp was started.
    with contextlib.chdir(out_dir):
        net = ms.amp.auto_mixed_precision(net, cfg.amp.level, dtype=dtype)
    loss_net = nn.WithLossCell(net, SoftmaxCrossEntropy())
    optimizer = build_optimizer(cfg, net.trainable_params())
    # The engine group names its builder: lsexp.loss_scaling's cells or lsexp.functional_step's loop.
    build_train_step = get_method(cfg.engine._target_)
    step_cell = build_train_step(cfg, loss_net, optimizer, last_step, native_check=target != "CPU", rank=rank)
    step_cell.set_train()
    return net, step_cell


def _resume(step_cell, path: str) -> tuple[int, int]:
    """Load a checkpoint into the train step; returns (steps done, updates skipped so far)."""
    import mindspore as ms

    params = ms.load_checkpoint(path)
    missing, _ = ms.load_param_into_net(step_cell, params)
    missing = [name for name in missing if name != "lsexp_scale_used"]  # scratch, rewritten every step
    if missing:
        raise ConfigError([
            f"train.resume={path}: the checkpoint lacks {', '.join(missing[:3])}; it was saved by a different "
            f"model, loss_scale or engine, so resume with the config it was saved with"
        ])
    return int(step_cell.lsexp_step.asnumpy()), int(params["lsexp_skipped_steps"].asnumpy())


def _save(step_cell, path: Path, step: int, skipped: int) -> None:
    import mindspore as ms

    step_cell.lsexp_step.set_data(ms.Tensor(step, ms.int32))
    ms.save_checkpoint(step_cell, str(path), append_dict={"lsexp_skipped_steps": skipped})


def load_data(cfg):
    """The dataset group as one of lsexp.data's kinds, whatever its `_target_` returned."""
    from hydra.utils import call

    from lsexp.data import as_data

    return as_data(call(cfg.dataset, _convert_="all"), cfg.dataset)


def trace_shapes(cfg) -> None:
    """Build the data and the network and run two samples forward, eagerly (PyNative), so that a
    network that cannot take the data fails with one line before anything is written."""
    from hydra.utils import instantiate

    from lsexp.loss import SoftmaxCrossEntropy

    device.configure(cfg.device, "pynative")  # the run sets its own mode when it starts
    try:
        data = load_data(cfg)
        x, y = next(iter(data.batches(cfg.dataset, 0, 0)))
        net = instantiate(cfg.model, _convert_="all")
        SoftmaxCrossEntropy()(net(x[:2]), y[:2])
    except Exception as err:  # MindSpore's shape and type errors, a user's own exceptions
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ConfigError([f"model._target_={cfg.model._target_} with dataset._target_={cfg.dataset._target_}: "
                           f"{first}; make the model take the data set's batches"]) from None
    # Only now is a user's data set's size known: the checks validate() could not make for it.
    problems = step_problems(cfg, data.num_train)
    if problems:
        raise ConfigError(problems)


def evaluate(net, data) -> Dict[str, float]:
    """Accuracy and mean cross-entropy on the held-out split (per position for a language model)."""
    net.set_train(False)
    correct = total = 0
    nll = 0.0
    for x, labels in data.eval_batches(EVAL_BATCH):
        logits = net(x).asnumpy().astype(np.float64)
        logits = logits.reshape(-1, logits.shape[-1])
        labels = labels.reshape(-1)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        nll += float((log_z - logits[np.arange(len(labels)), labels]).sum())
        correct += int((logits.argmax(axis=1) == labels).sum())
        total += len(labels)
    net.set_train(True)
    return {"eval_accuracy": correct / total, "eval_loss": nll / total}


def train(cfg, out_dir: Path, history: History, target: str, rank: int = 0,
          on_done: Optional[Callable] = None) -> dict:
    """Run the configured training; history fills as it goes. Writes history.csv and summary.json
    in out_dir on every exit, so an interrupted run keeps what it did. Under data parallel only rank
    0 evaluates and writes; on_done(step_cell) runs on every rank once training has finished."""
    primary = rank == 0
    from lsexp.loss_scaling import TELEMETRY, loss_scale_now

    started = time.perf_counter()
    data = load_data(cfg)
    last, per_epoch = total_steps(cfg, data.num_train), steps_per_epoch(cfg, data.num_train)
    net, step_cell = _build(cfg, target, out_dir, last, rank)
    done, skipped = _resume(step_cell, cfg.train.resume) if cfg.train.resume else (0, 0)
    probe_steps = set(cfg.telemetry.histogram_steps)
    probe = None
    if probe_steps and primary:
        from lsexp.telemetry import GradientProbe

        probe = GradientProbe(step_cell.network, step_cell.weights, out_dir)
    every = cfg.train.save_checkpoint_steps

    summary: dict = {"run_name": run_name(cfg), "strategy": strategy(cfg), "amp_level": cfg.amp.level,
                     "device_target": target, "onednn_max_cpu_isa": device.onednn_isa_in_force(),
                     "resumed_from_step": done, "status": "running"}
    diverged_at: Optional[int] = None
    collapse = _CollapseWatch(scale_floor(cfg), cfg.train.collapse_patience)
    progress = _Progress(cfg, done, last, enabled=primary)
    epoch_seconds: List[float] = []
    loop_started = time.perf_counter()
    step = done
    try:
        for epoch in range(done // per_epoch, cfg.train.epochs):
            start = done % per_epoch if epoch == done // per_epoch else 0
            epoch_started = time.perf_counter()
            for x, y in data.batches(cfg.dataset, epoch, start):
                if step >= last:
                    break
                step += 1
                if probe is not None and step in probe_steps:
                    probe.capture(step, x, y, loss_scale_now(step_cell))
                values = step_cell(x, y).asnumpy().tolist()
                if step == done + 1 and cfg.device.get("affinity_cpu_list"):
                    device.bind_threads(list(cfg.device.affinity_cpu_list))
                loss, overflow, scale, skip, params_finite = values[:5]
                skipped += int(skip)
                row = {"step": step, "epoch": epoch + 1, "loss": loss, "loss_scale": scale,
                       "overflow": int(overflow), "skipped_steps": skipped}
                if len(values) > 5:
                    row.update(zip(TELEMETRY, values[5:]))
                history.rows.append(row)
                progress.update(loss, scale)
                if every and step % every == 0 and cfg.train.checkpoint and primary:
                    _save(step_cell, out_dir / CHECKPOINT, step, skipped)
                if not math.isfinite(loss) or not params_finite:
                    diverged_at = step
                    break
                if collapse.at(step, scale, overflow):
                    break
            epoch_seconds.append(round(time.perf_counter() - epoch_started, 3))  # training only, not eval
            if primary and data.has_eval and (diverged_at is None and collapse.step is None and step > done):
                history.epoch_eval.append({"epoch": epoch + 1, "step": step, **evaluate(net, data)})
            if history.on_epoch is not None:
                history.on_epoch(history)
            if diverged_at is not None or collapse.step is not None or step >= last:
                break
        summary["status"] = "finished"
        if on_done is not None:
            on_done(step_cell)
    except BaseException as exc:
        summary["status"] = "killed" if isinstance(exc, KeyboardInterrupt) else "failed"
        raise
    finally:
        progress.close()
        loop_seconds = time.perf_counter() - loop_started
        if cfg.train.checkpoint and step > done and primary:
            _save(step_cell, out_dir / CHECKPOINT, step, skipped)
        summary.update(_summarise(history, cfg, step, diverged_at, loss_scale_now(step_cell)))
        summary.update(collapse.summary())
        summary["epoch_seconds"] = epoch_seconds
        if data.reference_loss is not None:
            summary["reference_loss"] = data.reference_loss
        if data.cache is not None:  # dataset.cache's choice: memory or stream
            summary["dataset_cache"] = data.cache
        summary["wall_seconds"] = round(time.perf_counter() - started, 3)
        summary["steps_per_second"] = round((step - done) / loop_seconds, 3) if loop_seconds > 0 else None
        if primary:
            history.write_csv(out_dir / "history.csv")
            (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        _release_graphs()
    return summary


def _release_graphs() -> None:
    # The jobs of a basic or joblib sweep, and Ray's reused workers, train one network after
    # another in one process; MindSpore keeps every compiled graph and its memory until told.
    import mindspore as ms

    ms.ms_memory_recycle()


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
    if history.epoch_eval:
        out["eval_accuracy"] = history.epoch_eval[-1]["eval_accuracy"]
        out["eval_loss"] = history.epoch_eval[-1]["eval_loss"]
        out["epoch_eval"] = history.epoch_eval  # per epoch, for a job that tracks what its ranks trained
    if cfg.train.checkpoint:
        out["checkpoint"] = CHECKPOINT
    return out


class _Progress:
    """A tqdm bar showing loss and scale; a no-op when train.progress=false."""

    def __init__(self, cfg, done: int, last: int, enabled: bool = True):
        self.bar = None
        if cfg.train.progress and enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=last, initial=done, desc=run_name(cfg), unit="step", leave=False,
                            dynamic_ncols=True)

    def update(self, loss: float, scale: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", scale=f"{scale:g}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
