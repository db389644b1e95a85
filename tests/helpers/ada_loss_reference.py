"""The reference for per-layer adaptive loss scaling (Zhao et al. 2019, "Adaptive Loss Scaling for Mixed
Precision Training", arXiv 1910.12385; IJCAI-20 "Reducing Underflow in Mixed Precision Training by
Gradient Scaling"), transcribed step for step in numpy from its only implementation.

Source: github.com/kumasento/gradient-scaling (Chainer) at commit 0ca435433b9953e33656173c4d60ebd61c5c5e87
(2021-10-07, "Update README.md"). Its environment.yml pins chainer 7.8.0, numpy 1.20.3, scipy 1.7.1 and
cupy 7.7.0 (GPU). The two core files were renamed in b0c6fbc (2021-10-04): ada_loss/ada_loss.py is now
ada_loss/core.py and ada_loss/chainer_impl/ada_loss.py is now ada_loss/chainer_impl/ada_loss_chainer.py;
their rule is the same as at 911ef2d ("Final version", 2020-01-21), apart from formatting, the empty-array
early return of get_mean_and_std and o_mu now being returned by get_mean_and_std_of_product.

What is transcribed, and from where (every path is in that repository):

- module constants ``U_MIN`` ... ``UPDATE_PER_N_ITERATION`` and :class:`AdaLossConfig`:
  ada_loss/core.py, ``AdaLoss.__init__``, ``AdaLoss.get_range``, ``AdaLoss.get_u_min``,
  ``AdaLoss.get_u_max``.
- :func:`get_fan_in`: ada_loss/chainer_impl/ada_loss_chainer.py, ``AdaLossChainer.get_fan_in``.
- :func:`get_mean_and_std`, :func:`get_mean_and_std_of_product`: same file,
  ``AdaLossChainer.get_mean_and_std`` and ``AdaLossChainer.get_mean_and_std_of_product``.
- :func:`get_loss_scale_by_approx_range`: same file, ``AdaLossChainer.get_loss_scale_by_approx_range``
  (the default ``loss_scale_method``, "approx_range").
- :func:`get_matrices_to_be_multiplied`, :func:`get_element_wise_multiply`,
  :func:`get_loss_scale_by_element_wise_range`: same file, the methods of those names (the
  "element_wise_range" method; transcribed only because the reference's test of ``power_of_two`` uses it).
- :func:`check_scale`: same file, ``AdaLossChainer.check_scale``.
- :func:`bound_loss_scale_by_heuristics`: same file, ``AdaLossChainer.bound_loss_scale_by_heuristics``.
- :func:`get_power_of_two_scale`: ada_loss/core.py, ``AdaLoss.get_power_of_two_scale``.
- :func:`get_loss_scale`: ada_loss/core.py, ``AdaLoss.get_loss_scale`` with
  ``AdaLoss.get_unbound_loss_scale`` (the order: unbound scale, then the bounds, then power-of-two
  rounding, then the cast to the scale dtype).
- :func:`get_scaled_gradient` (and :func:`compose_scale`, its scale part): same file as the Chainer class,
  ``AdaLossChainer.get_scaled_gradient``: the gradient is multiplied by the layer's scale and the scale it
  then carries is ``scale * prev_scale``.
- :func:`rescaling` and :func:`combine_branch_gradients`: ada_loss/chainer_impl/ada_loss_chainer.py,
  ``AdaLossChainer.rescaling``, and ada_loss/chainer_impl/functions/ada_loss_branch.py,
  ``AdaLossBranch.backward``.
- :func:`compose_layer_scales`: the backward pass of a chain of AdaLoss layers, as
  ``AdaLoss.loss_scaling`` (ada_loss/core.py) composes them in
  ada_loss/chainer_impl/functions/ada_loss_linear.py (``AdaLossLinearFunction.backward``) and
  ada_loss/chainer_impl/functions/ada_loss_convolution_2d.py (``AdaLossConvolution2DFunction.backward``),
  starting from ``scale_grad`` (ada_loss/chainer_impl/utils.py) called by ``LossScaling.backward``
  (ada_loss/chainer_impl/functions/loss_scaling.py) with ``AdaLossScaled``'s ``init_scale``
  (ada_loss/chainer_impl/ada_loss_scaled.py).

The rule (approx_range). For a layer with weight W whose incoming gradient g already carries the scale
``prev_scale`` (the product of the initial scale and the scales of the layers after it):
``o_sigma = sqrt((std(g)^2 + mean(g)^2) * (std(W)^2 + mean(W)^2)) * sqrt(0.5 * fan_in)`` (the
``- mean(g)^2 mean(W)^2`` term of the product variance is commented out in the reference; the
``sqrt(0.5 * fan_in)`` is "assuming the existence of ReLU"), ``fan_in = W.shape[0]`` for a 2-D (Linear,
out x in) weight and ``W.shape[0] * W.shape[2] * W.shape[3]`` for a 4-D (convolution) weight, i.e. the
length of the sums in g @ W. Then ``scale = max(u_min / (n_uf_threshold * o_sigma), 1)`` with
``n_uf_threshold = sqrt(2) * erfinv(n_uf)`` (so that a fraction n_uf of the zero-mean normal products
|g W| stay below u_min), capped against overflow by ``u_max / fan_in / o_max`` with ``o_max`` the largest
|product| of the extremes of g and W. The bounds: ``min(accum_upper_bound / prev_scale, scale)``, then
``min(scale_upper_bound, scale)``; then ``2 ** floor(log2(scale))``; then the cast to float16. The scale
of the outgoing gradient gx = (g * scale) @ W is ``scale * prev_scale``, a float16 product. A gradient
with std 0 (all zeros, or a zero weight) gets scale 1. Weight and bias gradients are computed from the
gradient before this layer's scale and divided by ``prev_scale`` (``get_unscaled_gradient``); batch
normalisation, activations (``IdentityLossScalingWrapper``) and an add pass the scale through unchanged.

The branch rule. Where one activation feeds two paths (a residual block's fork, a picked output), the
reference inserts ``AdaLossBranch``, whose backward, in the default "approx_range" method, brings every
incoming gradient to one common scale: the LARGEST of their scales whose product with the largest unscaled
|gradient| (max|g| / scale over the branches) stays below u_max; if none does, the smallest scale halved
until it does or until it falls below 1/8; it raises ValueError if even that target overflows. Each
gradient is multiplied by target / its scale and the gradients are summed. So with no overflow risk the
smaller-scale branch is scaled UP to the larger scale (not the other way round). With any other
``loss_scale_method`` (e.g. "fixed") there is no rescaling: the gradients are summed as they are and the
sum is given the scale of the first gradient (the first output of the branch: the main path in the ResNet
blocks, ada_loss/chainer_impl/links/ada_loss_resnet.py). The residual add itself (``h + r``, chainer's
``Add``, whose backward hands the same gradient variable to both inputs) does nothing to the scale.

Precision. The reference computes on CPU with numpy 1.20 (on GPU, cupy: the statistics' reductions then
run in a different order, not transcribed). Statistics: the arrays cast to float32 (``full_dtype``), numpy
``ndarray.mean()`` and ``ndarray.std()`` (ddof=0, float32 accumulation; Chainer's ``Variable.array`` on
CPU is a numpy array, so this is exactly numpy's std with ddof=0). Several intermediate steps are float64
because of numpy 1.x's promotion of numpy scalars against Python numbers (``np.float32(x) ** 2`` and
``np.float32(x) / 3.0`` are float64 there; float32 under numpy 2's NEP 50). Those promotions are written
out explicitly below so the result is the same under numpy 1 and numpy 2; each is marked "numpy 1.x".
``get_power_of_two_scale`` takes log2 of the float32 scale in float32, as the reference does.

Checked: every function above was compared with the reference's own methods (core.py and
ada_loss_chainer.py run under numpy 1.26 with a stub for the three chainer names they use, and scipy's
erfinv replaced by the 1.7 formula) on some 20,000 random cases, float16/float32/float64 gradients, 2-D
and 4-D weights, eight configurations: results equal bit for bit, dtypes and raised errors included.

Interpretations (places where the reference leaves a choice or depends on something not transcribed):

- erfinv: the reference calls scipy.special.erfinv from scipy 1.7.1, whose cephes erfinv is
  ``ndtri(0.5 * (y + 1)) * sqrt(1/2)`` (for 1e-7 <= |y| < 1); modern scipy (Boost) differs from it by about
  1.1e-13 relative at 1e-3. The default's value is the constant ``N_UF_THRESHOLD_VALUE`` below, computed
  with that formula; another ``n_uf_threshold`` imports scipy.special.ndtri and uses the same formula.
- Update frequency: ``update_per_n_iteration`` defaults to 1, so every call recomputes (``is_updating``);
  the stored-scale path for other values is not transcribed.
- Scales are values here. In ``rescaling``'s fallback the reference does ``scale_ /= 2`` on the object it
  took from the gradients; when that is a 0-d array (the scale ``scale_grad`` attaches) the division is
  in place and also changes that gradient's attached scale, so that gradient is then not multiplied. This
  aliasing is not reproduced: the transcription treats every scale as a value.
- ``prev_scale``: the reference calls ``prev_scale.item()``, so it needs a numpy scalar or 0-d array; here
  a Python float is accepted as well (``np.asarray(prev_scale).item()``).
- The gradient arrays of :func:`compose_layer_scales` must be the arrays the reference layer receives,
  i.e. already multiplied by the scale they carry: the reference computes the statistics of the scaled
  gradient (only the accumulated bound reads ``prev_scale`` itself).
- A scale that is inf (a float16 scale past 65504) makes ``rescaling``'s fallback loop forever, in the
  reference as here (inf / 2 stays >= 1/8).
- The reference's examples do not train with all of these defaults: examples/adaptive_loss_scaling/cifar
  uses scale_upper_bound=128, accum_upper_bound=4096, n_uf_threshold=1e-3 (utils.py, ``train``), segnet
  65504 for both bounds and update_per_n_iteration=100 (train.py); imagenet and ssd take them from flags.
- Not transcribed: ``get_loss_scale_by_abs_range`` ("abs_range"), the lognormal option's file dump
  (``np.save("all_zero_g.npy", g)``), the recorder, profiler and sanity checker, the ``debug_level``
  checks (default 0), and ``get_unscaled_gradient``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# --- ada_loss/core.py, AdaLoss.__init__ defaults -------------------------------------------------------
U_MIN = None  # -> get_u_min(dtype)
U_MAX = None  # -> get_u_max(dtype)
POWER_OF_TWO = True
LOSS_SCALE_METHOD = None  # -> "approx_range"
FIXED_LOSS_SCALE = 1.0
SCALE_UPPER_BOUND = 16
ACCUM_UPPER_BOUND = 1024
MAX_RESCUE_RATIO = None
N_SIGMA = 1e-3
N_UF_THRESHOLD = 1e-3
DEBUG_LEVEL = 0
USE_BOUND = True
DTYPE = "float16"
FULL_DTYPE = "float32"
UPDATE_PER_N_ITERATION = 1
# AdaLoss.__init__: loss_scale_method None becomes this
DEFAULT_LOSS_SCALE_METHOD = "approx_range"

# --- ada_loss/core.py, AdaLoss.get_u_min / AdaLoss.get_u_max ---------------------------------------------
U_MIN_FLOAT16 = 6.0e-8
U_MAX_FLOAT16 = 65504
U_MIN_FLOAT32 = 1e-23
U_MAX_FLOAT32 = 1e23

# AdaLoss.__init__: self.n_uf_threshold = erfinv(n_uf_threshold) * np.sqrt(2), for the default 1e-3, with
# scipy 1.7.1's erfinv(y) = ndtri(0.5 * (y + 1)) * sqrt(1/2) (see the module docstring)
N_UF_THRESHOLD_VALUE = 0.0012533144654324167

# AdaLossChainer.rescaling: the fallback stops halving below this
RESCALING_MIN_SCALE = 1 / 8


def _erfinv_scipy_1_7(y):
    """scipy 1.7's cephes erfinv (scipy/special/cephes/erfinv.c), for -1 < y < 1."""
    if -1e-7 < y < 1e-7:
        return np.float64(y / (2 / math.sqrt(math.pi)))
    from scipy.special import ndtri  # only for a non-default n_uf_threshold

    return np.float64(ndtri(0.5 * (y + 1)) * np.sqrt(0.5))


