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
from mindspore import dtype as mstype
from mindspore.common.initializer import Normal, initializer

# ReLU is not in the library: its factors derived as the paper derives the others, from the standard
# deviation of relu(x) and of its gradient for x ~ N(0, 1): sqrt((1 - 1/pi) / 2) and sqrt(1/2)
RELU_OUTPUT_STD = math.sqrt((1 - 1 / math.pi) / 2)
RELU_GRAD_STD = math.sqrt(0.5)


def gmean(*scales: float) -> float:
    """unit_scaling/constraints.py, gmean: the geometric mean of the scales it ties."""
    return math.prod(scales) ** (1 / len(scales))


class _ScaledProjection(nn.Cell):
    """(x @ w.T) * output_scale without a bias, as the library's bias=False Linear (MHSA's projections)
    and the tied read-out compute it, and its backward in one custom bprop: the input's gradient times
    grad_input_scale, the weight's times batch ** -1/2. One cell instead of a scale_bwd per input and a
    scale_fwd: a CPU step is bound by per-operator dispatch (docs/unit_scaling.md). Leading dimensions are
    folded into one, as nn.Dense folds them: a 2-D MatMul, not a broadcast BatchMatMul."""

    def __init__(self, fan_in: int, fan_out: int, output_scale: float, grad_input_scale: float):
        super().__init__()
        self.fan_in, self.fan_out = fan_in, fan_out
        self.output_scale, self.grad_input_scale = output_scale, grad_input_scale
        self.matmul_nt = ops.MatMul(transpose_b=True)
        self.matmul_nn = ops.MatMul()
        self.matmul_tn = ops.MatMul(transpose_a=True)

    def construct(self, x, w):
        return self.unfold(self.matmul_nt(x.reshape(-1, self.fan_in), w) * self.output_scale, x)

    def bprop(self, x, w, out, dout):
        dx, dw, _ = self.grads(x, w, dout)
        return dx, dw

    def unfold(self, y, x):
        return y.reshape(x.shape[:-1] + (self.fan_out,))

    def grads(self, x, w, dout):
        """The input's and weight's gradients, and the 2-D incoming gradient and batch ** -1/2, from which
        the bias's."""
        weight_scale = (x.size // self.fan_in) ** -0.5
        g, x2 = dout.reshape(-1, self.fan_out), x.reshape(-1, self.fan_in)
        dx = (self.matmul_nn(g, w) * self.grad_input_scale).reshape(x.shape)
        return dx, self.matmul_tn(g, x2) * weight_scale, (g, weight_scale)


class _ScaledLinear(_ScaledProjection):
    """(x @ w.T + b) * output_scale: _ScaledProjection with a bias, whose gradient is scaled as the
    weight's."""

    def construct(self, x, w, b):
        y = ops.bias_add(self.matmul_nt(x.reshape(-1, self.fan_in), w), b) * self.output_scale
        return self.unfold(y, x)

    def bprop(self, x, w, b, out, dout):
        dx, dw, (g, weight_scale) = self.grads(x, w, dout)
        return dx, dw, g.sum(0) * weight_scale


def linear_scales(fan_in: int, fan_out: int, constraint) -> tuple:
    """functional.linear's output and input-gradient scales, fan_in ** -1/2 and fan_out ** -1/2, tied by
    the constraint: gmean, or None for both as they are."""
    output, grad_input = fan_in ** -0.5, fan_out ** -0.5
    if constraint == "gmean":
        output = grad_input = gmean(output, grad_input)
    return output, grad_input


class UnitDense(nn.Cell):
    """unit_scaling/functional.py, linear: output scaled by fan_in ** -1/2, input gradient by
    fan_out ** -1/2, tied by the constraint (its default gmean: both (fan_in * fan_out) ** -1/4; None: as
    they are, as the library's own TransformerDecoder reads out its logits), the weight's and bias's
    gradients by batch ** -1/2 (batch: the input's elements over fan_in); unit_scaling/_modules.py,
    Linear: weight N(0, 1), bias 0 (has_bias=False: none, as MHSA's projections). Parameters named as
    nn.Dense's (weight, bias), so that a checkpoint and the taps read them alike."""

    def __init__(self, in_channels: int, out_channels: int, constraint: str = "gmean", has_bias: bool = True):
        super().__init__()
        self.weight = Parameter(initializer(Normal(1.0), (out_channels, in_channels)), name="weight")
        self.has_bias = has_bias
        output, grad_input = linear_scales(in_channels, out_channels, constraint)
        if has_bias:
            self.bias = Parameter(initializer("zeros", (out_channels,)), name="bias")
            self.linear = _ScaledLinear(in_channels, out_channels, output, grad_input)
        else:
            self.linear = _ScaledProjection(in_channels, out_channels, output, grad_input)

    def construct(self, x):
        w = self.weight
        if w.dtype != x.dtype:  # under amp, as nn.Dense computes in its input's type
            w = ops.cast(w, x.dtype)
        if not self.has_bias:
            return self.linear(x, w)
        b = self.bias
        if b.dtype != x.dtype:
            b = ops.cast(b, x.dtype)
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
        self.cast = ops.Cast()

    def construct(self, logits):
        return logits

    def bprop(self, logits, out, dout):
        # in float32: the factor times a batch of 4096 tokens passes float16's 65504 as a float16 scalar
        times = self.cast(dout, mstype.float32) * (self.factor * (logits.size // logits.shape[-1]))
        return (self.cast(times, dout.dtype),)


# --- the GPT's ops (model=gpt model.scaling=unit) -----------------------------------------------------

# functional.gelu: "Scale factors determined empirically, assuming unit scaled input & grad"
GELU_OUTPUT_STD, GELU_GRAD_STD = 0.588, 0.675
# TransformerLayer's defaults (_modules.py): the attention branch weighs 0.01 against its skip, the MLP 0.5
MHSA_TAU, MLP_TAU = 0.01, 0.5
LAYER_NORM_EPS = 1e-5  # F.layer_norm's default, which functional.layer_norm keeps


def causal_attention_scale(length: int) -> float:
    """Derived, not in the library: its scaled_dot_product_attention's factor (length / e) ** 1/2 assumes
    every query sees every key. A query seeing k unit-normal logits' keys gives an output of variance
    about e/k - (e - 1)/k ** 2, so the causal rows' mean over k = 1..length is
    (e H - (e - 1) H2) / length, H and H2 the sums of 1/k and 1/k ** 2; the factor is its inverse square
    root (tests/helpers/unit_scaling_reference.py, causal_attention_scale, derives it)."""
    h1 = sum(1.0 / k for k in range(1, length + 1))
    h2 = sum(1.0 / k ** 2 for k in range(1, length + 1))
    return (length / (math.e * h1 - (math.e - 1) * h2)) ** 0.5


class ScaleGrad(nn.Cell):
    """scale.py, scale_bwd: the identity going forward, the gradient times `scale` coming back."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (dout * self.scale,)


class ResidualAdd(nn.Cell):
    """functional.residual_add: tau ** 1/2 * residual + (1 - tau) ** 1/2 * skip going forward (scale_fwd:
    the gradients pass as they are; residual_split, two ScaleGrads before the branch, weighs them)."""

    def __init__(self, tau: float):
        super().__init__()
        self.residual, self.skip = tau ** 0.5, (1 - tau) ** 0.5

    def construct(self, residual, skip):
        return residual * self.residual + skip * self.skip

    def bprop(self, residual, skip, out, dout):
        return dout, dout


class _GradByRows(nn.Cell):
    """A parameter's gradient times (rows / count) ** 1/2, with count the rows of `like` that used it:
    layer_norm's gain and bias (rows 1: batch ** -1/2) and embedding's table (rows: num_embeddings,
    count: the indices looked up). The identity on the parameter going forward."""

    def __init__(self, width: int, rows: int = 1):
        super().__init__()
        self.width, self.rows = width, rows
        self.zeros_like = ops.ZerosLike()

    def construct(self, p, like):
        return p

    def bprop(self, p, like, out, dout):
        return dout * (self.rows / (like.size // self.width)) ** 0.5, self.zeros_like(like)


class UnitLayerNorm(nn.LayerNorm):
    """functional.layer_norm: F.layer_norm (eps 1e-5) unscaled, forward and input gradient; the gain's and
    bias's gradients times batch ** -1/2. An nn.LayerNorm, so that amp's O2 keeps it in float32 as it keeps
    the standard GPT's, with its parameters' names (gamma, beta) and initialisation (1, 0)."""

    def __init__(self, d_model: int):
        super().__init__((d_model,), epsilon=LAYER_NORM_EPS)
        self.by_batch = _GradByRows(d_model)

    def construct(self, input_x):
        gamma = self.by_batch(self.gamma, input_x).astype(input_x.dtype)
        beta = self.by_batch(self.beta, input_x).astype(input_x.dtype)
        y, _, _ = self.layer_norm(input_x, gamma, beta)
        return y


class UnitGELU(nn.Cell):
    """functional.gelu (exact erf) under its default gmean: output and gradient both by
    (GELU_OUTPUT_STD * GELU_GRAD_STD) ** -1/2; with the two equal, that is scale * gelu(x)."""

    def __init__(self):
        super().__init__()
        self.scale = gmean(1 / GELU_OUTPUT_STD, 1 / GELU_GRAD_STD)

    def construct(self, x):
        return ops.gelu(x, approximate="none") * self.scale


class UnitCausalSelfAttention(nn.Cell):
    """_modules.py, MHSA: q, k and v from one unit-scaled Linear without bias (their features laid out
    "(z h d)", z the three), heads split, attention, heads merged, an output Linear without bias. Its
    attention is functional.scaled_dot_product_attention's (softmax(q k^T / d_head ** 1/2) v, one factor
    on the output and on q's, k's and v's gradients), with the causal factor derived
    (causal_attention_scale): the library's MHSA at the pin has no mask."""

    def __init__(self, d_model: int, nhead: int, max_len: int):
        super().__init__()
        self.nhead, self.head = nhead, d_model // nhead
        self.qkv = UnitDense(d_model, 3 * d_model, has_bias=False)
        self.out = UnitDense(d_model, d_model, has_bias=False)
        self.factors = tuple(causal_attention_scale(n) if n else 1.0 for n in range(max_len + 1))

    def construct(self, x, mask):
        batch, length, width = x.shape
        qkv = self.qkv(x).reshape(batch, length, 3, self.nhead, self.head).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        logits = ops.matmul(q, k.swapaxes(-1, -2)) * (self.head ** -0.5)
        p = ops.softmax(ops.masked_fill(logits, mask, float("-inf")), -1)
        o = ops.matmul(p, v) * self.factors[length]
        return self.out(o.transpose(0, 2, 1, 3).reshape(batch, length, width))


class UnitMLPBlock(nn.Cell):
    """_modules.py, MLP: Linear, GELU, Linear, each unit-scaled (gmean), with biases."""

    def __init__(self, d_model: int, dim_feedforward: int):
        super().__init__()
        self.dense1 = UnitDense(d_model, dim_feedforward)
        self.gelu = UnitGELU()
        self.dense2 = UnitDense(dim_feedforward, d_model)

    def construct(self, x):
        return self.dense2(self.gelu(self.dense1(x)))


class UnitTransformerLayer(nn.Cell):
    """_modules.py, TransformerLayer (pre-norm): residual_split, LayerNorm, MHSA, residual_add with
    mhsa_tau 0.01; then the same with the MLP and mlp_tau 0.5. Called as the standard GPT calls
    nn.TransformerEncoderLayer (src_mask: True where a query may not see a key)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, max_len: int):
        super().__init__()
        self.norm1 = UnitLayerNorm(d_model)
        self.self_attn = UnitCausalSelfAttention(d_model, nhead, max_len)
        self.attn_residual, self.attn_skip = ScaleGrad(MHSA_TAU ** 0.5), ScaleGrad((1 - MHSA_TAU) ** 0.5)
        self.attn_add = ResidualAdd(MHSA_TAU)
        self.norm2 = UnitLayerNorm(d_model)
        self.mlp = UnitMLPBlock(d_model, dim_feedforward)
        self.mlp_residual, self.mlp_skip = ScaleGrad(MLP_TAU ** 0.5), ScaleGrad((1 - MLP_TAU) ** 0.5)
        self.mlp_add = ResidualAdd(MLP_TAU)

    def construct(self, x, src_mask=None):
        h = self.self_attn(self.norm1(self.attn_residual(x)), src_mask)
        x = self.attn_add(h, self.attn_skip(x))
        h = self.mlp(self.norm2(self.mlp_residual(x)))
        return self.mlp_add(h, self.mlp_skip(x))


class UnitLookup(nn.Cell):
    """functional.embedding: the plain lookup of `ids` in `table`, the table's gradient times
    (num_embeddings / indices looked up) ** 1/2. The table is passed in, as the GPT's token table is
    also its read-out's."""

    def __init__(self, num_embeddings: int):
        super().__init__()
        self.table_grad = _GradByRows(1, num_embeddings)

    def construct(self, table, ids):
        return ops.gather(self.table_grad(table, ids), ids, 0)


class UnitEmbedding(nn.Cell):
    """An embedding of its own table, N(0, 1) (torch.nn.Embedding's own initialisation, which the
    library's Embedding keeps), looked up as UnitLookup; the table named as nn.Embedding's."""

    def __init__(self, vocab_size: int, embedding_size: int):
        super().__init__()
        self.embedding_table = Parameter(initializer(Normal(1.0), (vocab_size, embedding_size)),
                                         name="embedding_table")
        self.lookup = UnitLookup(vocab_size)

    def construct(self, ids):
        return self.lookup(self.embedding_table, ids)


class UnitEmbeddingAdd(nn.Cell):
    """The token and position embeddings added as functional.add adds, with no constraint (both are cut
    edges: only a table's gradient is behind each): output 2 ** -1/2, the tokens' gradient 1, the
    positions' (broadcast over the batch) batch ** -1/2."""

    def construct(self, tokens, positions):
        return (tokens + positions) * (2 ** -0.5)

    def bprop(self, tokens, positions, out, dout):
        return dout, dout.sum(0) * (dout.shape[0] ** -0.5)


class UnitReadout(nn.Cell):
    """TransformerDecoder.forward's logits: U.linear(x, embedding.weight, bias=None, constraint=None), the
    output projection tied to the token table: output d_model ** -1/2, input gradient vocab ** -1/2, the
    table's batch ** -1/2 (adding to the lookup's); then cross_entropy's gradient (UnitCrossEntropyGrad)."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        output, grad_input = linear_scales(d_model, vocab_size, None)
        self.projection = _ScaledProjection(d_model, vocab_size, output, grad_input)
        self.loss_grad = UnitCrossEntropyGrad(vocab_size)

    def construct(self, x, table):
        return self.loss_grad(self.projection(x, table))
