"""The loss every workload trains on."""

from mindspore import nn


class SoftmaxCrossEntropy(nn.Cell):
    """The seed's SoftmaxCrossEntropyWithLogits(reduction="mean") on one-hot labels, over the last axis:
    one label per sample, or one per position for a language model (logits (batch, length, vocab))."""

    def __init__(self):
        super().__init__()
        self.loss = nn.SoftmaxCrossEntropyWithLogits(reduction="mean")

    def construct(self, logits, labels):
        classes = logits.shape[-1]
        return self.loss(logits.reshape(-1, classes), labels.reshape(-1, classes))
