"""A GPT-style decoder language model: learned positions, pre-LayerNorm blocks of causal self-attention
and a GELU MLP (mindspore.nn.TransformerEncoderLayer with norm_first and a causal mask), a final
LayerNorm, and the output projection tied to the input embedding, as GPT-2 has it. With scaling=unit,
the same architecture from the unit-scaled cells of lsexp.models.unit."""

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer


class GPT(nn.Cell):
    def __init__(self, vocab_size: int, max_len: int, num_layers: int = 2, d_model: int = 64, nhead: int = 4,
                 dim_feedforward: int = 256, dropout: float = 0.0, num_class: int = 0,
                 scaling: str = "standard"):
        super().__init__()
        self.unit = scaling == "unit"
        # the model's own Parameter, not an nn.Embedding's: amp wraps sub-cells, which hides their
        # attributes from the tied output projection
        table = initializer(Normal(1.0 if self.unit else 0.02), (vocab_size, d_model))
        self.embedding_table = Parameter(table, name="embedding_table")
        self.positions = Tensor(np.arange(max_len, dtype=np.int32))
        # True above the diagonal: position i may not attend to j > i
        self.causal_mask = Tensor(np.triu(np.ones((max_len, max_len), dtype=np.bool_), k=1))
        if self.unit:
            from lsexp.models import unit

            self.lookup = unit.UnitLookup(vocab_size)
            self.position = unit.UnitEmbedding(max_len, d_model)
            self.add = unit.UnitEmbeddingAdd()
            self.blocks = nn.CellList([unit.UnitTransformerLayer(d_model, nhead, dim_feedforward, max_len)
                                       for _ in range(num_layers)])
            self.norm = unit.UnitLayerNorm(d_model)
            self.readout = unit.UnitReadout(d_model, vocab_size)
            return
        self.position = nn.Embedding(max_len, d_model, embedding_table=Normal(0.02))
        self.blocks = nn.CellList([
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(num_layers)
        ])
        self.norm = nn.LayerNorm((d_model,))

    def construct(self, tokens):
        length = tokens.shape[1]
        position = self.position(self.positions[:length])
        mask = self.causal_mask[:length, :length]
        if self.unit:
            x = self.add(ops.cast(self.lookup(self.embedding_table, tokens), position.dtype), position)
        else:
            x = ops.cast(ops.gather(self.embedding_table, tokens, 0), position.dtype) + position
        for block in self.blocks:
            x = block(x, src_mask=mask)
        x = self.norm(x)
        # tied: the logits are the hidden states against every token's embedding, in their precision
        table = ops.cast(self.embedding_table, x.dtype)
        if self.unit:
            return self.readout(x, table)
        return ops.matmul(x, table.T)  # (batch, length, vocab)
