"""The reference lsexp's HiFloat8 (HiF8) cast is checked against: the format of Luo et al.,
"Ascend HiFloat8 Format for Deep Learning", arXiv:2409.16626, written out one value at a time in
plain Python (no vectorisation, no bit tricks beyond reading the fields).

What was read, and what was not
-------------------------------
The paper's full text (PDF or HTML, v1 of 25 Sep 2024 or v2) could NOT be opened where this file was
written: the machine has no network, and the stored copies of the paper there are its abstract pages
only (v1's abstract, and v2's as 2409.16626v2). So no section, table or equation number of the paper's
body is quoted below; where a number is given, it says where it comes from. The facts used come from:

[A]  The paper's abstract (v1 and v2 say the same): tapered precision; for normal values 7 exponent
     values with a 3-bit mantissa, 8 with a 2-bit mantissa and 16 with a 1-bit mantissa; denormals add
     7 powers of 2, from 31 to 38 binades; all special values are encoded, except that +0 and -0 share
     one bit pattern; "definition and rounding methods" (rounding "TA" and "HR") are in the body.
[F1] The paper's Fig. 1 (layout figure: sign, prefix-coded dot field, exponent with an implicit leading
     magnitude bit drawn in red, mantissa), as described by the Wikipedia draft "Draft:HiFloat8", which
     cites the paper for it, and by Huawei's own description of the format (hicann/amct,
     docs/zh/context/hifloat8_quantization.md), which reproduces the dot-code table, the normal and
     denormal encodings and the special-value table below and refers to the red digits of the figure.
[S]  The special-value bit patterns, as given in [F1]'s Huawei description and in the en_dtypes README
     (which cites arxiv.org/pdf/2409.16626 for the format): Zero 0b0'0000'000, NaN 0b1'0000'000,
     Inf 0bS'11'0111'1.
Decoding below follows [A], [F1] and [S], which agree with each other. The conversion (encode) is the
neighbour rule of the brief (see "encode" below), not a transcription of a procedure in the paper,
because the paper's rounding section could not be read. Re-check the points listed under "Left
undefined" against the paper's text when it can be opened.

Layout [F1]
-----------
bit 7 is the sign S; bits 6..0 hold, from the top: the dot field (a prefix code), then the exponent
field (as many bits as the dot value D), then the mantissa field (what is left):

    dot code   D     exponent bits   mantissa bits   exponent E
    11         4     4               1               +-8 .. +-15   (16 values)
    10         3     3               2               +-4 .. +-7    (8 values)
    01         2     2               3               +-2 .. +-3    (4 values)
    001        1     1               3               +-1           (2 values)
    0001       0     0               3               0             (1 value)
    0000       DML   0               3               -16 .. -22 (denormal, see below)

Exponent field (D >= 1): sign-magnitude; its top bit is the exponent's sign (1 = negative), the other
D-1 bits are the magnitude below an implicit leading 1, so the magnitude is 1 followed by those bits:
D=1 gives |E| = 1, D=2 gives 2..3, D=3 gives 4..7, D=4 gives 8..15, and no exponent is encoded twice.
D = 0 stores no exponent bits and means E = 0.

Normal value: X = (-1)^S * 2^E * (1 + M / 2^m), with M the mantissa field and m its width.  [F1]
Denormal value (dot 0000, M = 1..7): X = (-1)^S * 2^(M - 23), i.e. 2^-22 .. 2^-16, no fraction bits.

So E = -22 .. 15, 38 binades [A]: 7 exponents with 3 mantissa bits (E in -3..3), 8 with 2 (|E| 4..7),
16 with 1 (|E| 8..15), and 7 denormal ones.

Special values [S]:
    0x00  S=0, dot 0000, M=000   zero (the only zero; there is no -0)
    0x80  S=1, dot 0000, M=000   NaN (the only NaN)
    0x6F  S=0, dot 11, E field 0111 (E=+15), M=1   +Inf
    0xEF  S=1, dot 11, E field 0111 (E=+15), M=1   -Inf
Inf takes the place of +-2^15 * 1.5, so MAX = 2^15 = 32768, MIN_NORMAL = 2^-15 (dot 11, E=-15, M=0),
MIN_DENORMAL = 2^-22. 256 codes = 1 zero + 1 NaN + 2 Inf + 2 * 126 finite non-zero values.

encode
------
Not a transcription (the paper's conversion text was not available): for a float32 x, take the two
representable magnitudes that bracket |x| and apply TA, rounding half away from zero: the larger
magnitude if |x| is at or above their midpoint, the smaller one otherwise; then put back the sign.
Inside one binade this is the same as rounding the float32 significand to the binade's mantissa width
with half-away rounding. The bracketing list is 0, the 252 finite non-zero values' magnitudes, and the
Inf code placed at the magnitude it displaces, 1.5 * 2^15.

Left undefined by the paper, and chosen here (as far as could be checked: see above):
- Overflow: any |x| >= 1.25 * 2^15 = 40960 (the midpoint between MAX and the Inf slot, the tie
  included) encodes to +-Inf (0x6F / 0xEF); |x| < 40960 rounds to at most MAX. Why: [A] says HiF8
  encodes Inf, and Inf sits where 1.5 * 2^15 would be, so TA applied to the fields carries there;
  this is a non-saturating cast. A saturating cast (clip to +-MAX) would be the other choice.
- Float32 +-Inf encodes to +-Inf; float32 NaN (any payload, any sign) encodes to 0x80, the one NaN;
  decode(0x80) is float('nan'). There are no NaN payloads to keep.
- Underflow: |x| < 2^-23 (half of MIN_DENORMAL) encodes to zero; |x| = 2^-23 is a tie between 0 and
  MIN_DENORMAL and TA takes it away from zero, to +-2^-22. Nothing is flushed to zero above that.
- Sign of zero: HiF8 has one zero [A]; +0.0, -0.0 and negative values that round to zero all encode to
  0x00, and decode(0x00) is +0.0.
- Ties at the denormal boundary: between 2^-16 (largest denormal) and 2^-15 (MIN_NORMAL), and
  between neighbouring denormals 2^-k and 2^-(k-1), the tie is the arithmetic midpoint (1.5 * 2^-k),
  which TA takes to the larger magnitude, as for every other pair of neighbours.
- Ties where the mantissa width changes (e.g. 15 = 2^3 * 1.875 and 16 = 2^4): the arithmetic
  midpoint of the two neighbours (15.5), taken away from zero (16).
- The input is rounded to float32 first (numpy.float32(x)), since the brief's cast is from float32;
  all neighbour values and midpoints are exact in Python floats.
"""

