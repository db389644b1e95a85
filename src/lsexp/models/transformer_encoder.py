"""A small Transformer encoder on mindspore.nn.TransformerEncoderLayer, over token ids.

task=classify: one label per sequence, read from the first position's output (as BERT's [CLS]).
task=lm: a causal character language model, next-token logits at every position.
Attention's softmax runs in float16 at O2/O3, which is where real overflows appear.
"""

# Named transformer_encoder, not transformer: amp O1 rewrites networks into source that imports
# MindSpore's own nn/layer/transformer.py by its bare module name, which a lsexp/models/transformer.py
# shadows.

import numpy as np
from mindspore import Tensor, nn
from mindspore.common.initializer import Normal


class Transformer(nn.Cell):
    def __init__(
        self,
        num_class: int,
        vocab_size: int,
        max_len: int,
        task: str = "classify",
        num_layers: int = 2,
        d_model: int = 64,
        nhead: int = 4,
        dim_feedforward: int = 128,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.lm = task == "lm"
        self.embedding = nn.Embedding(vocab_size, d_model, embedding_table=Normal(0.02))
        self.position = nn.Embedding(max_len, d_model, embedding_table=Normal(0.02))
        self.positions = Tensor(np.arange(max_len, dtype=np.int32))
        self.layers = nn.CellList(
            [
                nn.TransformerEncoderLayer(
                    d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True
                )
                for _ in range(num_layers)
            ]
        )
        self.norm = nn.LayerNorm((d_model,))
        self.head = nn.Dense(d_model, num_class, weight_init=Normal(0.02))
        # True above the diagonal: position i may not attend to j > i.
        self.causal_mask = Tensor(np.triu(np.ones((max_len, max_len), dtype=np.bool_), k=1))

    def construct(self, tokens):
        length = tokens.shape[1]
        x = self.embedding(tokens) + self.position(self.positions[:length])
        mask = self.causal_mask[:length, :length] if self.lm else None
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        x = self.norm(x)
        if self.lm:
            return self.head(x)  # (batch, length, vocab)
        return self.head(x[:, 0])  # (batch, num_class)
