"""The eight-bit formats (lsexp.formats) are exact: every value lsexp's MindSpore ops give equals, bit for
bit, ml_dtypes' conversion (OCP E4M3, E5M2, E8M0) and a transcription of the HiFloat8 paper
(tests/helpers/hif8_paper.py); MX equals a transcription of microxcaling's MX quantisation
(tests/helpers/microxcaling_mx.py) except where two float32 artefacts of microxcaling's PyTorch path
round differently, and the tests predict those elements exactly."""

import ml_dtypes
import numpy as np
import pytest

from helpers import hif8_paper, microxcaling_mx
from helpers.scalers import configure
from lsexp.formats import FORMATS, names, quantize


@pytest.fixture(autouse=True, scope="module")
def eager():
    """The device as a run sets it (a run in this process later must find it set), and PyNative, as a
    user's quantize() call runs."""
    import mindspore as ms

    configure()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    configure()


OCP = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
CODES = np.arange(256, dtype=np.uint8)


def assert_bits_equal(got, want, inputs):
    """Equal bit for bit, -0 apart from +0; any NaN equals any NaN (the formats keep no payload)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    examples = [(float(inputs.flat[i]), float(got.flat[i]), float(want.flat[i])) for i in bad[:5]]
    assert bad.size == 0, f"{bad.size} of {same.size} differ, e.g. (input, lsexp, reference) {examples}"


def reference(x, name, saturate):
    """ml_dtypes' conversion; its astype does not saturate, so the saturating one is ml_dtypes of the
    value clipped to the largest, NaN kept (NVIDIA's __NV_SATFINITE: inf to the largest too)."""
    x = np.asarray(x, np.float32)
    if saturate:
        top = float(ml_dtypes.finfo(OCP[name]).max)
        x = np.where(np.isnan(x), x, np.clip(x, -top, top)).astype(np.float32)
    return x.astype(OCP[name]).astype(np.float32)


def random_values(n=10**6, lo=-30, hi=20, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(lo, hi, n)).astype(np.float32)


def neighbour_midpoints(values):
    """The midpoints between neighbouring finite values (exact in float32), both signs, and the float32
    values either side of each: where rounding decides."""
    v = np.unique(np.abs(values[np.isfinite(values)]).astype(np.float64))
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (v[:-1] + v[1:]) / 2)  # exact
    around = np.concatenate([mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))])
    return np.concatenate([around, -around])


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 465.0, 480.0, 57344.0, 61440.0,
                     61441.0, 65504.0, 1e6, -1e6, 3.4e38, -3.4e38], np.float32)


@pytest.mark.parametrize("saturate", [False, True], ids=["overflow", "saturate"])
@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_equals_ml_dtypes_bit_for_bit(name, saturate):
    codes = CODES.view(OCP[name]).astype(np.float32)
    cases = {
        "every code": codes,
        "10^6 random values, 2^-30 to 2^20": random_values(),
        "ties between neighbouring codes": neighbour_midpoints(codes),
        "zeros, infinities, NaN, beyond the largest": SPECIALS,
    }
    for what, x in cases.items():
        got = quantize(x, name, saturate=saturate)
        assert got.dtype == np.float32 and got.shape == x.shape, what
        assert_bits_equal(got, reference(x, name, saturate), x)
    # what the conversions do beyond the largest value
    top = FORMATS[name].max
    over = quantize(np.array([np.inf, -np.inf, 2 * top], np.float32), name, saturate=saturate)
    if saturate:
        assert over.tolist() == [top, -top, top]
    elif name == "e4m3":
        assert np.isnan(over).all()
    else:
        assert over.tolist() == [np.inf, -np.inf, np.inf]


def test_e8m0_equals_ml_dtypes_bit_for_bit():
    dt = ml_dtypes.float8_e8m0fnu
    codes = CODES.view(dt).astype(np.float32)
    ties = (1.5 * 2.0 ** np.arange(-126, 128)).astype(np.float32)
    subnormals = np.float32(2.0**-126) * np.array([2.0**-23, 0.5, 0.75, 1 - 2.0**-23], np.float32)
    x = np.concatenate([codes, np.abs(random_values()), ties, np.nextafter(ties, np.float32(0)),
                        np.nextafter(ties, np.float32(np.inf)), SPECIALS, -np.abs(random_values(1000)),
                        subnormals, -subnormals])
    want = x.astype(dt).astype(np.float32)
    # a float32 subnormal is read as zero, which E8M0 cannot hold (lsexp.formats.cast.E8M0Cast)
    want[np.abs(x) < 2.0**-126] = np.nan
    assert (subnormals.astype(dt).astype(np.float32) > 0).all()  # where ml_dtypes gives 2^-127 or 2^-126
    assert_bits_equal(quantize(x, "e8m0"), want, x)


