"""Unit scaling (Blake, Orr and Luschi 2023, "Unit Scaling: Out-of-the-Box Low-Precision Training", ICML
2023, arXiv 2303.11257), transcribed op for op in numpy from the authors' library.

Source: github.com/graphcore-research/unit-scaling at commit a5b595ce6e56a736cd800e612a684045acfbec75
(2024-06-27, "Merge pull request #56 from graphcore-research/stochastic-rounding-num-bits"). Why that
commit: it is the parent of dfefb0dd6dc6a247163f48a35d9a6102e91b98a6 (2024-07-16, "Change the default
constraint from gmean -> to_output_scale"), the first commit of the umup-updates branch (merged in
087133f, 2024-07-24) that turned the library into u-muP's (arXiv 2407.17465): after it come the 'mult'
arguments of the nonlinearities, RMSNorm, the u-muP optimizers, MHSA on U.scaled_dot_product_attention,
the new residual scheme and linear_readout. The three main-line commits between the pin and that merge
(9291aef, 67beed9/f4402e6, merged as ebdbebc and 0a6c9af, 2024-07-16) touch only the version string and
transforms/utils.py: functional.py, scale.py, constraints.py and _modules.py are byte-identical at
0a6c9af811eeb89ad2026b7bac04d2a3f0cccc24. Also: the weight-gradient scale 0.75 of d06fee4 (2023-07-11)
was reverted in 299e560 (2024-04-15), before the pin, so weight gradients are scaled by
batch_size**-0.5 here.

Every path below is in that repository at that commit. The library is PyTorch; its two primitives are in
unit_scaling/scale.py: ``scale_fwd(x, s)`` multiplies by ``s`` going forward and leaves the gradient as it
is; ``scale_bwd(x, s)`` is the identity going forward and multiplies the gradient by ``s`` coming back
(both ``_ScaledGrad``, ``forward`` returns ``fwd_scale * X``, ``backward`` ``bwd_scale * grad_Y``). An op
``scale_bwd``s its inputs, applies the plain torch op, and ``scale_fwd``s the output, so the gradient that
reaches the plain op is the caller's ``grad_output`` unscaled. Each ``*_backward`` below returns exactly
the gradients the library's autograd would, for a given ``grad_output``.

Constraints (unit_scaling/constraints.py, ``apply_constraint``): ``None`` or "" leaves the scales as
computed; any other name is a function of that module applied to all the op's constrained scales
(output scale first, then the input-gradient scales), whose single result replaces every one of them.
"gmean" (geometric mean) is every constrained op's default at this commit; "to_output_scale" (the
u-muP default from dfefb0d on) takes the output scale for all. Weight and bias gradient scales are never
constrained. The constraint exists because an op whose input is not a "cut edge" of the graph must scale
forward and backward alike or its gradients are no longer those of any function (the library's
docs/user_guide.rst, "Constraints"); at the network's ends (the loss; the tied output projection) the
library uses no constraint.

"batch size" in a factor means the product of every leading dimension, i.e. how many rows are summed into
the weight gradient: ``input.numel() // fan_in`` for linear, ``input.numel() / prod(normalized_shape)``
for layer_norm, ``prod(indices.shape)`` for embedding, ``input.shape[0]`` for cross_entropy (which only
takes 1-D or 2-D input). matmul is the exception: its factors use ``left.shape[-2]`` and
``right.shape[-1]`` only, whatever the leading (batch) dimensions.

Initialisation (unit_scaling/_modules.py): ``Linear.reset_parameters`` draws the weight from N(0, 1) and
zeroes the bias; ``Embedding`` keeps torch.nn.Embedding's own N(0, 1); ``LayerNorm`` keeps
torch.nn.LayerNorm's weight 1 and bias 0. docs/user_guide.rst ("Linear layers"): expect weights to start
at scale 1; other initialisations should not be used with unit scaling. See :func:`unit_init`.

Where the lsexp models (src/lsexp/models) need what the library lacks, the factors are derived as the
paper does (scale = 1 / the standard deviation of the output, and of each input gradient, for
unit-normal inputs and a unit-normal incoming gradient) and the docstring says "derived, not in the
library":

- ReLU (mlp.py, lenet5.py, resnet.py, and mindspore.nn.TransformerEncoderLayer's default activation in
  transformer_encoder.py): :func:`relu`.
- causal self-attention (gpt.py; transformer_encoder.py with task=lm): the library's
  ``scaled_dot_product_attention`` passes ``is_causal`` through but its factor assumes every query sees
  every key; :func:`causal_attention_scale` derives the causal factor.

Present in the library, so transcribed: the GPT's tied output projection (``TransformerDecoder.forward``
calls ``U.linear(input, self.embedding.weight, bias=None, constraint=None)``: :func:`tied_output_projection`),
its final LayerNorm (``TransformerDecoder.final_layer_norm``, a ``LayerNorm``), GELU, and the add of the
token and position embeddings (``U.add``: :func:`add`; the library's decoder has no position embedding).
Not covered: convolutions, pooling and BatchNorm (lenet5.py, resnet.py; the library had no convolution
until conv1d in 2024-08) and dropout (lsexp's transformers default to dropout 0.0).
"""

