"""model=gpt: a GPT-style decoder language model (lsexp.models.gpt), on a language-model data set."""

from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ModelConfig


@dataclass
class GPTConfig(ModelConfig):
    _target_: str = "lsexp.models.gpt.GPT"
    vocab_size: int = "${dataset.vocab_size}"  # type: ignore[assignment]
    max_len: int = "${dataset.seq_len}"  # type: ignore[assignment]
    num_layers: int = 2
    d_model: int = 64
    nhead: int = 4
    dim_feedforward: int = 256
    dropout: float = 0.0  # dropout's random state is not checkpointed, so > 0 breaks exact resume


SCHEMA = GPTConfig


def problems(cfg) -> List[str]:
    m, d, p = cfg.model, cfg.dataset, []
    if d.get("task") != "lm":
        name = d._target_.rsplit(".", 1)[-1]
        return [f"model._target_={m._target_} with dataset {name}: a language model needs text; use "
                f"dataset=python_source or dataset=text"]
    for key in ("vocab_size", "max_len", "num_layers", "d_model", "nhead", "dim_feedforward"):
        if m[key] < 1:
            p.append(f"model.{key}={m[key]}: must be >= 1")
    if m.nhead >= 1 and m.d_model >= 1 and m.d_model % m.nhead:
        p.append(f"model.d_model={m.d_model} with model.nhead={m.nhead}: d_model must be a multiple of nhead")
    if not 0 <= m.dropout < 1:
        p.append(f"model.dropout={m.dropout}: must be in [0, 1)")
    if m.max_len < d.seq_len:
        p.append(f"model.max_len={m.max_len}: shorter than dataset.seq_len={d.seq_len}; raise it")
    return p
