"""Microsoft microxcaling's MX quantisation (the reference emulator of the OCP Microscaling (MX) spec v1.0),
transcribed to numpy float32 as the reference for lsexp's MXFP8. Restricted to what lsexp needs: element
formats fp8_e4m3 and fp8_e5m2, an E8M0 scale (scale_bits=8) shared by each block of `block_size` elements
along one axis, shared_exp_method "max", the pure-PyTorch path (custom_cuda=False, MxSpecs' default).

Read from github.com/microsoft/microxcaling at commit 7bc41952de394f5cc5e782baf132e7c7542eb4e4
(2024-08-19, "Merge pull request #26", the newest commit of the repository; the newest commit touching
these files is fe332892a1b9, and mx/mx_ops.py is unchanged since the initial commit 3b429a84b2fb), and
read against it again line by line at that commit:
- mx/mx_ops.py: _shared_exponents, _reshape_to_blocks, _undo_reshape_to_blocks, _quantize_mx;
- mx/elemwise_ops.py: _quantize_elemwise_core, _round_mantissa, _safe_lshift, _safe_rshift;
- mx/formats.py: FP32_EXPONENT_BIAS, FP32_MIN_NORMAL, _get_min_norm, _get_format_params;
- mx/specs.py: MxSpecs defaults (only for the defaults noted below).

The algorithm, per block (torch float32 ops -> numpy float32 ops; every intermediate stays float32):
  amax       = max(|A|) over the block (a NaN anywhere makes it NaN; torch.max and np.max propagate NaN)
  shared_exp = floor(log2(amax + FP32_MIN_NORMAL * (amax == 0)))      FP32_MIN_NORMAL = 2**-126
               (_shared_exponents is called with ebits=0, so it clamps nothing itself)
  if flush_fp32_subnorms: A = A * (shared_exp > -127)                 (before emax is subtracted)
  shared_exp = shared_exp - emax                                      emax of the element format
  shared_exp[shared_exp > 127] = NaN; shared_exp[shared_exp < -127] = -127    scale_emax = 2**(8-1)-1
  A = A / 2**shared_exp
  A = _quantize_elemwise_core(A, bits=mbits, exp_bits=ebits, max_norm, round=round,
                              allow_denorm=True, saturate_normals=True)
  A = A * 2**shared_exp
and _quantize_elemwise_core, per element x:
  private_exp = floor(log2(|x| + (x == 0))), clipped below at min_exp = -(2**(ebits-1)) + 2
                (-6 for e4m3, -14 for e5m2: the denormal range shares the smallest normal exponent)
  out = x / 2**private_exp * 2**(mbits-2)                             (_safe_lshift)
  out = _round_mantissa(out, round):
        "nearest": sign(out) * floor(|out| + 0.5)                     (ties away from zero)
        "even":    sign(out) * (floor(|out| + 0.5) - ((|out| - 0.5) % 2 == 0))   (ties to even)
  out = out / 2**(mbits-2) * 2**private_exp                           (_safe_rshift)
  out = clamp(out, -max_norm, max_norm)          (saturate_normals=True; if False: +-inf where above)
  out[x == inf] = inf; out[x == -inf] = -inf; (out[x == NaN] = NaN never matches: NaN != NaN)
mbits follows microxcaling's convention: it counts the sign bit and the implicit leading 1, i.e. the
trailing mantissa bits + 2 (fp8_e4m3: mbits=5 for 3 stored mantissa bits; fp8_e5m2: mbits=4 for 2). The
mantissa is therefore rounded to mbits-2 fraction bits. fp8_e4m3's emax is 2**(4-1) = 8 (not 7: E4M3 has
no inf, its top exponent holds normals), max_norm = 2**8 * 1.75 = 448; fp8_e5m2's emax is 15, max_norm =
2**15 * 7/4 = 57344.

Defaults: _quantize_mx(round="nearest", flush_fp32_subnorms=False, custom_cuda=False); quantize_mx_op's
round defaults to "nearest" as well, and MxSpecs defaults "round" and every "round_mx_*" (linear.py passes
round_mx_output) to "nearest", and "mx_flush_fp32_subnorms" to False. "nearest" is round half AWAY from
zero, not round-half-to-even; "even" is round half to even. _quantize_mx always passes
saturate_normals=True and allow_denorm=True.

How special blocks come out (all follow from the formulas, none is special-cased):
- all-zero block: amax = 0 -> shared_exp = log2(2**-126) - emax = -134 (e4m3) / -141 (e5m2), clamped to
  -127; the elements stay 0 (a -0.0 comes out +0.0: sign(-0.0) = 0). Likewise any block with
  amax < 2**(emax-127) gets shared_exp -127.
- a block holding +-inf (and no NaN): amax = inf -> shared_exp = inf > 127 -> NaN, so A / 2**NaN is NaN
  for every element, and the whole block, the inf included, comes out NaN (the inf restore in
  _quantize_elemwise_core looks at the already-NaN scaled values and never fires).
- a block holding a NaN: amax = NaN -> shared_exp NaN -> the whole block is NaN.
- a finite float32 block never overflows the scale (floor(log2(amax)) <= 127, minus emax >= 8).
- the block maximum may saturate: amax / 2**shared_exp lies in [2**emax, 2**(emax+1)), and whatever lies
  in [max_norm, 2**(emax+1)) there (e4m3: [448, 512)) comes out max_norm * 2**shared_exp.

Float32 artefacts of the pure-PyTorch path, both kept: this is microxcaling as it computes, and an exact
cast (the OCP spec's, lsexp's) differs from it exactly where these two rules say (tests/test_formats.py
predicts each such element from the rules and checks that lsexp differs there and nowhere else):
(a) floor(log2(x)) is taken of a float32 log2. The float32 log2 of an x just below a power of two 2**k
  rounds up to k when the true log2(x) = k - g lies within half a float32 spacing of k, g < ulp/2 with
  ulp = k - nextafter(k, -inf) in float32: for 3 <= k <= 128 and -131 <= k <= -2 (never for k = -1, 0,
  1, 2, nor for k < -131, where float32's subnormals are too far apart), the top 1 to 44 float32 values
  below 2**k (x = 8 * (1 - 2**-24) gives 3, not 2; below 2**64, 22 values; below 2**128, 44, float32's
  largest among them). For the block's amax this makes the shared exponent one larger, unless both are
  clamped to -127. E.g. e4m3, amax = 2**-18 * (1 - 2**-24): shared exponent -26
  where the exact one is -27; that element comes out 2**-18, where an exact cast saturates it to
  448 * 2**-27. And float32's largest value comes out inf (2**128) in both element formats. The element
  private exponent is taken the same way, but there it never changes a result: an element just below
  2**j rounds to 2**j on either exponent's grid (or to the same clamp or the same clipped exponent).
  Here the float32 log2 is float64's log2 rounded to float32, i.e. correctly rounded. On every float32
  value within 64 spacings below each power of two 2**-149 ... 2**128 (7456 of them round up to k) it
  gives the same floor as numpy's float32 log2, glibc 2.36's log2f (torch's scalar path) and Sleef
  3.5.1's Sleef_log2f8_u10avx2 and Sleef_log2f16_u10avx512f (the vectorised log2 of torch's CPU
  kernels; Debian's libsleef, torch builds its own), so which values round up does not depend on which of
  them torch ran.
(b) "nearest" takes floor(|t| + 0.5) with the sum in float32, t the element in units of its grid step
  (after _safe_lshift). The sum rounds up to the integer n + 1 where t lies within half a float32 spacing
  (the spacing just below n + 1) under n + 1/2. Below each boundary n + 1/2 with n >= 1 no float32 t lies
  that close (t's own spacing is at least as large), so the only such t is 0.5 - 2**-25 (float32's value
  just below 0.5): it becomes 1.0 and rounds up to the element format's smallest step, where the exact
  rounding is 0. "even" rounds it up as well: floor(t + 0.5) = 1 and its tie mask is 0, since
  (t - 0.5) % 2 = -2**-25 + 2 rounds to 2.0 in float32 (fmod then + 2, as torch.remainder and numpy's %
  compute it; a - b * floor(a / b) gives 2.0 too). E.g. e4m3,
  a block [1.0, 2**-18 * (1 - 2**-24), 0, ...]: shared exponent -8, the second element has
  t = 2**-18 * (1 - 2**-24) / 2**-8 / 2**-6 * 2**3 = 0.5 - 2**-25 and comes out 2**-17, not 0.

block_size=0 means, as in _quantize_mx, one shared exponent for the whole axis. Along `axis` the array is
zero-padded to a multiple of block_size (as _reshape_to_blocks does; zeros never change a block's amax)
and the padding is dropped again.
"""