@pytest.mark.parametrize("saturate", [False, True], ids=["inf", "saturating"])
def test_hif8_equals_the_transcription_of_the_paper(saturate):
    values = np.array([v for _, v in hif8_paper.CODES], np.float32)
    x = np.concatenate([values, random_values(10**5, -26, 18, seed=1), neighbour_midpoints(values), SPECIALS,
                        np.array([hif8_paper.MAX, 1.25 * hif8_paper.MAX, 2.0**-23, -(2.0**-23)], np.float32)])
    assert_bits_equal(quantize(x, "hif8", saturate=saturate), hif8_paper.quantize(x, saturate), x)
    # every code maps to itself, its single zero to +0 and its largest finite value is the paper's
    finite = values[np.isfinite(values)]
    assert_bits_equal(quantize(finite, "hif8"), finite + np.float32(0), finite)
    assert FORMATS["hif8"].max == hif8_paper.MAX and FORMATS["hif8"].tiny == hif8_paper.MIN_DENORMAL


def mx_blocks(seed, n_blocks=400):
    """Random blocks of 32 over a wide range of scales (each block its own), exact ties between grid
    values among them, and an all-zero block, one with an inf, one with a NaN, one of -0."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-100, 100, (n_blocks, 1))
    blocks = (rng.standard_normal((n_blocks, 32)) * scale).astype(np.float32)
    ties = (rng.integers(0, 64, (40, 32)) + 0.5) * 2.0 ** rng.integers(-60, 60, (40, 1))
    specials = np.zeros((4, 32))
    specials[1, 5], specials[2, 7], specials[3, :] = np.inf, np.nan, -0.0
    specials[1:3, :5] = rng.standard_normal((2, 5))
    return np.concatenate([blocks, ties, specials]).astype(np.float32)


# lsexp's MX is an exact cast; microxcaling's PyTorch path is not, in two places (the helper's docstring):
# (a) it takes floor(log2(amax)) of a float32 log2, which for an amax just below 2^k rounds up to k, so
#     that the block's shared exponent is one larger;
# (b) it rounds with floor(|t| + 1/2) summed in float32, which rounds up a t (the element in units of its
#     grid step) within half a float32 spacing under a boundary n + 1/2, where an exact cast rounds down.
# The tests below predict from these two rules alone, in float64 (where every step is exact), which
# elements differ and what each side gives there, and check that lsexp differs from the transcription at
# exactly those elements, in that direction, and nowhere else.
F64 = np.float64


def mx_params(elem):
    """The element format as microxcaling's _get_format_params gives it: emax, the lowest binade emin,
    the fraction bits, the largest value."""
    fmt = microxcaling_mx.FORMATS[f"fp8_{elem}"]
    return fmt["emax"], 2 - 2 ** (fmt["ebits"] - 1), fmt["mbits"] - 2, fmt["max_norm"]


def floor_log2(a):
    """floor(log2(a)) exactly, for float64 a > 0 (frexp: a = m * 2^e, m in [0.5, 1))."""
    return np.frexp(a)[1] - 1


def log2_rounds_up(a):
    """Rule (a), for float64 a (float32 values): whether log2(a), rounded to float32, is the integer k just
    above a's binade (a = m * 2^k, m in [0.5, 1)). log2(a) = k - g with g = -log2(m) > 0, and it rounds to
    k when g is under half the float32 spacing just below k (a tie is impossible: g is irrational unless
    m = 1/2, where g = 1). g in float64 (log1p of the exact m - 1) is within ~1e-16 of g, far closer than
    any float32 value's g comes to a half-spacing."""
    with np.errstate(divide="ignore", invalid="ignore"):
        m, k = np.frexp(a)
        k32 = k.astype(np.float32)
        spacing = (k32 - np.nextafter(k32, np.float32(-np.inf))).astype(F64)
        g = -np.log1p(m - 1) / np.log(2)
        return np.isfinite(a) & (a > 0) & (g < spacing / 2)


