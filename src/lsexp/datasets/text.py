"""A character language model's data: non-overlapping windows of seq_len characters, each target the
next character; the file's last val_fraction is held out. Its unigram entropy is the loss to beat."""

import numpy as np

from lsexp.datasets.kinds import LM
from lsexp.datasets.text_schema import read, split
from lsexp.datasets.tokens import token_pipeline


def windows(ids: np.ndarray, seq_len: int):
    """Non-overlapping windows of seq_len ids, and the next id of each position as its target."""
    n = (len(ids) - 1) // seq_len
    x = ids[:n * seq_len].reshape(n, seq_len)
    y = ids[1:n * seq_len + 1].reshape(n, seq_len)
    return x, y


def language_model(ids: np.ndarray, vocab_size: int, seq_len: int, val_fraction: float):
    """A corpus of token ids as a language model's data: windows of the first part to train on, of the
    last val_fraction held out, and the unigram entropy as the loss to beat."""
    counts = np.bincount(ids)
    counts = counts[counts > 0] / len(ids)
    entropy = float(-(counts * np.log(counts)).sum())  # nats per token, as the loss is
    cut = split(len(ids), val_fraction)
    x, y = windows(ids[:cut], seq_len)
    x_val, y_val = windows(ids[cut:], seq_len)
    return token_pipeline(np.concatenate([x, x_val]), np.concatenate([y, y_val]), len(x), vocab_size, LM,
                          reference_loss=entropy)


def text(path, seq_len=64, val_fraction=0.1, vocab_size=None, **_):
    chars = read(str(path))
    vocab, ids = np.unique(chars, return_inverse=True)
    return language_model(ids.astype(np.int32), len(vocab), seq_len, val_fraction)
