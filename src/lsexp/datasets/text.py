"""A character language model's data: non-overlapping windows of seq_len characters, each target the
next character; the file's last val_fraction is held out. Its unigram entropy is the loss to beat."""

import numpy as np

from lsexp.datasets.kinds import LM
from lsexp.datasets.text_schema import read, split
from lsexp.datasets.tokens import token_pipeline


def _windows(ids: np.ndarray, seq_len: int):
    n = (len(ids) - 1) // seq_len
    x = ids[:n * seq_len].reshape(n, seq_len)
    y = ids[1:n * seq_len + 1].reshape(n, seq_len)
    return x, y


def text(path, seq_len=64, val_fraction=0.1, vocab_size=None, **_):
    chars = read(str(path))
    vocab, ids = np.unique(chars, return_inverse=True)
    ids = ids.astype(np.int32)
    counts = np.bincount(ids) / len(ids)
    entropy = float(-(counts * np.log(counts)).sum())  # nats per character, as the loss is
    cut = split(len(ids), val_fraction)
    x, y = _windows(ids[:cut], seq_len)
    x_val, y_val = _windows(ids[cut:], seq_len)
    return token_pipeline(np.concatenate([x, x_val]), np.concatenate([y, y_val]), len(x), len(vocab), LM,
                          reference_loss=entropy)
