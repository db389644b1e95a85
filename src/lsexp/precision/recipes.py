"""The recipes as cells: which tensors of each matrix product are quantised, to which format, with which
scale. Each Dense and Conv2d of the network is wrapped (QuantizedProduct) so that its input and weight are
quantised on the way in, as Transformer Engine's te.Linear quantises them, and the gradient flowing back
into its product on the way out; the product itself runs, on the dequantised values, in amp's type.
Attention's batched products stay in amp's type, as with TE's default (fp8_dpa=False).

A quantiser is straight-through: the gradient passes it unchanged, so that the product's backward sees
the quantised copies it computed with, as TE's saved FP8 tensors are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from lsexp.formats import FORMATS, cast
from lsexp.formats.cast import amax

FLT_MAX = 3.4028234663852886e38
# (forward format, backward format) of TE's recipe.Format, and HiFloat8 both ways
FORMAT_PAIRS = {"HYBRID": ("e4m3", "e5m2"), "E4M3": ("e4m3", "e4m3"), "E5M2": ("e5m2", "e5m2"),
                "HIF8": ("hif8", "hif8")}
PRODUCTS = (nn.Dense, nn.Conv2d)
# cells that read their Dense's Parameters into one functional call instead of calling it: MindSpore's
# MultiheadAttention (its projections stay in amp's type, with its batched products)
READS_PARAMETERS = (nn.MultiheadAttention,)
AMP_WRAPPER = "_backbone."  # amp's O2 and O3 put the model here: the names are the model's own


def current_scale(a, fmt_max):
    """Float8CurrentScaling's scale from this tensor's amax: fmt_max / amax; 1 for a zero or non-finite
    amax, and float32's largest for an infinite quotient. fmt_max is a float32 Tensor: MindSpore divides
    a Python float by a tensor as a product with the reciprocal, an ulp off the quotient."""
    s = fmt_max / ops.maximum(a, 2.0**-126)
    s = ops.where((a > 0) & (a < float("inf")), s, 1.0)
    return ops.minimum(s, FLT_MAX)


class ScaledCast(nn.Cell):
    """x * scale cast to the format with saturation (TE's casts saturate), times 1 / scale: the value the
    product computes with."""

    def __init__(self, fmt_name: str):
        super().__init__()
        self.cast = cast.FormatCast(FORMATS[fmt_name], saturate=True)

    def construct(self, x, scale):
        dtype = x.dtype
        x = ops.cast(x, mstype.float32)
        # finite values saturate; an inf stays one, so that the loss scale's overflow check sees it
        y = ops.where(ops.isinf(x), x, self.cast(x * scale) * (1.0 / scale))
        return ops.cast(y, dtype)


def _pyfunc(func, inputs: int):
    """func as one CPU kernel (a MindSpore pyfunc) of `inputs` tensors, returning the first one's shape
    and type."""
    return ops.Custom(func, out_shape=lambda *shapes: shapes[0], out_dtype=lambda *types: types[0],
                      func_type="pyfunc")


class Quantizer(nn.Cell):
    """Forward: the tensor as the recipe quantises it: with `scale` (delayed), with its current scale, or
    in MX blocks. Backward: straight through. host: on CPU, each cast is one numpy
    kernel (lsexp.formats.host) in place of the MindSpore ops' twenty."""

    def __init__(self, recipe: str, fmt_name: str, block: int = 32, rounding: str = "even",
                 host: bool = False, name: str = ""):
        super().__init__()
        fmt = FORMATS[fmt_name]
        self.mx, self.host, self.delayed = recipe == "mx", host, recipe == "delayed"
        self.fmt_max = Tensor(fmt.max, mstype.float32)
        if host:
            from lsexp.formats import host as numpy_casts
            from lsexp.precision import telemetry

            def record(x, y, scaled, limit, scale):
                telemetry.record(name, x, y, scaled, limit, scale)

            if self.mx:
                mx = numpy_casts.MXCastHost(fmt, block, rounding, record)
                self.kernel = _pyfunc(lambda x: mx(x), 1)
            else:
                scaled = numpy_casts.ScaledCastHost(fmt, record)
                self.kernel = _pyfunc(lambda x, s: scaled(x, s), 2)
                self.current_kernel = _pyfunc(lambda x: scaled(x, scaled.current_scale(x)), 1)
        elif self.mx:
            self.cast = cast.MXCast(fmt, block, rounding)
        else:
            self.cast = ScaledCast(fmt_name)

    def current(self, x):
        """x with its own current scale."""
        if self.mx:
            return self.kernel(x) if self.host else self.cast(x)
        if self.host:
            return self.current_kernel(x)
        return self.cast(x, current_scale(amax(x), self.fmt_max))

    def construct(self, x, scale):
        if not self.delayed:  # current scaling or MX blocks: the tensor alone decides
            return self.current(x)
        if self.host:
            return self.kernel(x, scale)
        return self.cast(x, scale)

    def bprop(self, x, scale, out, dout):
        return dout, ops.zeros_like(scale)


@dataclass(frozen=True)
class Casting:
    """How a Quantizer casts, apart from its recipe and format: MX's block size and the elements'
    rounding, and host (numpy kernels on CPU)."""

    block: int = 32
    rounding: str = "even"
    host: bool = False


class GradientQuantizer(nn.Cell):
    """Forward: the identity. Backward: the gradient flowing into the product's output, quantised as the
    backward products receive it: with its delayed scale, read in the forward pass and handed in as
    `scale`, its amax noted for the next step's update; or with its current scale, or in MX blocks. The
    loss scale is in it: the eight-bit scale is taken after the loss scale, of the scaled gradient."""

    def __init__(self, recipe: str, fmt_name: str, casting: Casting = Casting(), name: str = "", cfg=None):
        super().__init__(auto_prefix=False)  # the history's Parameters keep their lsexp_fp8.* names
        self.quantizer = Quantizer(recipe, fmt_name, casting.block, casting.rounding, casting.host, name)
        self.delayed = recipe == "delayed"
        if self.delayed:
            from lsexp.precision.delayed import DelayedScaling

            self.history = DelayedScaling(name, FORMATS[fmt_name].max, cfg.margin, cfg.amax_history_len,
                                          cfg.amax_compute_algo, in_backward=True)

    def construct(self, y, scale):
        return y

    def bprop(self, y, scale, out, dout):
        if self.delayed:
            noted = self.history.note(amax(dout))
            return ops.depend(self.quantizer(dout, scale), noted), ops.zeros_like(scale)
        return self.quantizer.current(dout), ops.zeros_like(scale)


class TensorScale(nn.Cell):
    """A tensor's scale: current, from its amax now, or delayed (lsexp.precision.delayed), from the
    history of its amax, read before this step's amax enters it."""

    def __init__(self, recipe: str, name: str, fmt_max: float, cfg):
        super().__init__(auto_prefix=False)  # the history's Parameters keep their lsexp_fp8.* names
        self.delayed = recipe == "delayed"
        self.fmt_max = Tensor(fmt_max, mstype.float32)
        if self.delayed:
            from lsexp.precision.delayed import DelayedScaling

            self.history = DelayedScaling(name, fmt_max, cfg.margin, cfg.amax_history_len,
                                          cfg.amax_compute_algo)

    def construct(self, x):
        """(the scale to use, a value the caller depends on so that the amax is recorded)."""
        a = amax(x)
        if self.delayed:
            scale = self.history.scale * 1.0
            if not self.training:  # an evaluation quantises with the scale and leaves the history be
                return scale, a
            return scale, self.history.record(ops.depend(a, scale))
        return current_scale(a, self.fmt_max), a


class QuantizedProduct(nn.Cell):
    """A Dense or Conv2d whose input and weight are quantised before its product, and the gradient of its
    product's output on the way back. Its Parameters keep their names."""

    def __init__(self, layer: nn.Cell, name: str, cfg, host: bool = False):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.is_dense = isinstance(layer, nn.Dense)
        forward, backward = FORMAT_PAIRS[cfg.fp8_format]
        fmax = FORMATS[forward].max
        self.mx = cfg.recipe == "mx"
        self.delayed = cfg.recipe == "delayed"
        self.one = Tensor(1.0, mstype.float32)
        self.q_input = Quantizer(cfg.recipe, forward, cfg.block_size, cfg.rounding, host, f"{name}.input")
        self.q_weight = Quantizer(cfg.recipe, forward, cfg.block_size, cfg.rounding, host, f"{name}.weight")
        self.q_grad = GradientQuantizer(cfg.recipe, backward, Casting(cfg.block_size, cfg.rounding, host),
                                        f"{name}.grad", cfg)
        self.s_input = TensorScale(cfg.recipe, f"{name}.input", fmax, cfg)
        self.s_weight = TensorScale(cfg.recipe, f"{name}.weight", fmax, cfg)
        self.has_bias = layer.has_bias

    def quantized(self, x, scale_of, quantizer):
        if not self.delayed:
            return quantizer(x, self.one)
        scale, after = scale_of(ops.stop_gradient(x))
        return ops.depend(quantizer(x, scale), after)

    def construct(self, x):
        layer = self.layer
        w = ops.cast(layer.weight, x.dtype)
        shape = x.shape
        if self.is_dense and len(shape) != 2:
            x = x.reshape((-1, shape[-1]))
        xq = self.quantized(x, self.s_input, self.q_input)
        wq = self.quantized(w, self.s_weight, self.q_weight)
        y = layer.matmul(xq, wq) if self.is_dense else layer.conv2d(xq, wq)
        # a delayed scale is read here, in the forward pass, in the step's order of writes
        y = self.q_grad(y, self.q_grad.history.scale * 1.0 if self.delayed else self.one)
        if self.has_bias:
            y = layer.bias_add(y, ops.cast(layer.bias, y.dtype))
        if self.is_dense:
            if layer.activation_flag:
                y = layer.activation(y)
            if len(shape) != 2:
                y = y.reshape(shape[:-1] + (y.shape[-1],))
        return y


def _model_path(path: str, taps: List[str]) -> str:
    """A cell's path as the model has it: without amp's wrapper, and without the `layer` hop of a tap
    (lsexp.taps.cells.Tap, which holds the layer it wraps as `layer`)."""
    path = path[len(AMP_WRAPPER):] if path.startswith(AMP_WRAPPER) else path
    for tap in taps:
        if path == f"{tap}.layer" or path.startswith(f"{tap}.layer."):
            return tap + path[len(tap) + len(".layer"):]
    return path


def _wrappable(net: nn.Cell):
    """(parent, attribute, name) of each Dense and Conv2d the network calls as a cell."""
    cells = list(net.cells_and_names())
    taps = sorted((_model_path(p, []) for p, c in cells if hasattr(c, "tap_name")), key=len, reverse=True)
    for path, cell in cells:
        if isinstance(cell, READS_PARAMETERS):
            continue
        path = _model_path(path, taps)
        for attr, child in list(cell.name_cells().items()):
            if isinstance(child, PRODUCTS):  # a product in an amp wrapper has the wrapper's name
                yield cell, attr, path if attr == AMP_WRAPPER[:-1] else f"{path}.{attr}" if path else attr


def products(net: nn.Cell) -> List[str]:
    """The names of the Dense and Conv2d cells a recipe quantises, as cells_and_names() gives them."""
    return [name for _, _, name in _wrappable(net)]


def delayed_scales(wrapped: Dict[str, QuantizedProduct]) -> list:
    """The DelayedScaling cells of the wrapped products, for the train step to advance before each
    forward pass."""
    return [h for q in wrapped.values() if q.delayed
            for h in (q.s_input.history, q.s_weight.history, q.q_grad.history)]


def install(net: nn.Cell, cfg, host: Optional[bool] = None) -> Dict[str, QuantizedProduct]:
    """Wrap each Dense and Conv2d of `net` in a QuantizedProduct, in place, after amp has cast it; the
    layers' Parameters keep their names, the scales' are lsexp_fp8.<layer>.<tensor>.*. host: the casts
    as numpy kernels (lsexp.formats.host) or MindSpore ops; None: numpy where the target is CPU."""
    if host is None:
        import mindspore as ms

        host = ms.get_context("device_target") == "CPU"
    wrapped = {}
    for cell, attr, name in list(_wrappable(net)):
        child = cell.name_cells()[attr]
        own = {id(p): p.name for p in child.get_parameters()}
        q = QuantizedProduct(child, name, cfg, host)
        own.update({id(p): p.name for p in q.get_parameters() if id(p) not in own})
        if isinstance(cell, (nn.SequentialCell, nn.CellList)):
            cell[int(attr)] = q
        else:
            setattr(cell, attr, q)
        for p in q.get_parameters():  # the parents would put their attribute names into theirs
            p.name = own[id(p)]
        wrapped[name] = q
    return wrapped