import math

import numpy as np

REPOSITORY = "github.com/graphcore-research/unit-scaling"
COMMIT = "a5b595ce6e56a736cd800e612a684045acfbec75"
# dfefb0d, the first u-muP commit; 0a6c9af, the last main-line commit before u-muP was merged, with the
# same op definitions as COMMIT.
FIRST_UMUP_COMMIT = "dfefb0dd6dc6a247163f48a35d9a6102e91b98a6"
SAME_OPS_AS = "0a6c9af811eeb89ad2026b7bac04d2a3f0cccc24"

# The default `constraint` of linear, matmul, gelu, softmax, add and the modules built on them
# (unit_scaling/functional.py, unit_scaling/_modules.py) at COMMIT.
DEFAULT_CONSTRAINT = "gmean"
# residual_split/residual_add default tau; TransformerLayer's mhsa_tau and mlp_tau (_modules.py)
DEFAULT_TAU = 0.5
MHSA_TAU = 0.01
MLP_TAU = 0.5
# F.layer_norm's eps, the default of unit_scaling.functional.layer_norm
LAYER_NORM_EPS = 1e-5
# functional.gelu: "Scale factors determined empirically, assuming unit scaled input & grad"
GELU_OUTPUT_STD = 0.588
GELU_GRAD_STD = 0.675
# functional.softmax: "Scale factors determined empirically, assuming unit-scaled & large dim_size";
# output_scale = dim_size / 1.31, grad_input_scale = dim_size / 1.65
SOFTMAX_OUTPUT_STD_TIMES_N = 1.31
SOFTMAX_GRAD_STD_TIMES_N = 1.65

LEARNING_RATE_RULES = """\
What could be established about learning rates for unit-scaled models, and from where.

1. The paper (arXiv 2303.11257): its text on optimisers was NOT retrieved in this environment (the stored
   copies of the paper are served from their beginning only: abstract and introduction), so no section
   number is cited here and none should be taken from this file. The abstract says only that unit
   scaling is demonstrated "across a range of models and optimisers".
2. The library at COMMIT has no optimiser code and its docs no learning-rate rule (docs/user_guide.rst
   covers init, residuals, constraints and kernel fusion); u-muP's unit_scaling/optim.py (Adam: LR times
   fan_in**-0.5 for weights; SGD: its own rules) arrived in a9825ef, after the pin, and is u-muP's, not
   the unit-scaling paper's.
3. The paper's own experiment code, github.com/graphcore-research/unit-scaling-demo
   (main at 9d9daed4cab72496750e29bc483da04dfb15b27d; branch 2023-01-paper at
   0fc107bb17cedd83358aa211892e6607e41e962e):
   - scmm/training.py, _get_optimiser: for Adam, "Adam updates are invariant to fixed gradient scale"
     (so a constant per-tensor gradient scale, loss scale or unit-scaling factor, does not change the
     update); for both AdamW and SGD with momentum, a unit-scaled run sets scale_vector_learning_rate,
     and scmm/layers.py (SgdM._update, AdamW._update) then divides the learning rate of every 1-D
     parameter (biases, norm gains) by sqrt(its length). 2-D weights keep the global learning rate.
   - The learning rate is otherwise swept, not derived: run_sweep.py starts AdamW at 2**-14 for the
     baseline and 2**-8 for unit scaling; character_lm/CharLM-sweep.ipynb (2023-01-paper) records the
     swept optima (log2, 10th percentile / median / 90th percentile): baseline AdamW -12/-10/-8, baseline
     SGDM -8/-4/-4, unit-scaled AdamW -8/-6/-4, unit-scaled SGDM -14/-12/-10. So unit scaling moved the
     best Adam learning rate up about 16x and the best SGD learning rate down about 256x.
4. Derived here (not the paper's text): because Adam ignores a constant gradient scale, what matters to
   it is the weights' own scale. A unit-scaled linear y = s * x @ W.T with W ~ N(0, 1) computes what a
   standard one computes with W_std = s * W, so an Adam step of size eta on W is a step of s * eta on
   W_std: to match a standard model's Adam learning rate eta_std, eta = eta_std / s, i.e.
   eta_std * sqrt(fan_in) with s = fan_in**-0.5 (constraint None or to_output_scale), or
   eta_std * (fan_in * fan_out)**0.25 with the default gmean. For SGD the unit-scaled gradient is
   the true gradient times every backward factor on its path, so no single rule maps the two; retune.
"""


