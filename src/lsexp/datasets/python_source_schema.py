"""The running interpreter's own standard library, as a byte-level language-model corpus: a text every
machine with Python has."""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List

import numpy as np

from lsexp.config.schema import DatasetConfig
from lsexp.datasets.text_schema import split

VOCAB = 256  # bytes


@dataclass
class PythonSourceConfig(DatasetConfig):
    _target_: str = "lsexp.datasets.python_source.python_source"
    task: str = "lm"
    # the first max_bytes of the standard library's top-level .py files, in the order of their names
    max_bytes: int = 2_000_000
    seq_len: int = 128  # bytes per training sequence; the target is the next byte
    val_fraction: float = 0.1  # the corpus's last part, held out for eval_loss
    vocab_size: int = VOCAB
    num_classes: int = VOCAB


SCHEMA = PythonSourceConfig


@lru_cache(maxsize=2)
def read(max_bytes: int) -> np.ndarray:
    """The corpus as bytes: the interpreter's version decides which files, so the version is part of it."""
    out, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = path.read_bytes()
        out.append(data[:max_bytes - size])
        size += len(out[-1])
        if size >= max_bytes:
            break
    return np.frombuffer(b"".join(out), dtype=np.uint8)


def num_train(d) -> int:
    return (split(len(read(d.max_bytes)), d.val_fraction) - 1) // d.seq_len


def problems(cfg) -> List[str]:
    d, p = cfg.dataset, []
    if d.max_bytes < 1:
        return [f"dataset.max_bytes={d.max_bytes}: must be >= 1; e.g. 2000000"]
    if not 0 < d.val_fraction < 1:
        p.append(f"dataset.val_fraction={d.val_fraction}: must be between 0 and 1; e.g. 0.1")
    elif d.seq_len < 1:
        p.append(f"dataset.seq_len={d.seq_len}: must be >= 1; e.g. 128")
    else:
        n = len(read(d.max_bytes))
        if min(num_train(d), (n - split(n, d.val_fraction) - 1) // d.seq_len) < 1:
            p.append(f"dataset.max_bytes={d.max_bytes}: {n} bytes are too few for one training and one "
                     f"held-out sequence of dataset.seq_len={d.seq_len}; raise it or lower seq_len")
    if d.vocab_size != VOCAB or d.num_classes != VOCAB:
        p.append(f"dataset.vocab_size={d.vocab_size}: the corpus is bytes; leave vocab_size and num_classes "
                 f"at {VOCAB}")
    return p