import numpy as np

f32 = np.float32

FP32_EXPONENT_BIAS = 127
FP32_MIN_NORMAL = 2.0 ** (-FP32_EXPONENT_BIAS + 1)
SCALE_BITS = 8  # E8M0; quantize_mx_op maps mx_specs["scale_bits"] == 0 to 8

# mx/formats.py _get_format_params (mbits includes the sign and the implicit bit); min_norm = _get_min_norm
FORMATS = {
    "fp8_e4m3": dict(ebits=4, mbits=5, emax=8, max_norm=448.0, min_norm=2.0 ** -6),
    "fp8_e5m2": dict(ebits=5, mbits=4, emax=15, max_norm=57344.0, min_norm=2.0 ** -14),
}

_ROUNDS = ("nearest", "even")


def _format(elem_format):
    try:
        return FORMATS[elem_format.lower()]
    except KeyError:
        raise ValueError(f"unsupported elem_format {elem_format!r}; one of {sorted(FORMATS)}") from None


def _floor_log2(x):
    """torch.floor(torch.log2(x)) of a float32 array x >= 0 (or NaN/inf), as float32: log2 rounded to
    float32 (correctly rounded; see the module's docstring, artefact (a)), then floored."""
    with np.errstate(all="ignore"):
        return np.floor(np.log2(x.astype(np.float64)).astype(f32))


