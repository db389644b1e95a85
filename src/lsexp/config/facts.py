"""What follows from a composed config alone: the world size, the step counts and the run's names."""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from lsexp.config import families


def world_size(cfg: DictConfig) -> int:
    return int(cfg.parallel.workers) if cfg.parallel.parallel_mode == "data_parallel" else 1


def step_batch(cfg: DictConfig) -> int:
    """One rank's samples at an optimizer step: train.accumulate_steps micro-batches of dataset.batch_size."""
    return cfg.dataset.batch_size * cfg.train.accumulate_steps


def batch_tokens(cfg: DictConfig) -> int:
    """The tokens whose losses an optimizer step's gradient averages, across the world's ranks: a language
    model's positions (dataset.task=lm), else one per sample."""
    per_sample = cfg.dataset.seq_len if cfg.dataset.get("task") == "lm" else 1
    return step_batch(cfg) * world_size(cfg) * per_sample


def shrinking_tokens(cfg: DictConfig) -> Optional[int]:
    """train.mean_over_tokens as it acts on the gradients: None under model.scaling=unit, whose
    cross-entropy (unit_scaling/functional.py, cross_entropy) takes the mean over the batch going forward
    only, so that a unit-scaled model's gradients are the same whatever the batch's size."""
    if cfg.model.get("scaling") == "unit":
        return None
    return cfg.train.get("mean_over_tokens")


def gradient_divisor(cfg: DictConfig) -> float:
    """train.mean_over_tokens / batch_tokens: how much smaller the gradients are than the batch's mean
    makes them (1 without the key, and under unit scaling: shrinking_tokens)."""
    tokens = shrinking_tokens(cfg)
    return 1.0 if tokens is None else float(tokens) / batch_tokens(cfg)


def steps_per_epoch(cfg: DictConfig, num_train: int) -> int:
    """Each of the world's ranks takes its own step batch (step_batch) at every optimizer step."""
    b = step_batch(cfg) * world_size(cfg)
    return num_train // b if cfg.dataset.drop_remainder else -(-num_train // b)


def total_steps(cfg: DictConfig, num_train: int) -> int:
    steps = cfg.train.epochs * steps_per_epoch(cfg, num_train)
    return min(steps, cfg.train.max_steps) if cfg.train.max_steps is not None else steps


def known_num_train(cfg: DictConfig) -> Optional[int]:
    """The training-set size, from the config and the files' headers; None for a user's own data set."""
    family = families.of("dataset", cfg.dataset._target_)
    return family.num_train(cfg.dataset) if family is not None else None


def model_name(cfg: DictConfig) -> str:
    return cfg.model._target_.rsplit(".", 1)[-1].lower()


def dataset_name(cfg: DictConfig) -> str:
    return cfg.dataset._target_.rsplit(".", 1)[-1]


def run_name(cfg: DictConfig, strategy: str) -> str:
    """model-dataset-level-strategy, and the engine unless it is the default cell engine."""
    engine = "" if cfg.engine.name == "cell" else f"-{cfg.engine.name}"
    return f"{model_name(cfg)}-{dataset_name(cfg)}-{cfg.amp.level}-{strategy}{engine}"
