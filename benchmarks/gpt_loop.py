"""workload=gpt_python through lsexp against a hand-written MindSpore loop of the same model and work:

    python benchmarks/gpt_loop.py [pairs]      (5 by default)

Both train lsexp.models.gpt.GPT (2 pre-LN blocks, d_model 64, tied embeddings) on the first 200 000 bytes
of the interpreter's standard library (dataset=python_source) in sequences of 128 bytes, batches of 32
(4096 tokens a step), with AdamWeightDecay at a constant 0.003 and weight decay 0.01 on every parameter,
a fixed loss scale of 128 with dropped overflow updates (TrainOneStepWithLossScaleCell with
amp.all_finite, as on CPU it must be), O0, reading the loss every step, 3 epochs of 43 steps. The
hand-written loop feeds numpy batches straight to the step; lsexp its own data path. Both run in this
one process, alternating, timed per step over epochs 2 and 3: the ratio is lsexp's overhead per token.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from handwritten_loop import lsexp_loop
from ratios import report

OVERRIDES = ("workload=gpt_python", "dataset.max_bytes=200000", "lr_schedule=constant",
             "optimizer.decay_filter=false", "train.epochs=3", "train.max_steps=null")
SEQ, BATCH, EPOCHS = 128, 32, 3


def handwritten() -> float:
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.amp import all_finite

    from lsexp.datasets.python_source_schema import read
    from lsexp.models.gpt import GPT

    class Step(nn.TrainOneStepWithLossScaleCell):
        def get_overflow_status(self, status, compute_output):
            return ops.logical_not(all_finite(compute_output))

    class TokenLoss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.loss = nn.SoftmaxCrossEntropyWithLogits(reduction="mean")

        def construct(self, logits, labels):
            return self.loss(logits.reshape(-1, 256), labels.reshape(-1, 256))

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)
    ids = read(200_000).astype(np.int32)
    cut = len(ids) - int(round(len(ids) * 0.1))
    n = (cut - 1) // SEQ
    x = ids[:n * SEQ].reshape(n, SEQ)
    y = np.eye(256, dtype=np.float32)[ids[1:n * SEQ + 1].reshape(n, SEQ)]
    net = GPT(256, SEQ)
    loss_net = nn.WithLossCell(net, TokenLoss())
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=0.003, weight_decay=0.01)
    step = Step(loss_net, opt, ms.amp.FixedLossScaleManager(128.0).get_update_cell())
    step.set_train()
    seconds, steps = [], n // BATCH
    for epoch in range(EPOCHS):
        started = time.perf_counter()
        order = np.random.default_rng([1, epoch]).permutation(n)
        for lo in range(0, steps * BATCH, BATCH):
            idx = order[lo:lo + BATCH]
            loss, _, _ = step(Tensor(x[idx]), Tensor(y[idx]))
            loss.asnumpy()
        seconds.append(time.perf_counter() - started)
    return 1000 * sum(seconds[1:]) / ((EPOCHS - 1) * steps)


def main(pairs: int) -> None:
    ms_per_step = {"lsexp": [], "handwritten": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            ms_per_step["lsexp"].append(lsexp_loop(Path(tmp), i, *OVERRIDES))
            ms_per_step["handwritten"].append(handwritten())
    report(ms_per_step, "lsexp / hand-written (per step of 4096 tokens)", " ".join(OVERRIDES))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