def _exp2(e):
    """2**e (torch's `2**tensor`) for float32 e holding integers, inf or NaN; exact, float32."""
    with np.errstate(all="ignore"):
        return np.exp2(e.astype(np.float64)).astype(f32)


def _round_mantissa(A, round):
    """mx/elemwise_ops.py _round_mantissa (clamp=False), modes "nearest" and "even"."""
    if round == "nearest":
        return np.sign(A) * np.floor(np.abs(A) + f32(0.5))
    if round == "even":
        absA = np.abs(A)
        # find 0.5, 2.5, 4.5 ...
        maskA = ((absA - f32(0.5)) % f32(2) == f32(0)).astype(f32)
        return np.sign(A) * (np.floor(absA + f32(0.5)) - maskA)
    raise ValueError(f"unsupported round {round!r}; one of {_ROUNDS}")


def _quantize_elemwise_core(A, bits, exp_bits, max_norm, round="nearest", saturate_normals=False):
    """mx/elemwise_ops.py _quantize_elemwise_core with allow_denorm=True, custom_cuda=False, exp_bits > 0."""
    with np.errstate(all="ignore"):
        out = A  # allow_denorm=True: nothing flushed
        private_exp = _floor_log2(np.abs(A) + (A == 0).astype(f32))
        # The minimum representable exponent for 8 exp bits is -126
        min_exp = -(2 ** (exp_bits - 1)) + 2
        private_exp = np.maximum(private_exp, f32(min_exp))  # torch .clip(min=): NaN stays NaN
        # _safe_lshift(out, bits - 2, private_exp)
        out = out / _exp2(private_exp) * f32(2 ** (bits - 2))
        out = _round_mantissa(out, round)  # |out| + 0.5 in float32: artefact (b)
        # _safe_rshift(out, bits - 2, private_exp)
        out = out / f32(2 ** (bits - 2)) * _exp2(private_exp)
        if saturate_normals:
            out = np.clip(out, f32(-max_norm), f32(max_norm))  # NaN stays NaN
        else:
            out = np.where(np.abs(out) > f32(max_norm), np.sign(out) * f32(np.inf), out)
        # handle Inf/NaN
        out = np.where(A == np.inf, f32(np.inf), out)
        out = np.where(A == -np.inf, f32(-np.inf), out)
        # out[A == float("NaN")] = float("NaN") in the original: never true, a no-op
    return out.astype(f32, copy=False)