def rounds_up_windows(mant):
    """Rule (b): every float32 t at or below a boundary n + 1/2 of the element grid (t in units of the
    grid's step, n = 0 ... 2^(mant+1) - 1, every boundary of a binade) for which t + 1/2 in float32 rounds
    to n + 1: those within half the float32 spacing just below n + 1 of n + 1/2 (a tie rounds to n + 1,
    whose significand is even). Exact in float64. Sorted float32 values."""
    found = []
    for n in range(2 ** (mant + 1)):
        top = np.float32(n + 1)
        half = (F64(top) - F64(np.nextafter(top, np.float32(0)))) / 2
        t = np.nextafter(np.float32(n + 0.5), np.float32(0))
        while F64(n) + 0.5 - F64(t) <= half:
            found.append(t)
            t = np.nextafter(t, np.float32(0))
    return np.array(sorted(found), np.float32)


def element_cast(v, elem, rounding):
    """Magnitudes v >= 0 (float64) rounded to the element format, saturating, in float64: every step is
    exact (v has 24 significant bits, the steps are powers of two)."""
    _, emin, mant, top = mx_params(elem)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf and NaN blocks: NaN, and unused
        step = np.exp2(np.maximum(floor_log2(v), emin) - mant)
        t = v / step
        whole = np.floor(t)
        frac = t - whole
        up = (frac > 0.5) | ((frac == 0.5) & ((rounding == "nearest") | (whole % 2 == 1)))
        return np.minimum((whole + up) * step, top)


class MXPrediction:
    """What rules (a) and (b) predict for x (blocks of 32 along the last axis, padded with zeros), each
    array of x's shape: the shared exponents, exact (`exact_exp`) and microxcaling's (`mx_exp`, one more
    where rule (a) holds, both clamped to -127 as E8M0 is); an exact cast of each element at either
    exponent (`exact`, `at_mx_exp`); t, the element in units of its grid step at microxcaling's
    exponent; `rule_a`, the elements whose cast differs between the two exponents; `rule_b`, those whose t
    is in rule (b)'s windows; `finite`, the elements of blocks without an inf or NaN."""

    def __init__(self, x, elem, rounding):
        emax, emin, mant, _ = mx_params(elem)
        n = x.shape[-1]
        b = np.pad(x.astype(F64), [(0, 0)] * (x.ndim - 1) + [(0, -n % 32)]).reshape(x.shape[:-1] + (-1, 32))
        amax = np.abs(b).max(axis=-1, keepdims=True)  # NaN if a NaN is there
        finite = np.isfinite(amax)
        binade = floor_log2(np.where(finite & (amax > 0), amax, 2.0**-126))  # microxcaling: 0 -> 2^-126
        exact_exp = np.maximum(binade - emax, -127)
        mx_exp = np.maximum(binade + log2_rounds_up(amax) - emax, -127)
        with np.errstate(over="ignore"):  # microxcaling makes float32's largest value inf: rule (a)
            exact, at_mx_exp = (np.sign(b) * element_cast(np.abs(b) / 2.0**e, elem, rounding) * 2.0**e
                                for e in (exact_exp, mx_exp))
        v = np.abs(b) * np.exp2(-mx_exp)
        with np.errstate(divide="ignore"):
            # the step of v's binade (microxcaling's private exponent). Its float32 log2 too may round up,
            # for v just below 2^j, but then t is near 2^mant on either exponent, far from every window
            t = v * np.exp2(mant - np.maximum(floor_log2(v), emin))
        out = dict(exact_exp=exact_exp, mx_exp=mx_exp, exact=exact, at_mx_exp=at_mx_exp, t=t,
                   rule_a=finite & (mx_exp != exact_exp) & (exact != at_mx_exp),
                   rule_b=finite & np.isin(t, rounds_up_windows(mant).astype(F64)),
                   finite=finite, amax=amax, is_amax=finite & (np.abs(b) == amax) & (amax > 0),
                   smallest_step_at_mx_exp=np.exp2(mx_exp + emin - mant))
        for name, arr in out.items():
            arr = np.broadcast_to(arr, b.shape).reshape(b.shape[:-2] + (-1,))[..., :n]
            setattr(self, name, arr)
        self.block_exact_exp, self.block_mx_exp, self.block_finite = (a[..., 0] for a in (exact_exp, mx_exp,
                                                                                        finite))


