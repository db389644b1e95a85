"""What defines each eight-bit format, as plain data: the grid of values it holds and what a conversion
does at its edges. No MindSpore here, so that the CLI and the config's checks read it cheaply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

# The IEEE types the steps compute in. float16's smallest subnormal and largest finite value: a scaled
# gradient below the first flushes to zero, above the second overflows (Micikevicius et al. 2018).
FP16_TINY, FP16_MAX = 2.0**-24, 65504.0
BF16_MAX = (2 - 2.0**-7) * 2.0**127  # 0x7F7F
FP32_MAX = (2 - 2.0**-23) * 2.0**127


@dataclass(frozen=True)
class Format:
    """A float format with one sign bit, as the grid of magnitudes it holds.

    bands: (lowest exponent, highest exponent, mantissa bits) of its binades, highest first; a value in
    binade e (2^e <= |x| < 2^(e+1)) keeps the band's mantissa bits. Below the lowest binade the grid goes
    on with that binade's spacing down to zero (IEEE's subnormals).
    max: the largest finite magnitude.
    overflow: what a non-saturating conversion makes of a magnitude that rounds above max ("inf" or
    "nan"); a saturating one makes it max, and inf too (NVIDIA's __NV_SATFINITE).
    rounding: "even" (round to nearest, ties to even) or "away" (ties away from zero).
    signed_zero: False where the format has one zero, so that -0 and a negative value that rounds to zero
    come out +0.
    """

    name: str
    bands: Tuple[Tuple[int, int, int], ...]
    max: float
    overflow: str
    rounding: str
    signed_zero: bool = True
    note: str = ""

    @property
    def emin(self) -> int:
        return min(lo for lo, _, _ in self.bands)

    @property
    def emax(self) -> int:
        return max(hi for _, hi, _ in self.bands)

    @property
    def tiny(self) -> float:
        """The smallest positive magnitude."""
        lowest = min(self.bands)
        return 2.0 ** (lowest[0] - lowest[2])


# OCP 8-bit Floating Point Specification (OFP8) rev. 1.0, as ml_dtypes' float8_e4m3fn and float8_e5m2:
# E4M3 has no infinity (S.1111.111 is its NaN), so its binade 8 holds 256 ... 448 only.
E4M3 = Format("e4m3", ((-6, 8, 3),), 448.0, "nan", "even", note="OCP E4M3 (float8_e4m3fn)")
E5M2 = Format("e5m2", ((-14, 15, 2),), 57344.0, "inf", "even", note="OCP E5M2 (float8_e5m2)")
# HiFloat8 (arXiv 2409.16626): tapered precision, 3, 2 or 1 mantissa bits by the exponent's magnitude,
# denormals that are the powers of two 2^-16 ... 2^-22, one zero; conversion rounds ties away (the
# paper's TA). Binade 15 holds 2^15 only: the code of 1.5 * 2^15 is infinity (docs/eight_bit.md).
HIF8 = Format("hif8", ((-3, 3, 3), (4, 7, 2), (-7, -4, 2), (8, 15, 1), (-15, -8, 1), (-22, -16, 0)),
              32768.0, "inf", "away", signed_zero=False, note="Ascend HiFloat8")

FORMATS = {f.name: f for f in (E4M3, E5M2, HIF8)}
# MX's shared scale (OCP Microscaling Formats v1.0, E8M0): the powers of two 2^-127 ... 2^127 and NaN
SCALE_FORMAT = "e8m0"
NAMES = tuple(FORMATS) + (SCALE_FORMAT,)
