from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ModelConfig

TASKS = ("classify", "lm")


@dataclass
class TransformerConfig(ModelConfig):
    _target_: str = "lsexp.models.transformer_encoder.Transformer"
    task: str = "${dataset.task}"  # type: ignore[assignment]  # classify or lm, as the data set asks
    vocab_size: int = "${dataset.vocab_size}"  # type: ignore[assignment]
    max_len: int = "${dataset.seq_len}"  # type: ignore[assignment]
    num_layers: int = 2
    d_model: int = 64
    nhead: int = 4
    dim_feedforward: int = 128
    dropout: float = 0.0  # dropout's random state is not checkpointed, so > 0 breaks exact resume


SCHEMA = TransformerConfig


def problems(cfg) -> List[str]:
    m, p = cfg.model, []
    if m.task not in TASKS:
        p.append(f"model.task={m.task}: use classify (a label per sequence) or lm (next token)")
    for key in ("vocab_size", "max_len", "num_layers", "d_model", "nhead", "dim_feedforward"):
        if m[key] < 1:
            p.append(f"model.{key}={m[key]}: must be >= 1")
    if m.nhead >= 1 and m.d_model >= 1 and m.d_model % m.nhead:
        p.append(f"model.d_model={m.d_model} with model.nhead={m.nhead}: d_model must be a multiple of nhead")
    if not 0 <= m.dropout < 1:
        p.append(f"model.dropout={m.dropout}: must be in [0, 1)")
    if "seq_len" in cfg.dataset and m.max_len < cfg.dataset.seq_len:
        p.append(f"model.max_len={m.max_len}: shorter than dataset.seq_len={cfg.dataset.seq_len}; raise it")
    return p
