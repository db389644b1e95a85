"""Accuracy and loss on the held-out split, after each epoch."""

from __future__ import annotations

from typing import Dict

import numpy as np

EVAL_BATCH = 256  # samples per eval forward: few compiled shapes, and activations that stay small


def evaluate(net, data) -> Dict[str, float]:
    """Accuracy and mean cross-entropy on the held-out split (per position for a language model)."""
    net.set_train(False)
    correct = total = 0
    nll = 0.0
    rows = None
    for x, labels in data.eval_batches(EVAL_BATCH):
        n = len(labels)
        rows = rows or n
        logits = net(_filled(x, rows)).asnumpy()[:n].astype(np.float64)
        logits = logits.reshape(-1, logits.shape[-1])
        labels = labels.reshape(-1)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        nll += float((log_z - logits[np.arange(len(labels)), labels]).sum())
        correct += int((logits.argmax(axis=1) == labels).sum())
        total += len(labels)
    net.set_train(True)
    return {"eval_accuracy": correct / total, "eval_loss": nll / total}


def _filled(x, rows: int):
    """The last, shorter batch filled up to the others' rows with copies of its last sample, whose
    outputs are dropped: it then runs the network compiled for them, where a shape of its own would
    compile the network again (seconds on a Transformer). No layer in eval mode mixes samples."""
    if x.shape[0] == rows:
        return x
    from mindspore import Tensor

    a = x.asnumpy()
    return Tensor(np.concatenate([a, np.repeat(a[-1:], rows - a.shape[0], axis=0)]))