def get_u_min(dtype):
    """ada_loss/core.py, AdaLoss.get_u_min."""
    if dtype == "float16" or dtype == np.float16:
        return U_MIN_FLOAT16
    elif dtype == "float32" or dtype == np.float32:
        return U_MIN_FLOAT32
    raise ValueError("dtype cannot be recognized: {}".format(dtype))


def get_u_max(dtype):
    """ada_loss/core.py, AdaLoss.get_u_max."""
    if dtype == "float16" or dtype == np.float16:
        return U_MAX_FLOAT16
    elif dtype == "float32" or dtype == np.float32:
        return U_MAX_FLOAT32
    raise ValueError("dtype cannot be recognized: {}".format(dtype))


@dataclass(frozen=True)
class AdaLossConfig:
    """The arguments of ``AdaLoss.__init__`` (ada_loss/core.py) that the rule reads, with its defaults,
    and the attributes ``__init__`` derives from them (properties)."""

    u_min: float | None = U_MIN
    u_max: float | None = U_MAX
    power_of_two: bool = POWER_OF_TWO
    loss_scale_method: str | None = LOSS_SCALE_METHOD
    fixed_loss_scale: float = FIXED_LOSS_SCALE
    scale_upper_bound: float = SCALE_UPPER_BOUND
    accum_upper_bound: float = ACCUM_UPPER_BOUND
    max_rescue_ratio: float | None = MAX_RESCUE_RATIO
    n_sigma: float = N_SIGMA
    n_uf_threshold: float = N_UF_THRESHOLD
    use_bound: bool = USE_BOUND
    dtype: str = DTYPE
    full_dtype: str = FULL_DTYPE

    @property
    def method(self):
        """self.loss_scale_method"""
        return DEFAULT_LOSS_SCALE_METHOD if self.loss_scale_method is None else self.loss_scale_method

    @property
    def scale_dtype(self):
        """self.scale_dtype = dtype ("scale dtype is the same as dtype")"""
        return np.dtype(self.dtype)

    @property
    def range(self):
        """self.range = get_range(dtype, u_min, u_max): [u_min, u_max] as a full_dtype array."""
        u_min = get_u_min(self.dtype) if self.u_min is None else self.u_min
        u_max = get_u_max(self.dtype) if self.u_max is None else self.u_max
        return np.array([u_min, u_max], dtype=self.full_dtype)

    @property
    def n_uf(self):
        """self.n_uf = n_uf_threshold (the argument)"""
        return self.n_uf_threshold

    @property
    def n_uf_threshold_value(self):
        """The reference's attribute self.n_uf_threshold = erfinv(n_uf_threshold) * np.sqrt(2) (float64)."""
        if self.n_uf_threshold == N_UF_THRESHOLD:
            return np.float64(N_UF_THRESHOLD_VALUE)
        return _erfinv_scipy_1_7(self.n_uf_threshold) * np.sqrt(2)

    @property
    def scale_upper_bound_array(self):
        """self.scale_upper_bound = np.array(scale_upper_bound, dtype=self.scale_dtype)"""
        return np.array(self.scale_upper_bound, dtype=self.scale_dtype)

    @property
    def accum_upper_bound_array(self):
        """self.accum_upper_bound = np.array(accum_upper_bound, dtype=self.scale_dtype)"""
        return np.array(self.accum_upper_bound, dtype=self.scale_dtype)