def _prod(shape) -> int:
    return int(math.prod(shape))


# --- unit_scaling/constraints.py --------------------------------------------------------------------


def gmean(*scales: float) -> float:
    """constraints.gmean: ``pow(prod(scales), 1 / len(scales))``."""
    return math.pow(math.prod(scales), 1 / len(scales))


def hmean(*scales: float) -> float:
    """constraints.hmean: ``1 / (sum(1 / s for s in scales) / len(scales))``."""
    return 1 / (sum(1 / s for s in scales) / len(scales))


def amean(*scales: float) -> float:
    """constraints.amean: ``sum(scales) / len(scales)``."""
    return sum(scales) / len(scales)


def to_output_scale(output_scale: float, *grad_input_scale: float) -> float:
    """constraints.to_output_scale: the output scale, for every constrained scale."""
    return output_scale


def to_grad_input_scale(output_scale: float, grad_input_scale: float) -> float:
    """constraints.to_grad_input_scale (binary ops only): the input-gradient scale."""
    return grad_input_scale


def to_left_grad_scale(output_scale: float, left_grad_scale: float, right_grad_scale: float) -> float:
    """constraints.to_left_grad_scale (ternary ops only)."""
    return left_grad_scale


def to_right_grad_scale(output_scale: float, left_grad_scale: float, right_grad_scale: float) -> float:
    """constraints.to_right_grad_scale (ternary ops only)."""
    return right_grad_scale


CONSTRAINTS = {f.__name__: f for f in (gmean, hmean, amean, to_output_scale, to_grad_input_scale,
                                        to_left_grad_scale, to_right_grad_scale)}


def apply_constraint(constraint_name, *scales: float) -> tuple:
    """constraints.apply_constraint: ``None`` or "" returns the scales unchanged; otherwise the named
    constraint's one value replaces each of them; an unknown name raises ValueError."""
    if constraint_name is None or constraint_name == "":
        return scales
    constraint = CONSTRAINTS.get(constraint_name)
    if constraint is None:
        raise ValueError(f"Constraint: {constraint_name} is not a valid constraint")
    scale = constraint(*scales)
    return tuple(scale for _ in scales)


# --- initialisation ---------------------------------------------------------------------------------


def unit_init(shape, rng: np.random.Generator) -> np.ndarray:
    """A weight as the library's modules initialise it: N(0, 1), unscaled.

    _modules.py, ``Linear.reset_parameters``: ``nn.init.normal_(self.weight)`` (mean 0, std 1), bias
    ``zero_()``; ``Embedding`` inherits torch.nn.Embedding's ``reset_parameters``, also ``normal_`` with
    mean 0 and std 1 (and the padding_idx row zeroed). The scale lives in the ops, not the weights."""
    return rng.standard_normal(shape)


def unit_init_bias(fan_out: int) -> np.ndarray:
    """``Linear.reset_parameters``: ``self.bias.data.zero_()``."""
    return np.zeros(fan_out)


def layer_norm_init(normalized_shape) -> tuple:
    """``LayerNorm`` keeps torch.nn.LayerNorm's initialisation: weight ones, bias zeros."""
    return np.ones(normalized_shape), np.zeros(normalized_shape)


# --- element-wise ops -------------------------------------------------------------------------------


def scale_elementwise_scales(output_scale: float, grad_input_scale: float,
                             constraint=DEFAULT_CONSTRAINT) -> tuple:
    """functional.scale_elementwise: the (output, grad-input) scales after the constraint."""
    return apply_constraint(constraint, output_scale, grad_input_scale)


_erf = np.frompyfunc(math.erf, 1, 1)


def _phi_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)).astype(np.float64))


def gelu_scales(constraint=DEFAULT_CONSTRAINT) -> tuple:
    """functional.gelu: output_scale = 0.588**-1, grad_input_scale = 0.675**-1 (empirical standard
    deviations of gelu(x) and of g * gelu'(x) for unit-normal x and g), then the constraint; default
    gmean, which gives both (0.588 * 0.675)**-0.5 = 1 / 0.63."""
    return scale_elementwise_scales(GELU_OUTPUT_STD ** -1, GELU_GRAD_STD ** -1, constraint)


