"""A GPT-style decoder language model: learned positions, pre-LayerNorm blocks of causal self-attention
and a GELU MLP (mindspore.nn.TransformerEncoderLayer with norm_first and a causal mask), a final
LayerNorm, and the output projection tied to the input embedding, as GPT-2 has it."""

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer


class GPT(nn.Cell):
    def __init__(self, vocab_size: int, max_len: int, num_layers: int = 2, d_model: int = 64, nhead: int = 4,
                 dim_feedforward: int = 256, dropout: float = 0.0, num_class: int = 0):
        super().__init__()
        # the model's own Parameter, not an nn.Embedding's: amp wraps sub-cells, which hides their
        # attributes from the tied output projection
        self.embedding_table = Parameter(initializer(Normal(0.02), (vocab_size, d_model)),
                                         name="embedding_table")
        self.position = nn.Embedding(max_len, d_model, embedding_table=Normal(0.02))
        self.positions = Tensor(np.arange(max_len, dtype=np.int32))
        self.blocks = nn.CellList([
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(num_layers)
        ])
        self.norm = nn.LayerNorm((d_model,))
        # True above the diagonal: position i may not attend to j > i
        self.causal_mask = Tensor(np.triu(np.ones((max_len, max_len), dtype=np.bool_), k=1))

    def construct(self, tokens):
        length = tokens.shape[1]
        position = self.position(self.positions[:length])
        x = ops.cast(ops.gather(self.embedding_table, tokens, 0), position.dtype) + position
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            x = block(x, src_mask=mask)
        x = self.norm(x)
        # tied: the logits are the hidden states against every token's embedding, in their precision
        table = ops.cast(self.embedding_table, x.dtype)
        return ops.matmul(x, table.T)  # (batch, length, vocab)
