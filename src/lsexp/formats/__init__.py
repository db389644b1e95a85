"""Eight-bit number formats, emulated exactly: OCP FP8 (E4M3, E5M2), MX block scaling over them with
E8M0 scales, and Ascend's HiFloat8. The formats are data (lsexp.formats.spec); the casts are float32
MindSpore ops (lsexp.formats.cast), the same inside a compiled train step and in quantize() below."""

from __future__ import annotations

from typing import Optional

from lsexp.formats.spec import FORMATS, NAMES, SCALE_FORMAT, Format

MX_PREFIX = "mx_"
MX_BLOCK = 32  # OCP MX v1.0's block size for every concrete MX format


def names() -> tuple:
    """Every name quantize() takes: the formats, E8M0, and mx_<element format> for E4M3 and E5M2."""
    return NAMES + tuple(MX_PREFIX + f for f in ("e4m3", "e5m2"))


def quantize(array, format: str, saturate: bool = False, block: int = MX_BLOCK,
             rounding: Optional[str] = None):
    """`array` rounded to `format` and back, as a numpy float32 array: the values the format holds,
    computed by the same MindSpore ops the train step runs.

    format: e4m3, e5m2, hif8, e8m0, or mx_e4m3 / mx_e5m2 (blocks of `block` along the last axis).
    saturate: beyond the largest value, the largest value (else the format's inf or NaN); MX saturates.
    rounding: "even" or "away" in place of the format's own; MX's default is its reference's ("away").
    """
    import numpy as np
    from mindspore import Tensor

    from lsexp.formats import cast

    if format not in names():
        raise ValueError(f"format={format}: no such format; use one of {', '.join(names())}")
    x = Tensor(np.asarray(array, dtype=np.float32))
    if format == SCALE_FORMAT:
        op = cast.E8M0Cast()
    elif format.startswith(MX_PREFIX):
        op = cast.MXCast(FORMATS[format[len(MX_PREFIX):]], block, rounding or "away")
    else:
        op = cast.FormatCast(FORMATS[format], saturate, rounding)
    return op(x).asnumpy()


__all__ = ["FORMATS", "Format", "MX_BLOCK", "names", "quantize"]
