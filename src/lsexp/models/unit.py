"""Unit scaling (Blake, Orr and Luschi 2023, arXiv 2303.11257) as MindSpore cells: every op carries fixed
forward and backward scale factors so that, at initialisation and for unit-normal inputs, activations,
weights and gradients have a standard deviation near one. The factors are those of the authors' library,
github.com/graphcore-research/unit-scaling at a5b595ce6e56a736cd800e612a684045acfbec75 (the last commit
before its ops became u-muP's), unit_scaling/functional.py and scale.py; tests/helpers/
unit_scaling_reference.py transcribes them in numpy and tests/test_unit_scaling.py checks these cells
against it.

The library's two primitives (scale.py): scale_fwd(x, s) multiplies by s going forward and passes the
gradient as it is; scale_bwd(x, s) passes x as it is and multiplies the gradient by s. An op scale_bwd's
its inputs, applies the plain op and scale_fwd's its output; here each op is one cell with its own
bprop, which computes the same. Where the library's default constraint ("gmean") ties the output's
scale to the input gradient's, both take their geometric mean."""

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


class _ScaledLinear(nn.Cell):
    """(x @ w.T + b) * output_scale, and its backward in one custom bprop: the input's gradient times
    grad_input_scale, the weight's and bias's times batch ** -1/2. One cell instead of a scale_bwd per
    input and a scale_fwd: a CPU step is bound by per-operator dispatch (docs/unit_scaling.md)."""

    def __init__(self, fan_in: int, fan_out: int, output_scale: float, grad_input_scale: float):
        super().__init__()
        self.fan_in, self.fan_out = fan_in, fan_out
        self.output_scale, self.grad_input_scale = output_scale, grad_input_scale
        self.matmul_nt = ops.MatMul(transpose_b=True)
        self.matmul_tn = ops.MatMul(transpose_a=True)

    def construct(self, x, w, b):
        if x.ndim == 2:
            return ops.bias_add(self.matmul_nt(x, w), b) * self.output_scale
        return (ops.matmul(x, w.T) + b) * self.output_scale

    def bprop(self, x, w, b, out, dout):
        weight_scale = (x.size // self.fan_in) ** -0.5
        g, x2 = dout, x
        if x.ndim != 2:
            g, x2 = dout.reshape(-1, self.fan_out), x.reshape(-1, self.fan_in)
        return (ops.matmul(dout, w) * self.grad_input_scale, self.matmul_tn(g, x2) * weight_scale,
                g.sum(0) * weight_scale)


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
        self.linear = _ScaledLinear(in_channels, out_channels, output, grad_input)

    def construct(self, x):
        w, b = self.weight, self.bias
        if w.dtype != x.dtype:  # under amp, as nn.Dense computes in its input's type
            w, b = ops.cast(w, x.dtype), ops.cast(b, x.dtype)
        return self.linear(x, w, b)


class UnitReLU(nn.Cell):
    """ReLU scaled as unit_scaling/functional.py's scale_elementwise scales an element-wise function,
    with its default constraint gmean: output and gradient both by (1 / RELU_OUTPUT_STD /
    RELU_GRAD_STD) ** 1/2 (derived: the library has no ReLU). With the two scales equal and positive, that
    is relu(scale * x), whose own gradient is scale * 1[x > 0] * g."""

    def __init__(self):
        super().__init__()
        self.scale = gmean(1 / RELU_OUTPUT_STD, 1 / RELU_GRAD_STD)

    def construct(self, x):
        return ops.relu(x * self.scale)


class UnitCrossEntropyGrad(nn.Cell):
    """The backward of unit_scaling/functional.py's cross_entropy, on the logits: the gradient of the
    summed loss times num_class / sqrt(num_class - 1), not divided by the batch. lsexp's loss is the batch
    mean (what is logged is the same number as the library's forward gives), so the gradient that reaches
    the logits is scaled back by the batch too. The identity going forward."""

    def __init__(self, num_class: int):
        super().__init__()
        self.factor = num_class / math.sqrt(num_class - 1) if num_class > 1 else 1.0

    def construct(self, logits):
        return logits

    def bprop(self, logits, out, dout):
        return (dout * (self.factor * (logits.size // logits.shape[-1])),)
