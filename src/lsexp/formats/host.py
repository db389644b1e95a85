"""The casts of lsexp.formats.cast in numpy, operation for operation, for the CPU step's one kernel per
quantised tensor (a MindSpore pyfunc): on CPU, a pyfunc costs less than the twenty MindSpore kernels of
the same cast, each a launch of its own. GPU and Ascend run the MindSpore ops; a test checks that both
give the same bits (numpy keeps float32 subnormals, which MindSpore's CPU kernels read as zero: the two
differ there only, below every format's smallest value, where both give zero)."""

from __future__ import annotations

import math

import numpy as np

from lsexp.formats.spec import Format

_F = np.float32
_PHI, _ONE_MINUS_EPS = _F(2**23 + 1), _F(1.0 - 2.0**-24)
_HUGE, _SMALL = _F(2.0**64), _F(2.0**-100)
_FLOAT32_MAX = np.finfo(np.float32).max


def ufp(a: np.ndarray) -> np.ndarray:
    q = a * _PHI
    return np.abs(q - q * _ONE_MINUS_EPS)


def ufp_wide(a: np.ndarray) -> np.ndarray:
    return np.where(a > _HUGE, ufp(np.clip(a * _F(2.0**-64), _F(1), _HUGE)) * _F(2.0**64),
                    ufp(np.minimum(a, _HUGE)))


class FormatCastHost:
    """lsexp.formats.cast.FormatCast on a numpy array."""

    def __init__(self, fmt: Format, saturate: bool, rounding=None):
        self.bands = [(_F(2.0**lo), _F(2.0**hi), _F(2.0**-m)) for lo, hi, m in fmt.bands]
        self.lowest_step = _F(2.0 ** -min(fmt.bands)[2])
        self.floor_binade = _F(2.0**fmt.emin)
        self.max = _F(fmt.max)
        self.overflow = _F(float(fmt.overflow))
        self.saturate = saturate
        self.away = (rounding or fmt.rounding) == "away"
        self.signed_zero = fmt.signed_zero

    def spacing(self, u):
        if len(self.bands) == 1:
            return u * self.bands[0][2]
        step = np.full_like(u, self.lowest_step)
        for lo, hi, s in self.bands:
            step = np.where((u >= lo) & (u <= hi), s, step)
        return u * step

    def __call__(self, x: np.ndarray) -> np.ndarray:
        dtype = x.dtype
        with np.errstate(all="ignore"):
            x = x.astype(_F, copy=False)
            a = np.clip(np.abs(x), _SMALL, _HUGE)
            spacing = self.spacing(np.maximum(ufp(a), self.floor_binade))
            t = a / spacing
            if self.away:
                whole = np.floor(t)
                y = np.where(t - whole >= _F(0.5), whole + _F(1), whole) * spacing
            else:
                y = np.rint(t) * spacing
            y = np.where(y > self.max, self.max if self.saturate else self.overflow, y)
            if self.signed_zero:
                y = np.where(np.signbit(x), -y, y)
            else:
                y = np.where(x < 0, -y, y) + _F(0)
            y = np.where(np.isnan(x), _F(np.nan), y)
        return y.astype(dtype, copy=False)


class MXCastHost:
    """lsexp.formats.cast.MXCast on a numpy array. record(x, y, scaled, limit, scale): told what each
    call did (the elements as they met the format, and the largest block scale)."""

    def __init__(self, elem: Format, block: int, rounding: str, record=None):
        self.record = record
        self.limit = _F(elem.max)
        self.block = block
        self.elem_max_binade = _F(2.0**-elem.emax)
        # below it, E8M0's smallest scale 2^-127 (an all-zero block too), scaled in two exact steps as
        # MXCast scales it: inside the train step this kernel may run where subnormals read as zero
        self.lowest_amax = _F(2.0 ** (elem.emax - 126))
        self.cast = FormatCastHost(elem, saturate=True, rounding=rounding)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        dtype, shape = x.dtype, x.shape
        with np.errstate(all="ignore"):
            x = x.astype(_F, copy=False)
            pad = (self.block - shape[-1] % self.block) % self.block
            if pad:
                x = np.concatenate([x, np.zeros(shape[:-1] + (pad,), _F)], axis=-1)
            blocks = x.reshape(shape[:-1] + (-1, self.block))
            m = np.nan_to_num(np.abs(blocks), nan=np.inf, posinf=np.inf).max(axis=-1, keepdims=True)
            lowest = m < self.lowest_amax
            scale = ufp_wide(np.clip(m, self.lowest_amax, _FLOAT32_MAX)) * self.elem_max_binade
            scale = np.where(np.isinf(m), _F(np.nan), np.where(lowest, _F(1), scale))
            scaled = np.where(lowest, blocks * _F(2.0**127), blocks / scale)
            q = self.cast(scaled)
            y = np.where(lowest, q * _F(2.0**-63) * _F(2.0**-64), q * scale)
            if self.record is not None:
                values = np.where(lowest, 2.0**-127, scale.astype(np.float64))
                finite = values[np.isfinite(values)]
                self.record(blocks, y, scaled, self.limit, float(finite.max()) if finite.size else math.nan)
            y = y.reshape(shape[:-1] + (-1,))[..., :shape[-1]]
        return y.astype(dtype, copy=False)


class ScaledCastHost:
    """x * scale cast, times 1 / scale, with the scale from x's amax (current scaling) when `current`:
    lsexp.precision's quantiser in one kernel."""

    def __init__(self, fmt: Format, record=None):
        self.cast = FormatCastHost(fmt, saturate=True)
        self.fmt_max = _F(fmt.max)
        self.record = record

    def current_scale(self, x: np.ndarray) -> np.float32:
        with np.errstate(all="ignore"):
            bits = np.abs(x.astype(_F, copy=False))
            a = _F(np.inf) if np.isnan(bits).any() else (bits.max() if bits.size else _F(0))
            if not (a > 0 and np.isfinite(a)):
                return _F(1)
            return _F(min(self.fmt_max / np.maximum(a, _F(2.0**-126)), _FLOAT32_MAX))

    def __call__(self, x: np.ndarray, scale) -> np.ndarray:
        dtype = x.dtype
        scale = _F(np.asarray(scale).reshape(()))
        with np.errstate(all="ignore"):
            x = x.astype(_F)
            scaled = x * scale
            # finite values saturate; an inf stays one, so that the loss scale's overflow check sees it
            y = np.where(np.isinf(x), x, self.cast(scaled) * (_F(1) / scale))
        if self.record is not None:
            self.record(x, y, scaled, self.fmt_max, float(scale))
        return y.astype(dtype, copy=False)