DEFAULT_CONFIG = AdaLossConfig()


def get_fan_in(W, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.get_fan_in: W.shape[0] for a 2-D weight, else W.shape[0] * W.shape[2] * W.shape[3]
    ("deconv"), as a Python float through full_dtype."""
    W = np.asarray(W)
    if len(W.shape) == 2:
        return np.array(W.shape[0], dtype=cfg.full_dtype).item()
    return np.array(W.shape[0] * W.shape[2] * W.shape[3], dtype=cfg.full_dtype).item()


def get_mean_and_std(X, lognormal=False, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.get_mean_and_std: mean and std (numpy, ddof=0) of X cast to full_dtype; with
    lognormal, of log|X| over the nonzero elements. (None, None) for no elements."""
    X_ = np.asarray(X)
    if X_.dtype != np.dtype(cfg.full_dtype):
        X_ = X_.astype(cfg.full_dtype)
    if lognormal:
        X_ = np.log(np.abs(X_[X_ != 0]))
    if X_.size == 0:
        return None, None
    mu, sigma = X_.mean(), X_.std()
    return mu, sigma


def get_mean_and_std_of_product(X, Y, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.get_mean_and_std_of_product: "the rule for product distribution" of independent X
    and Y, without the - (X_mu * Y_mu) ** 2 term (commented out in the reference)."""
    X_mu, X_sigma = get_mean_and_std(X, cfg=cfg)
    Y_mu, Y_sigma = get_mean_and_std(Y, cfg=cfg)
    # numpy 1.x: np.float32 ** 2 (a Python int) is float64, so the variance is float64
    f64 = np.float64
    O_var = (f64(X_sigma) ** 2 + f64(X_mu) ** 2) * (f64(Y_sigma) ** 2 + f64(Y_mu) ** 2)
    O_sigma = np.sqrt(O_var).astype(cfg.full_dtype)
    return X_mu * Y_mu, O_sigma


def _stats_and_o_max(g, W, lognormal, cfg):
    """The statistics part of get_loss_scale_by_approx_range: (o_mu, o_sigma, g_min, g_max)."""
    if W is not None:
        # lognormal won't be applied in this branch
        o_mu, o_sigma = get_mean_and_std_of_product(g, W, cfg=cfg)
    else:
        o_mu, o_sigma = get_mean_and_std(g, lognormal=lognormal, cfg=cfg)
    g_ = np.asarray(g)
    return o_mu, o_sigma, g_.min().astype(cfg.full_dtype), g_.max().astype(cfg.full_dtype)


def get_loss_scale_by_approx_range(g, W=None, n_sigma=1e-2, lognormal=False, bound_by_fan_in=True, *,
                                   cfg=DEFAULT_CONFIG):
    """AdaLossChainer.get_loss_scale_by_approx_range: the unbound scale of one layer (float32).

    g is the layer's incoming gradient (as received, i.e. already scaled), W its weight (None for the
    cast function). n_sigma is cast and otherwise unused, as in the reference; the reference's caller
    (get_unbound_loss_scale) passes n_sigma=cfg.n_sigma.
    """
    full = np.dtype(cfg.full_dtype)
    u_min, u_max = cfg.range  # np.float32 scalars
    o_mu, o_sigma, g_min, g_max = _stats_and_o_max(g, W, lognormal, cfg)
    if o_mu is None and o_sigma is None:
        return np.array(1.0, dtype=full)
    # NOTE: it is possible that o_sigma is 0, e.g., a all-zero gradient.
    if o_sigma == 0:
        return np.array(1, dtype=full)
    o_max = np.abs([g_max, g_min]).max()
    if W is not None:
        W_ = np.asarray(W)
        W_min, W_max = W_.min().astype(full), W_.max().astype(full)
        if bound_by_fan_in:
            # numpy 1.x: np.float32 / Python float is float64
            u_max = np.float64(u_max) / get_fan_in(W_, cfg)
        o_max = np.abs(np.array([g_max * W_max, g_min * W_min, g_max * W_min, g_min * W_max])).max()
        # NOTE: assuming the existence of ReLU. numpy 1.x: np.float32 * np.float64 is float64
        o_sigma = np.float64(o_sigma) * np.sqrt(0.5 * get_fan_in(W_, cfg))
    n_sigma = np.array(n_sigma, dtype=full)  # noqa: F841 (cast, unused, as in the reference)
    if lognormal and W is None:
        erfinv_val = _erfinv_scipy_1_7(2 * cfg.n_uf - 1).astype(full)
        # numpy 1.x: the float32 o_sigma times np.sqrt(2) is float64, and so is everything after it
        loss_scale = np.exp(np.float64(np.log(u_min.astype(full)) - o_mu)
                            - np.float64(o_sigma) * np.sqrt(2) * np.float64(erfinv_val))
    else:
        # numpy 1.x: float64 * float32 is float64; float32 / float64 is float64
        loss_scale = np.float64(u_min) / (cfg.n_uf_threshold_value * np.float64(o_sigma))
    # constrain to 1.
    loss_scale = np.maximum(loss_scale, np.float64(np.array(1.0, dtype=full)))
    # float64 if u_max was divided by the fan-in (numpy 1.x), else float32 / float32
    upper_scale = u_max / (np.float64(o_max) if u_max.dtype == np.float64 else o_max)
    loss_scale = np.minimum(loss_scale, np.float64(upper_scale))
    return loss_scale.astype(full)


def get_matrices_to_be_multiplied(g, W):
    """AdaLossChainer.get_matrices_to_be_multiplied: 2-D g, W as they are; 4-D (convolution) g as
    (N*H*W, C_out) and W as (C_out, C_in*kh*kw)."""
    g_, W_ = np.asarray(g), np.asarray(W)
    if len(g_.shape) == 2 and len(W_.shape) == 2:
        return g_, W_
    if len(g_.shape) == 4 and len(W_.shape) == 4:
        F = g_.shape[1]
        return g_.transpose([1, 0, 2, 3]).reshape([F, -1]).T, W_.reshape([F, -1])
    raise ValueError("g and W shape cannot be transformed to matrices: {} and {}".format(g_.shape, W_.shape))


def get_element_wise_multiply(g, W, filter_zero=True, cast_to_fp32=True):
    """AdaLossChainer.get_element_wise_multiply: every product g[n, k] * W[k, m], in (n, m, k) order."""
    g_, W_ = get_matrices_to_be_multiplied(g, W)
    if np.isnan(g_).any():
        raise ValueError("Input gradient contains NaN")
    if np.isnan(W_).any():
        raise ValueError("Input weight contains NaN")
    N, K = g_.shape
    M = W_.shape[1]
    ge_ = g_.reshape((N, 1, K)).repeat(M, axis=1).flatten()
    We_ = W_.T.reshape((1, M, K)).repeat(N, axis=0).flatten()
    if cast_to_fp32:
        ge_, We_ = ge_.astype("float32"), We_.astype("float32")
    gW_ = np.multiply(ge_, We_)
    if filter_zero:  # if one operand is 0, filter out result
        gW_ = gW_[np.bitwise_and(ge_ != 0, We_ != 0)]
    return gW_


def get_loss_scale_by_element_wise_range(g, W, max_rescue_ratio=None, cast_to_fp32=True,  # noqa: PLR0913
                                         bound_by_fan_in=True, norm_upper_bound=1024, scale_upper_bound=16,
                                         prev_scale=None, *, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.get_loss_scale_by_element_wise_range ("element_wise_range"): min(the scale that
    lifts every |g W| product to u_min, the scale that keeps every product below u_max / fan_in).
    norm_upper_bound, scale_upper_bound and prev_scale are unused, as in the reference."""
    assert cast_to_fp32, "We only support FP32 mode element-wise analysis"
    res = get_element_wise_multiply(g, W, cast_to_fp32=cast_to_fp32)
    if len(res) == 0:
        raise RuntimeError("There should be non-zero result from multiplying g and W element-wise, got: 0")
    res = np.abs(res)
    if np.isnan(res).any():
        raise ValueError("NaN appeared in the element-wise multiplication result.")
    rng = cfg.range
    min_scales = np.maximum(rng[0] / res, np.float32(1.0))
    if isinstance(max_rescue_ratio, float):
        min_scales = np.sort(min_scales)
        min_scales = min_scales[: int(len(min_scales) * max_rescue_ratio)]
    max_scales = rng[1] / res
    if bound_by_fan_in:
        max_scales /= get_fan_in(W, cfg)  # in place: stays float32
    loss_scale = np.minimum(min_scales.max(), max_scales.min())
    check_scale(loss_scale)
    return loss_scale


def check_scale(scale):
    """AdaLossChainer.check_scale"""
    if np.isnan(scale) or np.isinf(scale):
        raise ValueError("scale value {} is invalid".format(scale))


def bound_loss_scale_by_heuristics(loss_scale, W=None, prev_scale=None, *, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.bound_loss_scale_by_heuristics: the scale no larger than accum_upper_bound /
    prev_scale (so the accumulated scale stays within accum_upper_bound), then no larger than
    scale_upper_bound. W is unused (its norm bound is commented out in the reference)."""
    check_scale(loss_scale)
    if prev_scale is None:
        prev_scale = np.array(1.0, dtype=cfg.scale_dtype)
    # BOUND BY ACCUMULATED LOSS SCALE. numpy 1.x: float32 0-d / float64 0-d is float64
    accum_bound = np.float64(np.array(cfg.accum_upper_bound_array, dtype=cfg.full_dtype)) / np.float64(
        np.asarray(prev_scale).item()
    )
    loss_scale = np.minimum(accum_bound, np.float64(loss_scale))
    # HARD upper bound
    loss_scale = np.minimum(np.float64(np.array(cfg.scale_upper_bound_array, dtype=cfg.full_dtype)),
                            loss_scale).astype(cfg.full_dtype)
    return loss_scale


def get_power_of_two_scale(scale, cfg=DEFAULT_CONFIG):
    """AdaLoss.get_power_of_two_scale: 2 ** floor(log2(scale)), log2 in the scale's own precision
    (float32 for a computed scale, float64 for a Python float), cast to scale_dtype."""
    assert np.ndim(scale) == 0
    log_scale = np.log2(scale)
    # numpy 1.x: np.power(2, <numpy scalar>) is float64 (exact for a power of two)
    pot_scale = np.power(np.float64(2), np.float64(np.floor(log_scale)))
    return pot_scale.astype(cfg.scale_dtype)


def get_loss_scale(g, W=None, prev_scale=None, lognormal=False, *, cfg=DEFAULT_CONFIG):
    """AdaLoss.get_loss_scale with get_unbound_loss_scale: the layer's scale as a Python float."""
    method = cfg.method
    if method == "element_wise_range":
        loss_scale = get_loss_scale_by_element_wise_range(g, W, prev_scale=prev_scale,
                                                          max_rescue_ratio=cfg.max_rescue_ratio, cfg=cfg)
    elif method == "approx_range":
        loss_scale = get_loss_scale_by_approx_range(g, W, n_sigma=cfg.n_sigma, lognormal=lognormal, cfg=cfg)
    elif method == "fixed":
        loss_scale = np.array(cfg.fixed_loss_scale, dtype=cfg.scale_dtype)
    elif method == "abs_range":
        raise NotImplementedError("get_loss_scale_by_abs_range is not transcribed")
    else:
        raise ValueError('Cannot recognize loss scale method "{}"'.format(method))
    if method == "approx_range" and cfg.use_bound:
        loss_scale = bound_loss_scale_by_heuristics(loss_scale, W=W, prev_scale=prev_scale, cfg=cfg)
    if cfg.power_of_two:
        loss_scale = get_power_of_two_scale(loss_scale, cfg)
    return np.asarray(loss_scale).astype(cfg.scale_dtype).item()


def compose_scale(scale, prev_scale, g_dtype, cfg=DEFAULT_CONFIG):
    """The scale part of AdaLossChainer.get_scaled_gradient: (the scale the gradient is multiplied by,
    the scale the scaled gradient then carries = scale * prev_scale), both in scale_dtype (float16) unless
    power_of_two is off (float32) or the gradient is float32 (the layer's scale float32)."""
    scale = np.array(scale, dtype=cfg.scale_dtype)
    prev_scale = np.array(prev_scale, dtype=cfg.scale_dtype)
    g_dtype = np.dtype(g_dtype)
    if not cfg.power_of_two:
        g_dtype = np.dtype(cfg.full_dtype)
        scale = scale.astype(cfg.full_dtype)
        prev_scale = prev_scale.astype(cfg.full_dtype)
    if scale.dtype != g_dtype:
        if g_dtype == np.float32:
            scale = scale.astype(g_dtype)
        else:
            raise RuntimeError("Scale dtype={} does not match grad dtype={}".format(scale.dtype, g_dtype))
    # 0-d times 0-d: the usual promotion (float16 * float16 is float16: 1e4 * 1e4 is inf)
    new_scale = scale * prev_scale
    assert not np.isnan(new_scale) and not np.isinf(new_scale)
    return scale, new_scale


def get_scaled_gradient(g, scale, prev_scale=1.0, dtype=None, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.get_scaled_gradient: (g * scale in g's dtype, its new scale scale * prev_scale)."""
    g = np.asarray(g)
    if dtype is None:
        dtype = g.dtype
    scale_, new_scale = compose_scale(scale, prev_scale, g.dtype, cfg)
    g_ = g if cfg.power_of_two else g.astype(cfg.full_dtype)
    sg_ = g_ * scale_  # same dtypes here
    return sg_.astype(dtype), new_scale


def _legacy_multiply(arr, factor):
    """``arr *= factor`` (in place, so the result keeps arr's dtype) for a numpy float scalar factor, with
    numpy 1.x's value-based casting: the computation is in arr's dtype unless the factor's value is out of
    that dtype's range (np.min_scalar_type)."""
    arr = np.asarray(arr)
    calc = np.promote_types(arr.dtype, np.min_scalar_type(np.asarray(factor).item()))
    return (arr.astype(calc) * np.asarray(factor).astype(calc)).astype(arr.dtype)


def rescaling(gs, scales, cfg=DEFAULT_CONFIG):
    """AdaLossChainer.rescaling (update_per_n_iteration=1): bring every gradient to one target scale.

    gs: the gradient arrays, scales: the scales they carry (numpy scalars, as the reference attaches).
    Returns (the rescaled gradients, new arrays; the target scale). See the module docstring.
    """
    assert len(gs) >= 2, "Number of gradients should be >= 2"
    full = np.dtype(cfg.full_dtype)
    u_max = cfg.range[1]
    sorted_scales = list(sorted(scales))
    target = None
    # search from the largest to the smallest
    max_gs = [np.max(np.abs(np.asarray(g))).astype(full) / np.asarray(s).astype(full)
              for g, s in zip(gs, scales)]
    max_g = max(max_gs)
    for scale in sorted_scales[::-1]:
        # check whether this scale will not cause overflow
        if max_g * scale < u_max:
            target = scale
            break
    if target is None:
        # temporarily, we search for smaller scales
        scale_ = min(scales)
        while scale_ >= RESCALING_MIN_SCALE:
            if max_g * scale_ < u_max:
                break
            # numpy 1.x: a numpy scalar /= 2 (a Python int) is float64 (see the module docstring for a 0-d
            # array's in-place division)
            scale_ = np.float64(scale_) / 2
        target = scale_
    if max_g * target >= u_max:
        raise ValueError("Cannot find a suitable target for max gradients: {}".format(max_gs))
    # run rescaling
    rescaled = [_legacy_multiply(g, target / scale) for g, scale in zip(gs, scales)]
    return rescaled, target


def combine_branch_gradients(gs, scales=None, cfg=DEFAULT_CONFIG):
    """AdaLossBranch.backward: the gradient of a branched activation, from the gradients of its n outputs
    (gs in the order of the branch's outputs), and the scale the sum carries.

    scales None: the gradients carry no scale (plain sum, scale None). "approx_range": rescaling to a
    common target, then the sum, which carries the target. Any other method: the sum as it is, carrying
    the scale of gs[0]. The sum is chainer's sum(gs), i.e. ((0 + gs[0]) + gs[1]) + ... in the gradients'
    dtype.
    """
    if scales is None:
        out_scale = None
    elif cfg.method == "approx_range":
        # rescaling only necessary for adaptive
        gs, out_scale = rescaling(gs, scales, cfg)
    else:
        out_scale = scales[0]
    gs = [np.asarray(g) for g in gs]
    total = gs[0].dtype.type(0) + gs[0]
    for g in gs[1:]:
        total = total + g
    return total, out_scale


@dataclass(frozen=True)
class LayerScale:
    """One layer of compose_layer_scales: the scale its incoming gradient carries (prev_scale), the
    layer's own scale, and the scale its outgoing gradient carries (prev_scale * scale)."""

    prev_scale: np.ndarray
    scale: float
    cumulative: np.ndarray


def compose_layer_scales(layers, init_scale=1.0, init_scale_dtype=None, lognormal=False, cfg=DEFAULT_CONFIG):
    """The backward pass of a chain of AdaLoss layers (AdaLossLinear / AdaLossConvolution2D, with batch
    norms and activations between them passing the scale through), from the output backwards.

    layers: (W, g) pairs, output layer first; g is the gradient the layer receives, already carrying the
    previous scale (see the module docstring). init_scale: AdaLossScaled's init_scale, attached by
    scale_grad as an array of chainer.get_dtype(): float16 under chainer.mixed16, as every example of the
    reference trains (init_scale_dtype None means cfg.dtype, float16), float32 under chainer's default.

    Each layer, as AdaLoss.loss_scaling does it: prev_scale = the scale g carries; scale =
    get_loss_scale(g, W, prev_scale); the outgoing gradient (g * scale) @ W carries scale * prev_scale,
    which is the next layer's prev_scale.
    """
    prev_scale = np.array(init_scale, dtype=cfg.dtype if init_scale_dtype is None else init_scale_dtype)
    out = []
    for W, g in layers:
        scale = get_loss_scale(g, W, prev_scale=prev_scale, lognormal=lognormal, cfg=cfg)
        _, cumulative = compose_scale(scale, prev_scale, np.asarray(g).dtype, cfg)
        out.append(LayerScale(prev_scale=prev_scale, scale=scale, cumulative=cumulative))
        prev_scale = cumulative
    return out