def assert_mx_differs_exactly_where_predicted(x, got, want, p):
    """got (lsexp) and want (the transcription) are equal except at the elements rules (a) and (b) name,
    and differ there as the rules say."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))  # -0 equals +0: the reference's sign(0) is +0
    predicted = p.rule_a | p.rule_b

    def show(where):
        i = np.flatnonzero(where)[:4]
        return [(float(x.flat[j]), float(got.flat[j]), float(want.flat[j])) for j in i]

    unexplained, missing = ~same & ~predicted, same & predicted
    assert not unexplained.any(), f"differ where no rule says: (x, lsexp, microxcaling) {show(unexplained)}"
    assert not missing.any(), f"equal where a rule says they differ: {show(missing)}"
    # lsexp is the exact cast at the exact exponent, everywhere
    np.testing.assert_array_equal(got[p.finite], p.exact[p.finite].astype(np.float32))
    assert np.isnan(got[~p.finite]).all() and np.isnan(want[~p.finite]).all()
    # (b): microxcaling rounds t up to one step, lsexp rounds it down (to 0, or in an (a) block, to the
    # step at its own exponent, half of microxcaling's)
    b = p.rule_b
    np.testing.assert_array_equal(want[b], (np.sign(x[b]) * p.smallest_step_at_mx_exp[b]).astype(np.float32))
    assert (np.abs(got[b]) < np.abs(want[b])).all()
    # (a) alone: microxcaling's values are the exact cast at its exponent, one more than lsexp's
    a = p.rule_a & ~p.rule_b
    assert (p.mx_exp[a] == p.exact_exp[a] + 1).all()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(want[a], p.at_mx_exp[a].astype(np.float32))
    # a block's largest element (just below 2^k) is 2^k there, and saturates in lsexp: larger there
    top = p.is_amax & (p.mx_exp != p.exact_exp)
    assert p.rule_a[top].all() and (np.abs(want[top]) > np.abs(got[top])).all()
    with np.errstate(over="ignore"):  # float32's largest comes out 2^128, inf
        power = np.exp2(floor_log2(p.amax[top]) + 1).astype(np.float32)
    np.testing.assert_array_equal(np.abs(want[top]), power)


def mx_window_blocks(elem, seed, ks=None):
    """Blocks built to fall in both windows. Each block's largest element is one of the float32 values
    just below 2^k whose log2 rounds up to k (the first and the last of them), or the largest one whose log2
    does not, for every k in `ks`; by default from where both exponents are clamped to 2^-127 up to 128
    (float32's largest).
    Beside it: elements (0.5 - 2^-25) * step, where step is the element format's smallest at the block's
    scale, microxcaling's and lsexp's; their neighbours; the boundaries n + 1/2 of every binade's grid and
    the float32 values either side of them; and random elements. Float32 subnormals are made 0 (MindSpore's
    CPU kernels read them as 0)."""
    emax, emin, mant, _ = mx_params(elem)
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(emax - 130, 129) if ks is None else ks:
        below = []  # the float32 values just below 2^k whose log2 rounds up, and the next one down
        a = np.finfo(np.float32).max if k == 128 else np.nextafter(np.float32(2.0**k), np.float32(0))
        while log2_rounds_up(F64(a)):
            below.append(a)
            a = np.nextafter(a, np.float32(0))
        for amax in sorted({*below[:1], *below[-1:], a}):
            exact = max(k - 1 - emax, -127)  # lsexp's exponent; microxcaling's is exact + 1 in window (a)
            row = F64(amax) * 2.0 ** -rng.uniform(0.1, 24, 32)
            t = np.array([0.5 - 2**-25, 0.5 - 2**-25, 0.5 - 2**-24, 0.5, 0.5 + 2**-24, 1.0 - 2**-24, 1.5])
            row[1:15] = np.concatenate([t * 2.0 ** (e + emin - mant) for e in (exact, exact + 1)])
            binade = rng.integers(0, emax - emin)  # a boundary n + 1/2 in a random binade, either side
            mid = (rng.integers(0, 2 ** (mant + 1)) + 0.5) * 2.0 ** (exact + emin + binade - mant)
            row[15:18] = [mid, np.nextafter(np.float32(mid), np.float32(0)), np.nextafter(np.float32(mid),
                                                                                         np.float32(np.inf))]
            row = np.where(np.abs(row) < amax, row, 0.0)  # amax stays the largest (clamped blocks)
            row[0] = amax
            row = rng.permutation(row) * rng.choice([-1.0, 1.0], 32)
            rows.append(np.where(np.abs(row) < 2.0**-126, 0.0, row))
    return np.array(rows).astype(np.float32)


MX_CASES = [(elem, rounding) for elem in ("e4m3", "e5m2") for rounding in ("nearest", "even")]


@pytest.mark.parametrize("elem,rounding", MX_CASES)
def test_mx_differs_from_microxcaling_exactly_where_its_float32_log2_and_half_rounding_say(elem, rounding):
    seed = MX_CASES.index((elem, rounding))
    x = np.concatenate([mx_blocks(seed), mx_window_blocks(elem, seed)])
    want = microxcaling_mx.quantize_mx(x, f"fp8_{elem}", block_size=32, round=rounding,
                                       flush_fp32_subnorms=True)
    got = quantize(x, f"mx_{elem}", rounding={"nearest": "away", "even": "even"}[rounding])
    p = MXPrediction(x, elem, rounding)
    # rule (b)'s windows: only the value just below 1/2 (the first boundary), in both formats
    assert rounds_up_windows(mx_params(elem)[2]).tolist() == [0.5 - 2**-25]
    # the inputs reach both windows, often: (a) blocks, (a) elements, (b) elements inside (a) blocks and out
    a_blocks = p.block_finite & (p.block_mx_exp != p.block_exact_exp)
    assert a_blocks.sum() >= 400 and p.rule_a.sum() >= 3000
    assert (p.rule_b & (p.mx_exp == p.exact_exp)).sum() >= 400 and (p.rule_b & p.rule_a).sum() >= 1000
    assert_mx_differs_exactly_where_predicted(x, got, want, p)
    assert np.isnan(got[441:443]).all() and (got[440] == 0).all()  # mx_blocks' inf, NaN and zero blocks
    # the blocks' scales: lsexp's E8M0 is 2^(exact exponent), microxcaling's exponent is one more in
    # exactly the (a) blocks
    from mindspore import Tensor

    from lsexp.formats import cast

    op = cast.MXCast(FORMATS[elem], 32, "even")
    scales = op.scale_values(op.blocks(Tensor(x))).asnumpy()[..., 0]
    shared = microxcaling_mx.shared_exponents(x, f"fp8_{elem}")
    ok = p.block_finite
    np.testing.assert_array_equal(scales[ok], np.exp2(p.block_exact_exp[ok]).astype(np.float32))
    np.testing.assert_array_equal(shared[ok], p.block_mx_exp[ok])
    assert np.isnan(scales[~ok]).all() and np.isnan(shared[~ok]).all()
    assert np.array_equal(shared[ok] == np.log2(scales[ok].astype(F64)) + 1, a_blocks[ok])


@pytest.mark.parametrize("elem,rounding", MX_CASES)
def test_mx_a_block_whose_largest_element_is_below_2_to_the_minus_100(elem, rounding):
    """E4M3: amax in [2^-118, 2^-100); E5M2: [2^-111, 2^-100). The scale is 2^(floor(log2(amax)) - emax)
    there as everywhere above E8M0's 2^-127, in the ops and in the CPU step's numpy kernel (both once
    clamped amax up to 2^-100, scaled such a block by 2^(-100-emax) and flushed it)."""
    from mindspore import Tensor

    from lsexp.formats import cast, host

    emax = mx_params(elem)[0]
    # an example: E4M3, amax 6.0e-36 in [2^-118, 2^-117): scale 2^-126 (once 2^-108); E5M2, amax 1.0e-32
    # in [2^-107, 2^-106): scale 2^-122 (once 2^-115)
    top, example_exp = {"e4m3": (6.0e-36, -126), "e5m2": (1.0e-32, -122)}[elem]
    example = np.zeros((1, 32), np.float32)
    example[0, :3] = top, -top / 6, top / 24
    x = np.concatenate([mx_window_blocks(elem, 0, ks=range(emax - 125, -99)), example])
    ours = {"nearest": "away", "even": "even"}[rounding]
    want = microxcaling_mx.quantize_mx(x, f"fp8_{elem}", round=rounding, flush_fp32_subnorms=True)
    p = MXPrediction(x, elem, rounding)
    # every block's exact exponent is in the range: at least E8M0's -126, below the old clamp's -100 - emax
    assert ((p.block_exact_exp >= -126) & (p.block_exact_exp < -100 - emax)).all()
    # rule (a) holds there too, and (b) in E4M3 (E5M2's smallest steps there are below 2^-126, flushed)
    assert p.rule_a.sum() >= 22 and (elem == "e5m2" or p.rule_b.sum() >= 60)
    for got in (quantize(x, f"mx_{elem}", rounding=ours), host.MXCastHost(FORMATS[elem], 32, ours)(x)):
        assert_mx_differs_exactly_where_predicted(x, got, want, p)
    op = cast.MXCast(FORMATS[elem], 32, ours)
    scales = op.scale_values(op.blocks(Tensor(x))).asnumpy()[..., 0]
    shared = microxcaling_mx.shared_exponents(x, f"fp8_{elem}")
    np.testing.assert_array_equal(scales, np.exp2(p.block_exact_exp).astype(np.float32))
    np.testing.assert_array_equal(shared, p.block_mx_exp)
    a_blocks = p.block_mx_exp != p.block_exact_exp  # microxcaling's exponent is one more in exactly these
    assert a_blocks.any() and np.array_equal(shared == np.log2(scales.astype(F64)) + 1, a_blocks)
    assert shared[-1] == example_exp and scales[-1] == np.float32(2.0**example_exp)
    got = quantize(example, f"mx_{elem}", rounding=ours)
    assert_bits_equal(got, want[-1:], example)
    if elem == "e4m3":  # 6.0e-36 / 2^-126 = 510.4 saturates to 448
        assert got[0, 0] == np.float32(448 * 2.0**-126)


def test_mx_the_example_of_the_docs():
    """docs/eight_bit.md: E4M3, a block [1, 2^-18 (1 - 2^-24), 0 ...] and one [2^-18 (1 - 2^-24), 0 ...]."""
    x = np.zeros((2, 32), np.float32)
    x[0, 0], x[0, 1], x[1, 0] = 1.0, 2.0**-18 * (1 - 2.0**-24), 2.0**-18 * (1 - 2.0**-24)
    want = microxcaling_mx.quantize_mx(x, "fp8_e4m3")
    got = quantize(x, "mx_e4m3")
    assert want[:, :2].tolist() == [[1.0, 2.0**-17], [2.0**-18, 0.0]]
    assert got[:, :2].tolist() == [[1.0, 0.0], [448 * 2.0**-27, 0.0]]


def test_a_last_axis_not_a_whole_number_of_blocks_is_padded_as_the_reference_pads_it():
    x = random_values(3 * 70, -20, 20, seed=3).reshape(3, 70)
    # the last, partial block of row 0 in both windows: amax just below 2^21, t = 0.5 - 2^-25 beside it
    x[0, 64], x[0, 66] = 2.0**21 * (1 - 2.0**-24), 2.0 ** (21 - 8 - 6 - 3) * (0.5 - 2**-25)  # float32 values
    want = microxcaling_mx.quantize_mx(x, "fp8_e4m3", flush_fp32_subnorms=True)
    p = MXPrediction(x, "e4m3", "nearest")
    assert p.rule_a[0, 64] and p.rule_b[0, 66] and (p.rule_a | p.rule_b).sum() >= 2
    assert_mx_differs_exactly_where_predicted(x, quantize(x, "mx_e4m3"), want, p)


def test_an_unknown_format_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"format=e3m4: no such format; use one of e4m3, e5m2, hif8, e8m0"):
        quantize([1.0], "e3m4")
    assert set(names()) == {"e4m3", "e5m2", "hif8", "e8m0", "mx_e4m3", "mx_e5m2"}


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "hif8", "mx_e4m3", "mx_e5m2"])
def test_the_cpu_steps_numpy_kernels_give_the_ops_bits(name):
    """lsexp.formats.host, the CPU step's one kernel per cast, against the MindSpore ops of GPU and
    Ascend, on normal float32 values (numpy keeps subnormals, which MindSpore's CPU kernels read as 0)."""
    from lsexp.formats import host

    x = np.concatenate([random_values(), SPECIALS[np.abs(SPECIALS) >= 2.0**-100]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-x.size % 32, np.float32)]).reshape(-1, 32)
    if name.startswith("mx_"):
        # and the built blocks: a largest element in every binade, from where the scale is E8M0's 2^-127 up
        x = np.concatenate([x, mx_window_blocks(name[3:], 0)])
        for rounding, ours in (("even", "even"), ("nearest", "away")):
            op = host.MXCastHost(FORMATS[name[3:]], 32, ours)
            assert_bits_equal(op(x), quantize(x, name, rounding=ours), x)
        return
    for saturate in (False, True):
        op = host.FormatCastHost(FORMATS[name], saturate)
        assert_bits_equal(op(x), quantize(x, name, saturate=saturate), x)
