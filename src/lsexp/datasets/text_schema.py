"""A local UTF-8 text file as a character language-model corpus."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Union

import numpy as np
from omegaconf import OmegaConf

from lsexp.config.schema import FileDatasetConfig

EXPECTED = "a UTF-8 text file"
SOURCE = "any plain text of your own, e.g. a book from Project Gutenberg saved as .txt"


@lru_cache(maxsize=4)
def read(path: str) -> Union[np.ndarray, str]:
    """The file as an array of Unicode code points, or what is wrong with it."""
    p = Path(path).expanduser()
    if not p.is_file():
        return "no such file"
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8 (byte {err.start})"
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def vocabulary(path) -> np.ndarray:
    chars = read(str(path))
    return np.unique(chars) if isinstance(chars, np.ndarray) else np.zeros(0, np.uint32)


# The vocabulary is the file's own characters, known before anything is built: the model's
# vocab_size and num_class follow it through ${dataset.vocab_size}.
OmegaConf.register_new_resolver("lsexp.text_vocab_size", lambda path: len(vocabulary(path)), replace=True)


@dataclass
class TextConfig(FileDatasetConfig):
    _target_: str = "lsexp.datasets.text.text"
    task: str = "lm"
    seq_len: int = 64  # characters per training sequence; the target is the next character
    val_fraction: float = 0.1  # the file's last part, held out for eval_loss
    vocab_size: int = "${lsexp.text_vocab_size:${dataset.path}}"  # type: ignore[assignment]
    num_classes: int = "${dataset.vocab_size}"  # type: ignore[assignment]


SCHEMA = TextConfig


def split(n_chars: int, val_fraction: float) -> int:
    """Characters before the held-out part."""
    return n_chars - int(round(n_chars * val_fraction))


def num_train(d) -> int:
    return (split(len(read(str(d.path))), d.val_fraction) - 1) // d.seq_len


def problems(cfg) -> List[str]:
    d, p = cfg.dataset, []
    chars = read(str(d.path)) if d.path is not None else "no file given"
    if isinstance(chars, str):
        return [f"dataset.path={d.path}: {chars}; expected {EXPECTED} ({SOURCE})"]
    if not 0 < d.val_fraction < 1:
        p.append(f"dataset.val_fraction={d.val_fraction}: must be between 0 and 1; e.g. 0.1")
    elif d.seq_len < 1:
        p.append(f"dataset.seq_len={d.seq_len}: must be >= 1; e.g. 64")
    elif min(num_train(d), (len(chars) - split(len(chars), d.val_fraction) - 1) // d.seq_len) < 1:
        p.append(
            f"dataset.path={d.path}: {len(chars)} characters are too few for one training and one held-out "
            f"sequence of dataset.seq_len={d.seq_len}; use a longer text or a shorter seq_len"
        )
    return p
