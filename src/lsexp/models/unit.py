"""Unit scaling (Blake, Orr and Luschi 2023, arXiv 2303.11257) as MindSpore cells: every op carries fixed
forward and backward scale factors so that, at initialisation and for unit-normal inputs, activations,
weights and gradients have a standard deviation near one. The factors are those of the authors' library,
github.com/graphcore-research/unit-scaling at a5b595ce6e56a736cd800e612a684045acfbec75 (the last commit
before its ops became u-muP's), unit_scaling/functional.py and scale.py; tests/helpers/
unit_scaling_reference.py transcribes them in numpy and tests/test_unit_scaling.py checks these cells
against it.

The library's two primitives (scale.py): scale_fwd(x, s) multiplies by s going forward and passes the
gradient as it is; scale_bwd(x, s) passes x as it is and multiplies the gradient by s. An op scale_bwd's
its inputs, applies the plain op and scale_fwd's its output. Where the library's default constraint
("gmean") ties the output's scale to the input gradient's, both take their geometric mean."""

from __future__ import annotations

import math

from mindspore import Parameter, nn, ops
from mindspore.common.initializer import Normal, initializer

# ReLU is not in the library: its factors derived as the paper derives the others, from the standard
# deviation of relu(x) and of its gradient for x ~ N(0, 1): sqrt((1 - 1/pi) / 2) and sqrt(1/2)
RELU_OUTPUT_STD = math.sqrt((1 - 1 / math.pi) / 2)
RELU_GRAD_STD = math.sqrt(0.5)


def gmean(*scales: float) -> float:
    """unit_scaling/constraints.py, gmean: the geometric mean of the scales it ties."""
    return math.prod(scales) ** (1 / len(scales))


class ScaleGrad(nn.Cell):
    """scale_bwd with a scale given at each call: x going forward, the gradient times `scale` coming
    back (unit_scaling/scale.py, _ScaledGrad with fwd_scale 1)."""

    def construct(self, x, scale):
        return x

    def bprop(self, x, scale, out, dout):
        return dout * scale, ops.zeros_like(scale)


class ScaleForward(nn.Cell):
    """scale_fwd: x times `scale` going forward, the gradient passed as it is (unit_scaling/scale.py)."""

    def construct(self, x, scale):
        return x * scale

    def bprop(self, x, scale, out, dout):
        return dout, ops.zeros_like(scale)


class UnitDense(nn.Cell):
    """unit_scaling/functional.py, linear: output scaled by fan_in ** -1/2, input gradient by
    fan_out ** -1/2, tied by the constraint (its default gmean: both (fan_in * fan_out) ** -1/4; None: as
    they are, as the library's own TransformerDecoder reads out its logits), the weight's and bias's
    gradients by batch ** -1/2 (batch: the input's elements over fan_in); unit_scaling/_modules.py,
    Linear: weight N(0, 1), bias 0. Parameters named as nn.Dense's (weight, bias), so that a checkpoint
    and the taps read them alike."""

    def __init__(self, in_channels: int, out_channels: int, constraint: str = "gmean"):
        super().__init__()
        self.weight = Parameter(initializer(Normal(1.0), (out_channels, in_channels)), name="weight")
        self.bias = Parameter(initializer("zeros", (out_channels,)), name="bias")
        output, grad_input = in_channels ** -0.5, out_channels ** -0.5
        if constraint == "gmean":
            output = grad_input = gmean(output, grad_input)
        self.output_scale, self.grad_input_scale = output, grad_input
        self.in_channels = in_channels
        self.grad, self.forward_scale = ScaleGrad(), ScaleForward()

    def construct(self, x):
        batch = x.size // self.in_channels
        grad_scale = ops.scalar_to_tensor(batch ** -0.5, x.dtype)
        w = self.grad(ops.cast(self.weight, x.dtype), grad_scale)
        b = self.grad(ops.cast(self.bias, x.dtype), grad_scale)
        y = ops.matmul(self.grad(x, ops.scalar_to_tensor(self.grad_input_scale, x.dtype)), w.T) + b
        return self.forward_scale(y, ops.scalar_to_tensor(self.output_scale, x.dtype))


class UnitReLU(nn.Cell):
    """ReLU scaled as unit_scaling/functional.py's scale_elementwise scales an element-wise function,
    with its default constraint gmean: output and gradient by (1 / RELU_OUTPUT_STD / RELU_GRAD_STD) ** 1/2
    (derived: the library has no ReLU)."""

    def __init__(self):
        super().__init__()
        self.scale = gmean(1 / RELU_OUTPUT_STD, 1 / RELU_GRAD_STD)
        self.grad, self.forward_scale = ScaleGrad(), ScaleForward()

    def construct(self, x):
        scale = ops.scalar_to_tensor(self.scale, x.dtype)
        return self.forward_scale(ops.relu(self.grad(x, scale)), scale)


class UnitCrossEntropyGrad(nn.Cell):
    """The backward of unit_scaling/functional.py's cross_entropy, on the logits: the gradient of the
    summed loss times num_class / sqrt(num_class - 1), not divided by the batch. lsexp's loss is the batch
    mean (what is logged is the same number as the library's forward gives), so the gradient that reaches
    the logits is scaled back by the batch too."""

    def __init__(self, num_class: int):
        super().__init__()
        self.factor = num_class / math.sqrt(num_class - 1) if num_class > 1 else 1.0
        self.grad = ScaleGrad()

    def construct(self, logits):
        batch = logits.size // logits.shape[-1]
        return self.grad(logits, ops.scalar_to_tensor(self.factor * batch, logits.dtype))
