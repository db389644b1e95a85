from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ModelConfig
from lsexp.models import attention_size_problems

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
    return p + attention_size_problems(cfg)
