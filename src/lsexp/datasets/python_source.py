"""A byte-level language model's data from the interpreter's own standard library
(lsexp.datasets.python_source_schema): windows of seq_len bytes, each target the next byte."""

from lsexp.datasets.python_source_schema import VOCAB, read
from lsexp.datasets.text import language_model


def python_source(max_bytes=2_000_000, seq_len=128, val_fraction=0.1, **_):
    return language_model(read(max_bytes).astype("int32"), VOCAB, seq_len, val_fraction)
