"""The loss every workload trains on."""

from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype


class SoftmaxCrossEntropy(nn.Cell):
    """The seed's SoftmaxCrossEntropyWithLogits(reduction="mean") on one-hot labels, over the last axis:
    one label per sample, or one per position for a language model (logits (batch, length, vocab))."""

    def __init__(self):
        super().__init__()
        self.loss = nn.SoftmaxCrossEntropyWithLogits(reduction="mean")

    def construct(self, logits, labels):
        # in the labels' float32, as build_train_network's loss network takes a network's output under
        # amp.level=auto, whose last MatMul leaves it in low precision (a no-op where it is float32)
        logits = ops.cast(logits, labels.dtype)
        classes = logits.shape[-1]
        return self.loss(logits.reshape(-1, classes), labels.reshape(-1, classes))


class _GradientTimes(nn.Cell):
    """The identity going forward; coming back, the gradient times `factor`."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = Tensor(factor, mstype.float32)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (dout * ops.cast(self.factor, dout.dtype),)


class TokenMeanLoss(nn.Cell):
    """train.mean_over_tokens: `loss`'s value as it is, the batch's mean, and its gradients as the mean
    over `tokens` tokens would make them: the batch's `batch_tokens` of them, each weighted 1/tokens
    instead of 1/batch_tokens. As in a batch of `tokens` tokens, the loss itself stays of the order of
    one; only what flows back is small."""

    def __init__(self, loss: nn.Cell, batch_tokens: int, tokens: int):
        super().__init__()
        self.loss = loss
        self.times = _GradientTimes(float(batch_tokens) / float(tokens))

    def construct(self, logits, labels):
        return self.times(self.loss(logits, labels))


def loss_cell(batch_tokens: int = 1, tokens=None) -> nn.Cell:
    """The loss every workload trains on, with train.mean_over_tokens' gradients where it is set."""
    if tokens is None:
        return SoftmaxCrossEntropy()
    return TokenMeanLoss(SoftmaxCrossEntropy(), batch_tokens, tokens)
