"""model=gpt: a GPT-style decoder language model (lsexp.models.gpt), on a language-model data set."""

from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ModelConfig
from lsexp.models import attention_size_problems, scaling_problems


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
    scaling: str = "standard"  # or "unit": unit scaling (lsexp.models.unit), Blake et al. 2023


SCHEMA = GPTConfig


def problems(cfg) -> List[str]:
    if cfg.dataset.get("task") != "lm":
        name = cfg.dataset._target_.rsplit(".", 1)[-1]
        return [f"model._target_={cfg.model._target_} with dataset {name}: a language model needs text; use "
                f"dataset=python_source or dataset=text"]
    return attention_size_problems(cfg) + scaling_problems(cfg)