def gelu(x: np.ndarray, constraint=DEFAULT_CONSTRAINT) -> np.ndarray:
    """unit_scaling/functional.py, ``gelu`` (``approximate="none"``, the exact erf GELU; the library
    refuses any other ``approximate``): ``output_scale * x * Phi(x)``."""
    output_scale, _ = gelu_scales(constraint)
    return output_scale * x * _phi_cdf(x)


def gelu_backward(x: np.ndarray, grad_output: np.ndarray, constraint=DEFAULT_CONSTRAINT) -> dict:
    """The input gradient of :func:`gelu`: ``grad_input_scale * g * (Phi(x) + x * phi(x))``."""
    _, grad_input_scale = gelu_scales(constraint)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return {"input": grad_input_scale * grad_output * (_phi_cdf(x) + x * pdf)}


RELU_OUTPUT_STD = math.sqrt((1 - 1 / math.pi) / 2)
RELU_GRAD_STD = math.sqrt(0.5)


def relu_scales(constraint=DEFAULT_CONSTRAINT) -> tuple:
    """Derived, not in the library (no relu in functional.py at COMMIT).

    The paper's method, with x and g unit normal and independent:
    output: E[relu(x)] = 1/sqrt(2 pi), E[relu(x)**2] = 1/2, so std = sqrt(1/2 - 1/(2 pi))
    = sqrt((1 - 1/pi) / 2) = 0.5838, output_scale = sqrt(2 / (1 - 1/pi)) = 1.7129.
    grad input: g * 1[x > 0] has mean 0 and E[(g 1[x>0])**2] = 1/2, std = sqrt(1/2), grad_input_scale
    = sqrt(2).
    Constrained as the library's other element-wise ops (scale_elementwise, default gmean): both
    (2 sqrt(2) / sqrt(1 - 1/pi))**0.5 = (4 pi / (pi - 1))**0.25 = 1.5564."""
    return scale_elementwise_scales(1 / RELU_OUTPUT_STD, 1 / RELU_GRAD_STD, constraint)


def relu(x: np.ndarray, constraint=DEFAULT_CONSTRAINT) -> np.ndarray:
    """Derived, not in the library: ``output_scale * max(x, 0)`` (see :func:`relu_scales`)."""
    output_scale, _ = relu_scales(constraint)
    return output_scale * np.maximum(x, 0.0)


def relu_backward(x: np.ndarray, grad_output: np.ndarray, constraint=DEFAULT_CONSTRAINT) -> dict:
    """Derived, not in the library: ``grad_input_scale * g * 1[x > 0]``."""
    _, grad_input_scale = relu_scales(constraint)
    return {"input": grad_input_scale * grad_output * (x > 0)}


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_scales(dim_size: int, constraint=DEFAULT_CONSTRAINT) -> tuple:
    """functional.softmax: output_scale = dim_size / 1.31, grad_input_scale = dim_size / 1.65 (empirical,
    for unit-normal input and large dim_size), then the constraint; default gmean:
    dim_size / sqrt(1.31 * 1.65)."""
    return scale_elementwise_scales(dim_size / SOFTMAX_OUTPUT_STD_TIMES_N,
                                    dim_size / SOFTMAX_GRAD_STD_TIMES_N, constraint)


def softmax(x: np.ndarray, axis: int = -1, constraint=DEFAULT_CONSTRAINT) -> np.ndarray:
    """unit_scaling/functional.py, ``softmax``: ``output_scale * softmax(x, dim)``, dim_size =
    ``x.shape[dim]``."""
    output_scale, _ = softmax_scales(x.shape[axis], constraint)
    return output_scale * _softmax(x, axis)


def softmax_backward(x: np.ndarray, grad_output: np.ndarray, axis: int = -1,
                     constraint=DEFAULT_CONSTRAINT) -> dict:
    """``grad_input_scale * s * (g - sum(g * s, dim))`` with s the plain softmax."""
    _, grad_input_scale = softmax_scales(x.shape[axis], constraint)
    s = _softmax(x, axis)
    inner = np.sum(grad_output * s, axis=axis, keepdims=True)
    return {"input": grad_input_scale * s * (grad_output - inner)}


# --- linear, matmul, the tied output projection -----------------------------------------------------


