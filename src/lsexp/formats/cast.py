"""Quantise-dequantise in float32 MindSpore ops: each cell returns exactly the values a format holds,
inside a compiled step or eagerly. MindSpore 2.10 has no 8-bit float type and no bit cast in graph
mode, so the grid is found with float arithmetic alone, each operation exact:

- ufp(a), the power of two at or below a, is Rump, Ogita and Oishi's float-only "unit in the first
  place" (SIAM J. Sci. Comput. 31(1), 2008, Algorithm 3.5): q = (2^23 + 1) * a, ufp = |q - (1 - 2^-24) q|;
- the spacing of the grid at a is ufp(a), or the lowest binade's where a is below it, times 2^-m;
- a / spacing and back are exact (powers of two), and Rint rounds to nearest, ties to even, as IEEE's
  roundTiesToEven; ties away compare t - floor(t), exact, with 1/2.

MindSpore's CPU kernels read a subnormal float32 operand as zero, and its signbit and copysign read -0
as positive; the cells below compare where they would otherwise compute with such values.
"""

from __future__ import annotations

from typing import Optional

from mindspore import dtype as mstype
from mindspore import nn, ops

from lsexp.formats.spec import Format

_PHI = float(2**23 + 1)
_ONE_MINUS_EPS = 1.0 - 2.0**-24
# ufp's product must not overflow float32, and a magnitude above 2^64 is beyond every element format;
# below 2^-100, far under every element format's smallest value, an element rounds to 0 (ufp itself
# needs only a normal operand, at least 2^-126)
_HUGE, _SMALL = 2.0**64, 2.0**-100
_FLOAT32_MAX = 3.4028234663852886e38


def amax(x):
    """max |x| in float32, a NaN counted as inf: MindSpore's CPU max skips a NaN or not depending on where
    it is, so an amax of inf means "inf or NaN" wherever it is. A recipe's scale and a tap's statistics
    read it."""
    return ops.nan_to_num(ops.abs(ops.cast(x, mstype.float32)), nan=float("inf"), posinf=float("inf")).max()


def _clamp(x, lo, hi):
    # ops.clamp does not compile inside a custom bprop (MindSpore 2.10: "func graph is empty")
    return ops.minimum(ops.maximum(x, lo), hi)


def ufp(a):
    """The largest power of two at or below a, for float32 a in [2^-126, 2^100] (normal: MindSpore's CPU
    kernels read a subnormal as 0)."""
    q = a * _PHI
    return ops.abs(q - q * _ONE_MINUS_EPS)


def ufp_wide(a):
    """ufp for float32 a in [2^-126, float32's largest]: one above 2^64 is brought down by 2^64, exactly,
    and put back."""
    return ops.where(a > _HUGE, ufp(_clamp(a * 2.0**-64, 1.0, _HUGE)) * 2.0**64, ufp(ops.minimum(a, _HUGE)))


def _negative(x):
    """x's sign bit, -0 included."""
    return (x < 0) | (1.0 / x < 0)


class FormatCast(nn.Cell):
    """x rounded to `fmt`, returned in x's float type (float16, bfloat16 and float32 each hold every
    value of the eight-bit formats here). saturate: a magnitude that rounds above fmt.max, infinity
    included, becomes fmt.max (NVIDIA's __NV_SATFINITE); otherwise fmt.overflow, inf or NaN. NaN stays
    NaN. rounding: "even" or "away", in place of the format's own (MX's reference rounds ties away)."""

    def __init__(self, fmt: Format, saturate: bool, rounding: Optional[str] = None):
        super().__init__()
        self.bands = tuple((2.0**lo, 2.0**hi, 2.0**-m) for lo, hi, m in fmt.bands)
        self.lowest_step = 2.0 ** -min(fmt.bands)[2]
        self.floor_binade = 2.0**fmt.emin
        self.max = fmt.max
        self.overflow = float(fmt.overflow)
        self.saturate = saturate
        self.away = (rounding or fmt.rounding) == "away"
        self.signed_zero = fmt.signed_zero
        self.rint = ops.Rint()

    def spacing(self, u):
        """The grid's spacing in the binade whose power of two is u (u >= 2^emin)."""
        if len(self.bands) == 1:
            return u * self.bands[0][2]
        step = ops.full_like(u, self.lowest_step)
        for lo, hi, s in self.bands:
            step = ops.where((u >= lo) & (u <= hi), s, step)
        return u * step

    def construct(self, x):
        dtype = x.dtype
        x = ops.cast(x, mstype.float32)
        a = _clamp(ops.abs(x), _SMALL, _HUGE)
        spacing = self.spacing(ops.maximum(ufp(a), self.floor_binade))
        t = a / spacing
        if self.away:  # not floor(t + 1/2): t + 1/2 rounds up at t = 1/2 - 2^-25
            whole = ops.floor(t)
            y = ops.where(t - whole >= 0.5, whole + 1.0, whole) * spacing
        else:
            y = self.rint(t) * spacing
        y = ops.where(y > self.max, self.max if self.saturate else self.overflow, y)
        if self.signed_zero:
            y = ops.where(_negative(x), -y, y)
        else:
            y = ops.where(x < 0, -y, y) + 0.0  # -0 + 0 is +0: the format's one zero
        return ops.cast(ops.where(ops.isnan(x), float("nan"), y), dtype)


