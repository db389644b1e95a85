"""A synthetic sequence task, generated in memory: a built-in workload for the transformer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from lsexp.config.schema import DatasetConfig

RULES = ("copy", "sort", "modular_addition")


@dataclass
class SequenceConfig(DatasetConfig):
    _target_: str = "lsexp.datasets.sequence.sequence"
    # copy: the first token is a position k, the label is the token at k.
    # sort: the first token is a rank k, the label is the k-th smallest of the other tokens.
    # modular_addition: the label is the sum of all tokens mod vocab_size.
    rule: str = "copy"
    task: str = "classify"
    vocab_size: int = 16
    seq_len: int = 8
    num_samples: int = 8192
    val_fraction: float = 0.2
    num_classes: int = "${dataset.vocab_size}"  # type: ignore[assignment]


SCHEMA = SequenceConfig


def train_count(num_samples: int, val_fraction: float) -> int:
    return num_samples - int(round(num_samples * val_fraction))


def num_train(d) -> int:
    return train_count(d.num_samples, d.val_fraction)


def problems(cfg) -> List[str]:
    d, p = cfg.dataset, []
    if d.rule not in RULES:
        p.append(f"dataset.rule={d.rule}: use one of {', '.join(RULES)}")
    if d.seq_len < 2:
        p.append(f"dataset.seq_len={d.seq_len}: needs the query token and at least one more; e.g. 8")
    elif d.rule in ("copy", "sort") and d.vocab_size < d.seq_len:
        p.append(
            f"dataset.vocab_size={d.vocab_size}: must be >= dataset.seq_len={d.seq_len}, since the first "
            f"token names a position"
        )
    if not 0 < d.val_fraction < 1:
        p.append(f"dataset.val_fraction={d.val_fraction}: must be between 0 and 1; e.g. 0.2")
    elif d.num_samples < 1 or num_train(d) < d.batch_size:
        p.append(
            f"dataset.num_samples={d.num_samples}: fewer than one training batch of {d.batch_size}; raise it"
        )
    if d.task != "classify":
        p.append(f"dataset.task={d.task}: the sequence tasks have one label per sequence; use classify")
    return p