def _to_blocks(A, block_size, axis):
    """_reshape_to_blocks for one axis, moved last: (..., n_blocks, block_size), and the axis length."""
    A = np.moveaxis(np.asarray(A, dtype=f32), axis, -1)
    n = A.shape[-1]
    if block_size == 0:
        return A[..., None, :], n
    if n % block_size:
        pad = [(0, 0)] * (A.ndim - 1) + [(0, block_size - n % block_size)]
        A = np.pad(A, pad, mode="constant")
    return A.reshape(A.shape[:-1] + (A.shape[-1] // block_size, block_size)), n


def _from_blocks(B, n, axis):
    """_undo_reshape_to_blocks."""
    B = B.reshape(B.shape[:-2] + (-1,))[..., :n]
    return np.moveaxis(B, -1, axis)


def _block_shared_exp(B, emax, flush_fp32_subnorms):
    """Shared exponents of blocked B (keepdim on the last axis), and B after the optional flush."""
    with np.errstate(all="ignore"):
        # _shared_exponents(A, method="max", axes=[block axis], ebits=0)
        amax = np.max(np.abs(B), axis=-1, keepdims=True)
        shared_exp = _floor_log2(amax + f32(FP32_MIN_NORMAL) * (amax == 0).astype(f32))  # artefact (a)
        # Flush subnormal FP32 inputs to zero
        if flush_fp32_subnorms:
            B = B * (shared_exp > -FP32_EXPONENT_BIAS).astype(f32)
        # Offset the max exponent by the largest representable exponent in the element data format
        shared_exp = shared_exp - f32(emax)
        scale_emax = 2 ** (SCALE_BITS - 1) - 1
        shared_exp = np.where(shared_exp > scale_emax, f32(np.nan), shared_exp)
        shared_exp = np.where(shared_exp < -scale_emax, f32(-scale_emax), shared_exp)
    return shared_exp.astype(f32, copy=False), B


def shared_exponents(A, elem_format, block_size=32, axis=-1):
    """The shared exponent of each block as _quantize_mx divides by (2**it is the E8M0 scale): float32,
    in [-127, 127] or NaN. Shape: A's, with the `axis` dimension replaced by the number of blocks."""
    fmt = _format(elem_format)
    B, _ = _to_blocks(A, block_size, axis)
    shared_exp, _ = _block_shared_exp(B, fmt["emax"], False)
    return np.moveaxis(shared_exp[..., 0], -1, axis)


def quantize_mx(A: np.ndarray, elem_format: str, block_size: int = 32, round: str = "nearest",
                axis: int = -1, flush_fp32_subnorms: bool = False) -> np.ndarray:
    """mx/mx_ops.py _quantize_mx(A, scale_bits=8, elem_format, shared_exp_method="max", axes=[axis],
    block_size, round, flush_fp32_subnorms, custom_cuda=False): the dequantised values (element times
    2**shared_exp), float32, A's shape."""
    if round not in _ROUNDS:
        raise ValueError(f"unsupported round {round!r}; one of {_ROUNDS}")
    fmt = _format(elem_format)
    B, n = _to_blocks(A, block_size, axis)
    shared_exp, B = _block_shared_exp(B, fmt["emax"], flush_fp32_subnorms)
    with np.errstate(all="ignore"):
        B = B / _exp2(shared_exp)
        B = _quantize_elemwise_core(B, fmt["mbits"], fmt["ebits"], fmt["max_norm"], round=round,
                                    saturate_normals=True)
        B = B * _exp2(shared_exp)
    return np.ascontiguousarray(_from_blocks(B.astype(f32, copy=False), n, axis))
