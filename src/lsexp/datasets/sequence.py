"""Generates the sequence task's samples (see sequence_schema for the rules) from the seed."""

import numpy as np

from lsexp.datasets.kinds import CLASSIFY
from lsexp.datasets.sequence_schema import train_count
from lsexp.datasets.tokens import token_pipeline


def sequence(rule="copy", vocab_size=16, seq_len=8, num_samples=8192, val_fraction=0.2, seed=1, **_):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab_size, size=(num_samples, seq_len)).astype(np.int32)
    rows = np.arange(num_samples)
    if rule == "modular_addition":
        y = x.sum(axis=1) % vocab_size
    else:
        k = rng.integers(1, seq_len, size=num_samples)
        x[:, 0] = k
        y = x[rows, k] if rule == "copy" else np.sort(x[:, 1:], axis=1)[rows, k - 1]
    return token_pipeline(x, y.astype(np.int32), train_count(num_samples, val_fraction), vocab_size, CLASSIFY)