def linear_scales(fan_in: int, fan_out: int, batch_size: int, constraint=DEFAULT_CONSTRAINT) -> dict:
    """functional.linear: output_scale = fan_in**-0.5, grad_input_scale = fan_out**-0.5, the two
    constrained (default gmean: both (fan_in * fan_out)**-0.25); grad_weight_scale = grad_bias_scale =
    batch_size**-0.5, never constrained, batch_size = input.numel() // fan_in (every leading dim)."""
    output, grad_input = apply_constraint(constraint, fan_in ** -0.5, fan_out ** -0.5)
    grad_weight = batch_size ** -0.5
    return {"output": output, "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_weight}


def _linear_setup(x, weight, constraint):
    fan_out, fan_in = weight.shape
    return fan_out, fan_in, linear_scales(fan_in, fan_out, x.size // fan_in, constraint)


def linear(x: np.ndarray, weight: np.ndarray, bias=None, constraint=DEFAULT_CONSTRAINT) -> np.ndarray:
    """unit_scaling/functional.py, ``linear``: ``output_scale * (x @ W.T + b)``, W of shape
    (fan_out, fan_in). The bias is added before the output scale (``scale_fwd(F.linear(...))``)."""
    _, _, s = _linear_setup(x, weight, constraint)
    y = x @ weight.T
    if bias is not None:
        y = y + bias
    return s["output"] * y


def linear_backward(x: np.ndarray, weight: np.ndarray, bias, grad_output: np.ndarray,
                    constraint=DEFAULT_CONSTRAINT) -> dict:
    """The gradients of :func:`linear` (the forward output scale does not touch them):
    input: ``grad_input_scale * g @ W``; weight: ``batch_size**-0.5 * g.T @ x`` over the flattened
    leading dims; bias: ``batch_size**-0.5 * g.sum(leading dims)``."""
    fan_out, fan_in, s = _linear_setup(x, weight, constraint)
    x2, g2 = x.reshape(-1, fan_in), grad_output.reshape(-1, fan_out)
    grads = {"input": s["grad_input"] * (grad_output @ weight), "weight": s["grad_weight"] * (g2.T @ x2)}
    if bias is not None:
        grads["bias"] = s["grad_bias"] * g2.sum(axis=0)
    return grads


def tied_output_projection(x: np.ndarray, embedding_table: np.ndarray) -> np.ndarray:
    """_modules.py, ``TransformerDecoder.forward``: the logits are
    ``U.linear(input, self.embedding.weight, bias=None, constraint=None)``, so output scale
    d_model**-0.5 (fan_in = d_model), grad-input scale vocab**-0.5 (fan_out = vocab), table-gradient
    scale (batch * length)**-0.5, none constrained (the loss follows: a cut edge). The table's gradient
    adds to the embedding lookup's (:func:`embedding_backward`)."""
    return linear(x, embedding_table, None, constraint=None)


def tied_output_projection_backward(x: np.ndarray, embedding_table: np.ndarray,
                                    grad_output: np.ndarray) -> dict:
    """Gradients of :func:`tied_output_projection`: {"input", "weight"} (weight = the table)."""
    return linear_backward(x, embedding_table, None, grad_output, constraint=None)


def matmul_scales(left_size: int, inner_size: int, right_size: int, constraint=DEFAULT_CONSTRAINT) -> tuple:
    """functional.matmul: output inner**-0.5, left grad right_size**-0.5, right grad left_size**-0.5,
    all three constrained (ternary; default gmean: (inner * right * left)**(-1/6)). left_size =
    left.shape[-2], right_size = right.shape[-1]: leading (batch) dims do not enter."""
    return apply_constraint(constraint, inner_size ** -0.5, right_size ** -0.5, left_size ** -0.5)


def matmul(left: np.ndarray, right: np.ndarray, constraint=DEFAULT_CONSTRAINT) -> np.ndarray:
    """unit_scaling/functional.py, ``matmul``: ``output_scale * left @ right``. (MHSA at COMMIT builds
    attention from matmul, softmax, dropout, matmul, all with its constraint, not from
    scaled_dot_product_attention.)"""
    output_scale, _, _ = matmul_scales(left.shape[-2], left.shape[-1], right.shape[-1], constraint)
    return output_scale * (left @ right)


def matmul_backward(left: np.ndarray, right: np.ndarray, grad_output: np.ndarray,
                    constraint=DEFAULT_CONSTRAINT) -> dict:
    """``left_grad_scale * g @ right^T`` and ``right_grad_scale * left^T @ g`` (equal leading dims)."""
    _, left_scale, right_scale = matmul_scales(left.shape[-2], left.shape[-1], right.shape[-1], constraint)
    return {"left": left_scale * (grad_output @ np.swapaxes(right, -1, -2)),
            "right": right_scale * (np.swapaxes(left, -1, -2) @ grad_output)}


# --- add, residuals --------------------------------------------------------------------------------


def _sum_to_shape(g: np.ndarray, shape) -> np.ndarray:
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def add_scales(input_shape, other_shape, constraint=DEFAULT_CONSTRAINT) -> tuple:
    """functional.add: (output, input grad, other grad) scales. Each grad scale is
    (broadcast size)**-0.5, broadcast size = output numel // that argument's numel; output 2**-0.5, or
    1 when either argument has one element; all three constrained (default gmean)."""
    out_numel = _prod(np.broadcast_shapes(tuple(input_shape), tuple(other_shape)))
    input_grad = (out_numel // _prod(input_shape)) ** -0.5
    other_grad = (out_numel // _prod(other_shape)) ** -0.5
    scalar_input = _prod(input_shape) == 1 or _prod(other_shape) == 1
    output = 2 ** -0.5 if not scalar_input else 1.0
    return apply_constraint(constraint, output, input_grad, other_grad)


def add(a, b, constraint=DEFAULT_CONSTRAINT):
    """unit_scaling/functional.py, ``add``: a Python number on either side is a plain add; otherwise
    ``output_scale * (a + b)``. (The token + position embeddings of lsexp's models.)"""
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        return a + b
    output_scale, _, _ = add_scales(np.shape(a), np.shape(b), constraint)
    return output_scale * (a + b)


def add_backward(a: np.ndarray, b: np.ndarray, grad_output: np.ndarray,
                 constraint=DEFAULT_CONSTRAINT) -> dict:
    """Each argument's gradient: the incoming gradient summed over its broadcast dims, times its scale."""
    _, a_scale, b_scale = add_scales(a.shape, b.shape, constraint)
    return {"input": a_scale * _sum_to_shape(grad_output, a.shape),
            "other": b_scale * _sum_to_shape(grad_output, b.shape)}


def residual_split(x: np.ndarray, tau: float = DEFAULT_TAU) -> tuple:
    """unit_scaling/functional.py, ``residual_split``: (residual, skip) =
    (``scale_bwd(x, tau**0.5)``, ``scale_bwd(x, (1 - tau)**0.5)``): both are x going forward."""
    return x, x


def residual_split_backward(grad_residual: np.ndarray, grad_skip: np.ndarray,
                            tau: float = DEFAULT_TAU) -> dict:
    """x's gradient: ``tau**0.5 * g_residual + (1 - tau)**0.5 * g_skip``."""
    return {"input": tau ** 0.5 * grad_residual + (1 - tau) ** 0.5 * grad_skip}


def residual_add(residual: np.ndarray, skip: np.ndarray, tau: float = DEFAULT_TAU) -> np.ndarray:
    """unit_scaling/functional.py, ``residual_add``: ``tau**0.5 * residual + (1 - tau)**0.5 * skip``
    (``scale_fwd``: the gradients pass through unscaled; the backward weighting is residual_split's).
    tau is the residual branch's weight relative to the skip; default 0.5, TransformerLayer's mhsa_tau
    0.01 and mlp_tau 0.5."""
    return tau ** 0.5 * residual + (1 - tau) ** 0.5 * skip


def residual_add_backward(grad_output: np.ndarray, tau: float = DEFAULT_TAU) -> dict:
    """Both gradients are the incoming gradient itself."""
    return {"residual": grad_output, "skip": grad_output}


# --- layer norm, embedding ---------------------------------------------------------------------------


def layer_norm_scales(input_shape, normalized_shape) -> dict:
    """functional.layer_norm: no forward or input-gradient scale; weight and bias gradients scaled by
    ``(prod(normalized_shape) / input.numel())**0.5`` = batch_size**-0.5 (batch = leading dims)."""
    grad = (_prod(normalized_shape) / _prod(input_shape)) ** 0.5
    return {"output": 1.0, "grad_input": 1.0, "grad_weight": grad, "grad_bias": grad}


def _layer_norm_stats(x, normalized_shape, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return axes, (x - mean) * rstd, rstd


def layer_norm(x: np.ndarray, normalized_shape, weight=None, bias=None,
               eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """unit_scaling/functional.py, ``layer_norm``: F.layer_norm unchanged going forward (biased variance,
    eps inside the square root)."""
    _, xhat, _ = _layer_norm_stats(x, tuple(normalized_shape), eps)
    y = xhat if weight is None else xhat * weight
    return y if bias is None else y + bias


def layer_norm_backward(x: np.ndarray, normalized_shape, weight, bias, grad_output: np.ndarray,
                        eps: float = LAYER_NORM_EPS) -> dict:
    """F.layer_norm's input gradient, unscaled; weight and bias gradients times batch_size**-0.5."""
    normalized_shape = tuple(normalized_shape)
    axes, xhat, rstd = _layer_norm_stats(x, normalized_shape, eps)
    s = layer_norm_scales(x.shape, normalized_shape)
    gh = grad_output if weight is None else grad_output * weight
    dx = rstd * (gh - gh.mean(axis=axes, keepdims=True) - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    grads = {"input": dx}
    if weight is not None:
        grads["weight"] = s["grad_weight"] * (grad_output * xhat).sum(axis=lead)
    if bias is not None:
        grads["bias"] = s["grad_bias"] * grad_output.sum(axis=lead)
    return grads


def embedding(indices: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """unit_scaling/functional.py, ``embedding``: the plain lookup ``weight[indices]`` (no forward scale;
    the table is N(0, 1), so the output already is unit)."""
    return weight[indices]


def embedding_backward(indices: np.ndarray, weight: np.ndarray, grad_output: np.ndarray,
                       padding_idx=None) -> dict:
    """The table's gradient: rows scatter-added, times ``(num_embeddings / batch_size)**0.5`` with
    batch_size = ``prod(indices.shape)`` (every looked-up index). No input gradient (indices). F.embedding's
    padding_idx row gets no gradient."""
    num_embeddings, dim = weight.shape
    grad = np.zeros_like(weight, dtype=np.float64)
    np.add.at(grad, indices.reshape(-1), grad_output.reshape(-1, dim))
    if padding_idx is not None:
        grad[padding_idx] = 0.0
    return {"weight": (num_embeddings / _prod(indices.shape)) ** 0.5 * grad}


# --- cross entropy -----------------------------------------------------------------------------------


def _cross_entropy_shape(logits: np.ndarray) -> tuple:
    if logits.ndim == 2:
        return logits.shape
    if logits.ndim == 1:
        return 1, logits.shape[0]
    raise ValueError(f"cross_entropy input shape is {logits.shape}, but should be either (vocab_size,) or "
                     "(batch_size, vocab_size)")


def cross_entropy_scales(batch_size: int, vocab_size: int, reduction: str = "mean") -> dict:
    """functional.cross_entropy: the logits' gradient times ``vocab_size / (vocab_size - 1)**0.5``
    (operator precedence as written: vocab / sqrt(vocab - 1)); the loss is computed with
    reduction="sum" and, for "mean" only, times 1 / batch_size going forward (``scale_fwd``): the
    gradient is not divided by the batch. No constraint (the loss is the graph's end)."""
    return {"output": 1 / batch_size if reduction == "mean" else 1.0,
            "grad_input": vocab_size / (vocab_size - 1) ** 0.5}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def softmax_cross_entropy(logits: np.ndarray, target, ignore_index: int = -100,
                          reduction: str = "mean") -> float:
    """unit_scaling/functional.py, ``cross_entropy`` (default reduction "mean", ignore_index -100):
    ``sum_i -log softmax(logits_i)[target_i]`` over the rows whose target is not ignore_index, then
    1 / batch_size for "mean" (batch_size counts ignored rows too, unlike torch's own mean). Any other
    reduction, "none" included, returns the sum: the library always calls F.cross_entropy with
    reduction="sum". Its value equals torch's mean when nothing is ignored."""
    batch_size, vocab_size = _cross_entropy_shape(logits)
    x = logits.reshape(batch_size, vocab_size)
    t = np.asarray(target).reshape(batch_size)
    keep = t != ignore_index
    picked = _log_softmax(x)[np.arange(batch_size), np.where(keep, t, 0)]
    loss = float(-(picked * keep).sum())
    return cross_entropy_scales(batch_size, vocab_size, reduction)["output"] * loss


def softmax_cross_entropy_backward(logits: np.ndarray, target, grad_output: float = 1.0,
                                   ignore_index: int = -100, reduction: str = "mean") -> dict:
    """The logits' gradient: ``grad_output * (softmax(logits) - onehot(target)) * vocab / sqrt(vocab - 1)``,
    zero on ignored rows, the same for every reduction (the mean's 1 / batch_size is forward-only)."""
    batch_size, vocab_size = _cross_entropy_shape(logits)
    x = logits.reshape(batch_size, vocab_size)
    t = np.asarray(target).reshape(batch_size)
    keep = t != ignore_index
    grad = _softmax(x, -1)
    grad[np.arange(batch_size), np.where(keep, t, 0)] -= 1.0
    grad *= keep[:, None]
    scale = cross_entropy_scales(batch_size, vocab_size, reduction)["grad_input"]
    return {"input": (grad_output * scale * grad).reshape(logits.shape)}


# --- attention ---------------------------------------------------------------------------------------


def attention_scale(seq_len: int, dropout_p: float = 0.0) -> float:
    """functional.scaled_dot_product_attention: one factor ``(s / e * (1 - dropout_p))**0.5`` with
    s = ``value.shape[-2]``, applied with scale_bwd to q, k and v and with scale_fwd to the output
    ("softmax outputs follow a LogNormal distribution that is normalised in expectation": for unit-normal
    logits the plain output's variance is sum_j p_j**2 ~ e / s). No constraint: "forward and backward
    scaling of attention are the same". The same factor whether or not is_causal is set."""
    return (seq_len / math.e * (1 - dropout_p)) ** 0.5


def causal_attention_scale(seq_len: int) -> float:
    """Derived, not in the library: the factor for causal attention (query i sees keys 0..i).

    For a row of k unit-normal logits, p = n / d with n = e**z (mean e**0.5, variance e(e - 1)) and
    d = sum of k such; E[p] = 1/k exactly and, to first order in the ratio's Taylor expansion,
    Var[p] = (e - 1)/k**2 - (e - 1)/k**3, so sum_j E[p_j**2] = e/k - (e - 1)/k**2 (exactly 1 at k = 1,
    and e/k for large k, the library's approximation). A unit-normal v gives the row output that variance.
    Causal rows have k = 1..s, so the output's variance averaged over the tensor is
    (e H_s - (e - 1) H2_s) / s, with H_s = sum 1/k and H2_s = sum 1/k**2; the grad of v averages the
    same (column j collects rows i >= j: sum over j of sum_{i>=j} E[p_ij**2] is the same double sum).
    Factor = (s / (e H_s - (e - 1) H2_s))**0.5, used like the library's (on q, k, v grads and the
    output). Per row the variance still falls with the position; one factor can only fix the average."""
    h1 = sum(1.0 / k for k in range(1, seq_len + 1))
    h2 = sum(1.0 / k ** 2 for k in range(1, seq_len + 1))
    return (seq_len / (math.e * h1 - (math.e - 1) * h2)) ** 0.5


def _attention_probs(q, k, is_causal):
    d = q.shape[-1]
    logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    if is_causal:
        # torch's is_causal: tril(ones(L, S)), query i attends to keys j <= i
        allowed = np.tril(np.ones(logits.shape[-2:], dtype=bool))
        logits = np.where(allowed, logits, -np.inf)
    return _softmax(logits, -1)


def _check_dropout(dropout_p: float) -> None:
    if dropout_p != 0.0:
        raise ValueError("dropout is not simulated here; dropout_p enters only attention_scale")


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, is_causal: bool = False,
                                 dropout_p: float = 0.0, scale_factor=None) -> np.ndarray:
    """unit_scaling/functional.py, ``scaled_dot_product_attention``: ``f * softmax(q k^T / sqrt(d)) v``,
    f = :func:`attention_scale` (or ``scale_factor``, e.g. :func:`causal_attention_scale`, which the
    library does not have). F.scaled_dot_product_attention's own 1/sqrt(d) is kept."""
    _check_dropout(dropout_p)
    f = attention_scale(v.shape[-2], dropout_p) if scale_factor is None else scale_factor
    return f * (_attention_probs(q, k, is_causal) @ v)


def scaled_dot_product_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                          grad_output: np.ndarray, is_causal: bool = False,
                                          scale_factor=None) -> dict:
    """The plain attention's q, k, v gradients for the unscaled incoming gradient, each times f
    (dropout_p 0, the only value simulated here)."""
    f = attention_scale(v.shape[-2]) if scale_factor is None else scale_factor
    d = q.shape[-1]
    p = _attention_probs(q, k, is_causal)
    grad_v = np.swapaxes(p, -1, -2) @ grad_output
    grad_p = grad_output @ np.swapaxes(v, -1, -2)
    grad_logits = p * (grad_p - (grad_p * p).sum(axis=-1, keepdims=True))
    grad_q = grad_logits @ k / math.sqrt(d)
    grad_k = np.swapaxes(grad_logits, -1, -2) @ q / math.sqrt(d)
    return {"query": f * grad_q, "key": f * grad_k, "value": f * grad_v}