class E8M0Cast(nn.Cell):
    """x as E8M0 (OCP MX v1.0's scale, ml_dtypes' float8_e8m0fnu): the nearest power of two in
    2^-127 ... 2^127, a tie (1.5 * 2^k) to the larger; NaN for x not positive, infinite or NaN, and
    for a value that rounds above 2^127 (the format has no zero, sign or infinity). A float32
    subnormal x (below 2^-126) is read as zero, so NaN, where ml_dtypes gives 2^-127 or 2^-126: some
    of MindSpore's CPU threads read it as zero and others do not, and which one runs the comparison
    depends on what ran before it in the process, so the cast reads it as zero on every one."""

    def construct(self, x):
        x = ops.cast(x, mstype.float32)
        a = _clamp(x, 2.0**-126, _FLOAT32_MAX)
        u = ufp_wide(a)
        y = ops.where(a >= u * 1.5, u * 2.0, u)
        bad = (x < 2.0**-126) | (y > 2.0**127) | ops.isinf(x) | ops.isnan(x)
        return ops.where(bad, float("nan"), y)


class MXCast(nn.Cell):
    """OCP MX v1.0 block scaling along the last axis: each block of `block` elements shares the E8M0
    scale 2^(floor(log2(amax)) - emax_elem), clamped to 2^-127 ... 2^127, and its elements are cast to
    the element format with saturation. A block holding an inf or a NaN comes out NaN, as in the
    reference emulator (microxcaling); so does its scale. A last axis that is not a whole number of
    blocks is padded with zeros, as there. Float32 subnormals are read as zero, as MindSpore's CPU
    kernels read them: a block of them comes out zero (microxcaling's flush_fp32_subnorms=True)."""

    def __init__(self, elem: Format, block: int, rounding: str):
        super().__init__()
        self.block = block
        self.elem_max_binade = 2.0**-elem.emax
        # below it, the scale 2^(floor(log2(amax)) - emax) is clamped to E8M0's smallest, 2^-127, a
        # float32 subnormal: those blocks (an all-zero one too, as in microxcaling) are scaled in two
        # exact steps. From it up, the scale is ufp(amax) * 2^-emax, 2^-126 or more, with no other clamp
        self.lowest_amax = 2.0 ** (elem.emax - 126)
        self.cast = FormatCast(elem, saturate=True, rounding=rounding)

    def scales(self, blocks):
        """The blocks' scales, shape (..., blocks, 1), as (scale, lowest): scale is NaN where a block
        is not finite and 1 where lowest, where the scale is 2^-127."""
        m = ops.nan_to_num(ops.abs(blocks), nan=float("inf"), posinf=float("inf")).max(axis=-1, keepdims=True)
        lowest = m < self.lowest_amax
        scale = ufp_wide(_clamp(m, self.lowest_amax, _FLOAT32_MAX)) * self.elem_max_binade
        scale = ops.where(lowest, 1.0, scale)
        return ops.where(ops.isinf(m), float("nan"), scale), lowest

    def scale_values(self, blocks):
        """The E8M0 scales of `blocks` as float32 values (2^-127 a subnormal)."""
        scale, lowest = self.scales(blocks)
        return ops.where(lowest, 2.0**-127, scale)

    def blocks(self, x):
        n = x.shape[-1]
        pad = (self.block - n % self.block) % self.block
        if pad:
            x = ops.pad(x, (0, pad))
        return x.reshape(x.shape[:-1] + (-1, self.block))

    def construct(self, x):
        dtype = x.dtype
        shape = x.shape
        blocks = self.blocks(ops.cast(x, mstype.float32))
        scale, lowest = self.scales(blocks)
        q = self.cast(ops.where(lowest, blocks * 2.0**127, blocks / scale))
        y = ops.where(lowest, q * 2.0**-63 * 2.0**-64, q * scale)
        y = y.reshape(shape[:-1] + (-1,))
        if y.shape[-1] != shape[-1]:
            y = y[..., :shape[-1]]
        return ops.cast(y, dtype)
