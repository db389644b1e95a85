"""The reference lsexp's HiFloat8 (HiF8) cast is checked against: the format of Luo et al.,
"Ascend HiFloat8 Format for Deep Learning", arXiv:2409.16626, written out one value at a time in
plain Python (no vectorisation, no bit tricks beyond reading the fields).

What was read
-------------
The paper's full text, as a Markdown conversion of the PDF held in this project's reference library
(sections 1 to 6, Tables 1 to 5; the copy does not mark v1 or v2, and v1 and v2 have the same abstract).
Its equations (1) to (3) were not converted; (1) and (2) are written below from the sentences and the
table rows around them, which pin them down. Sections, tables and quotes below are the paper's:

[2.1] Section 2.1 and Table 1: four fields, sign, dot, exponent, mantissa. "Sign Filed: 1 bit ... 1
      indicates the negative sign". "Dot Field: 2 to 4 bits, used to code the five D values (0 to 4) and
      the sign of DenorMaL (DML)". "Exponent Field: D bits (an implicit leading magnitude bit with value
      1 unstored) ... uses sign-magnitude code ... the most significant bit (MSB) of the magnitude is
      fixed to 1 ... 1 means negative sign". "When D is zero, Em dose not occupy any bit width,
      indicating that the exponent value equals zero." "Mantissa Field: 1 to 3 bits (an implicit
      leading significand bit with value 1 unstored) ... For the denormal value of HiF8, mantissa
      represents the extended exponents in a biased form."
[T2]  Table 2, "Unconventional Prefix Code for Dot Field": 11 -> 4, 10 -> 3, 01 -> 2, 001 -> 1,
      0001 -> 0, 0000 -> DML.
[T3]  Table 3, "HiF8 Code-Value Mapping Details": E = 0 (dot 0), +-1 (1), +-[2, 3] (2), +-[4, 7] (3),
      +-[8, 15] (4); mantissa widths 3, 3, 3, 3, 2, 1 (DML, 0, 1, 2, 3, 4).
[E]   After equation (1): "2 bit-patterns with the largest absolute value (2^15 x 1.5) should be
      interpreted specially for Infinities." After equation (2): "M in [1, 7], which offers 7 addtional
      exponent values of [-22, -16]. 2 bit-patterns with M = 0 should be interpreted specially for Zero
      and NaN".
[T4]  Table 4, HiF8 column: Infinities S1101111, NaN 10000000, Zero 00000000, max positive normal
      01101110 = 2^15, min positive normal 01111110 = 2^-15, max positive denormal 00000111 = 2^-16, min
      positive denormal 00000001 = 2^-22; "does not distinguish between positive zero and negative zero".
[3]   Section 3: "we use only rounding half to away in the forward pass, and rounding half to away or
      hybrid rounding in the backward pass ... HiF8 also provides two options: saturation to boundary
      upon overflow, and NaN saturation to zero."
[3.1] Section 3.1: "both TE and TA would carry as long as the MSB of the discarded bits is 1" (TA:
      rounding half away from zero, on the source's significand bits).
Hybrid rounding (section 3.2, a stochastic rounding for the backward pass) is not transcribed: lsexp
casts with TA only, as the paper's forward pass and all its language-model runs do.

Layout [2.1], [T2], [T3]
------------------------
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

Normal value, equation (1): X = (-1)^S * 2^E * (1 + M / 2^m), with M the mantissa field and m its width
(the implicit leading 1 and "the fractional bits (to the right of the binary point)", [2.1]).
Denormal value, equation (2) (dot 0000, M = 1..7): X = (-1)^S * 2^(M - 23), i.e. 2^-22 .. 2^-16, no
fraction bits ([E]; [T4]'s 00000001 = 2^-22 and 00000111 = 2^-16 fix the bias at 23).

So E = -22 .. 15, 38 binades (the abstract): 7 exponents with 3 mantissa bits (E in -3..3), 8 with 2
(|E| 4..7), 16 with 1 (|E| 8..15), and 7 denormal ones.

Special values [E], [T4]:
    0x00  S=0, dot 0000, M=000   zero (the only zero; there is no -0)
    0x80  S=1, dot 0000, M=000   NaN (the only NaN)
    0x6F  S=0, dot 11, E field 0111 (E=+15), M=1   +Inf
    0xEF  S=1, dot 11, E field 0111 (E=+15), M=1   -Inf
Inf takes the place of +-2^15 * 1.5, so MAX = 2^15 = 32768, MIN_NORMAL = 2^-15 (dot 11, E=-15, M=0),
MIN_DENORMAL = 2^-22. 256 codes = 1 zero + 1 NaN + 2 Inf + 2 * 126 finite non-zero values.

encode
------
TA [3], [3.1]: the source's significand keeps as many fraction bits as the mantissa width of its
binade, and carries when the most significant discarded bit is 1, which is rounding half away from
zero. Written here as the neighbour rule it amounts to: for a float32 x, take the two representable
magnitudes that bracket |x|, the larger one if |x| is at or above their midpoint, else the smaller one;
then put back the sign. The bracketing list is 0, the 252 finite non-zero values' magnitudes, and the
Inf code at the magnitude it displaces, 1.5 * 2^15 [E].

What the paper's text leaves to the reader, and how it is read here (Huawei's own converter, ge's
base/common/math/hif8_t.cc, reads it the same way on every code, midpoint and neighbour of one):
- Overflow: [3] makes "saturation to boundary upon overflow" an option, so the default cast does not
  saturate: any |x| >= 1.25 * 2^15 = 40960 (the midpoint between MAX and the Inf slot, the tie
  included) encodes to +-Inf (0x6F / 0xEF), where TA carries into the Inf pattern; |x| < 40960 rounds
  to at most MAX. With the option, every |x| beyond MAX is +-MAX. The option "NaN saturation to zero"
  is not modelled.
- Float32 +-Inf encodes to +-Inf; float32 NaN (any payload, any sign) encodes to 0x80, the one NaN;
  decode(0x80) is float('nan'). There are no NaN payloads to keep.
- Underflow: |x| < 2^-23 (half of MIN_DENORMAL) encodes to zero; |x| = 2^-23 is a tie between 0 and
  MIN_DENORMAL and TA takes it away from zero, to +-2^-22. Nothing is flushed to zero above that.
- Sign of zero: HiF8 has one zero [T4]; +0.0, -0.0 and negative values that round to zero all encode
  to 0x00 (10000000 is NaN), and decode(0x00) is +0.0.
- Ties at the denormal boundary: between 2^-16 (largest denormal) and 2^-15 (MIN_NORMAL), and
  between neighbouring denormals 2^-k and 2^-(k-1), the tie is the arithmetic midpoint (1.5 * 2^-k),
  which TA takes to the larger magnitude, as for every other pair of neighbours.
- Ties where the mantissa width changes (e.g. 15 = 2^3 * 1.875 and 16 = 2^4): the arithmetic
  midpoint of the two neighbours (15.5), taken away from zero (16).
- The input is rounded to float32 first (numpy.float32(x)): lsexp's cast is from float32, one of the
  paper's "high-precision formats".
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


MAX_CODE = 0x6E


def encode(x: float, saturate: bool = False) -> int:
    """The HiF8 code a float32 value converts to, rounding half away from zero (TA); with `saturate`,
    [3]'s "saturation to boundary upon overflow": what would be +-Inf is +-MAX."""
    code = _encode(x)
    if saturate and code in (POS_INF_CODE, NEG_INF_CODE):
        code = MAX_CODE | (code & 0x80)
    return code


def _encode(x: float) -> int:
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


def quantize(values, saturate: bool = False) -> np.ndarray:
    """decode(encode(v, saturate)) for every element, as float32, in the input's shape."""
    arr = np.asarray(values, dtype=np.float32)
    out = [decode(encode(v, saturate)) for v in arr.reshape(-1).tolist()]
    return np.array(out, dtype=np.float32).reshape(arr.shape)