import math

import numpy as np

MAX = 2.0 ** 15            # 32768: dot 11, E = +15, M = 0 (code 0x6E)
MIN_NORMAL = 2.0 ** -15    # dot 11, E = -15, M = 0 (code 0x7E)
MIN_DENORMAL = 2.0 ** -22  # dot 0000, M = 001 (code 0x01)

NAN_CODE = 0x80
POS_INF_CODE = 0x6F
NEG_INF_CODE = 0xEF
ZERO_CODE = 0x00

# Dot prefix codes, tried in this order on bits 6..3 of the code (a prefix code, so at most one
# matches): (code as a bit string, D; None is the denormal mode "DML").
_DOTS = [("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0), ("0000", None)]


def fields(code: int):
    """(sign bit, D or None for denormal, exponent field bits as a string, mantissa field bits as a
    string) of an 8-bit code, read left to right as in the layout table."""
    bits = format(code, "08b")
    sign = int(bits[0])
    rest = bits[1:]
    for prefix, dot in _DOTS:
        if rest.startswith(prefix):
            rest = rest[len(prefix):]
            width = dot if dot is not None else 0
            return sign, dot, rest[:width], rest[width:]
    raise AssertionError("the dot prefixes cover every 4-bit pattern")


def exponent(dot: int, field: str) -> int:
    """E from a D-bit sign-magnitude exponent field with the implicit leading magnitude 1."""
    if dot == 0:
        return 0
    negative = field[0] == "1"
    magnitude = int("1" + field[1:], 2)
    return -magnitude if negative else magnitude


def decode(code: int) -> float:
    """The value of an 8-bit HiF8 code (0..255)."""
    if code == NAN_CODE:
        return float("nan")
    if code == POS_INF_CODE:
        return float("inf")
    if code == NEG_INF_CODE:
        return float("-inf")
    sign, dot, e_bits, m_bits = fields(code)
    s = -1.0 if sign else 1.0
    mantissa = int(m_bits, 2)
    if dot is None:                      # denormal mode
        if mantissa == 0:
            return 0.0                   # 0x00; 0x80 (NaN) was handled above
        return s * 2.0 ** (mantissa - 23)
    e = exponent(dot, e_bits)
    return s * 2.0 ** e * (1.0 + mantissa / 2 ** len(m_bits))


CODES = [(code, decode(code)) for code in range(256)]

# Positive magnitudes to round between, with the code each one encodes to: zero, every finite positive
# value, and the +Inf code at the magnitude it displaces (1.5 * 2^15).
_LADDER = sorted([(0.0, ZERO_CODE)]
                 + [(v, c) for c, v in CODES if math.isfinite(v) and v > 0]
                 + [(1.5 * MAX, POS_INF_CODE)])


def encode(x: float) -> int:
    """The HiF8 code a float32 value converts to, rounding half away from zero (TA)."""
    x = float(np.float32(x))
    if math.isnan(x):
        return NAN_CODE
    negative = x < 0
    a = abs(x)
    if math.isinf(a):
        return NEG_INF_CODE if negative else POS_INF_CODE
    if a >= _LADDER[-1][0]:              # at or beyond the Inf slot itself
        return NEG_INF_CODE if negative else POS_INF_CODE
    # The two neighbours: lo <= a < hi.
    for i in range(len(_LADDER) - 1):
        lo, lo_code = _LADDER[i]
        hi, hi_code = _LADDER[i + 1]
        if lo <= a < hi:
            break
    if a == lo:
        code = lo_code
    elif a >= (lo + hi) / 2:             # TA: a tie goes to the larger magnitude
        code = hi_code
    else:
        code = lo_code
    if code == ZERO_CODE:
        return ZERO_CODE                 # one zero, no sign
    return code | 0x80 if negative else code


def quantize(values) -> np.ndarray:
    """decode(encode(v)) for every element, as float32, in the input's shape."""
    arr = np.asarray(values, dtype=np.float32)
    out = [decode(encode(v)) for v in arr.reshape(-1).tolist()]
    return np.array(out, dtype=np.float32).reshape(arr.shape)
