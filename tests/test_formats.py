"""The eight-bit formats (lsexp.formats) are exact: every value lsexp's MindSpore ops give equals, bit for
bit, ml_dtypes' conversion (OCP E4M3, E5M2, E8M0), a transcription of the HiFloat8 paper
(tests/helpers/hif8_paper.py), and a transcription of microxcaling's MX quantisation
(tests/helpers/microxcaling_mx.py)."""

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
    x = np.concatenate([codes, np.abs(random_values()), ties, np.nextafter(ties, np.float32(0)),
                        np.nextafter(ties, np.float32(np.inf)), SPECIALS, -np.abs(random_values(1000))])
    assert_bits_equal(quantize(x, "e8m0"), x.astype(dt).astype(np.float32), x)


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


@pytest.mark.parametrize("rounding", ["nearest", "even"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_mx_equals_the_transcription_of_microxcaling(elem, rounding):
    x = mx_blocks(seed=hash((elem, rounding)) % 2**32)
    want = microxcaling_mx.quantize_mx(x, f"fp8_{elem}", block_size=32, round=rounding,
                                       flush_fp32_subnorms=True, exact_log2=True)
    got = quantize(x, f"mx_{elem}", rounding={"nearest": "away", "even": "even"}[rounding])
    np.testing.assert_array_equal(got, want)  # -0 equals +0 here: the reference's sign(0) is +0
    # the blocks' scales: E8M0 of 2^shared_exponent
    from mindspore import Tensor

    from lsexp.formats import cast

    op = cast.MXCast(FORMATS[elem], 32, "even")
    scales = op.scale_values(op.blocks(Tensor(x))).asnumpy().reshape(-1)
    shared = microxcaling_mx.shared_exponents(x, f"fp8_{elem}", exact_log2=True).reshape(-1)
    np.testing.assert_array_equal(scales, np.exp2(shared.astype(np.float64)).astype(np.float32))
    assert np.isnan(got[-3:-1]).all() and (got[-4] == 0).all()


def test_a_last_axis_not_a_whole_number_of_blocks_is_padded_as_the_reference_pads_it():
    x = random_values(3 * 70, -20, 20, seed=3).reshape(3, 70)
    np.testing.assert_array_equal(quantize(x, "mx_e4m3"),
                                  microxcaling_mx.quantize_mx(x, "fp8_e4m3", flush_fp32_subnorms=True,
                                                              exact_log2=True))


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
        for rounding, ours in (("even", "even"), ("nearest", "away")):
            op = host.MXCastHost(FORMATS[name[3:]], 32, ours)
            assert_bits_equal(op(x), quantize(x, name, rounding=ours), x)
        return
    for saturate in (False, True):
        op = host.FormatCastHost(FORMATS[name], saturate)
        assert_bits_equal(op(x), quantize(x, name, saturate=saturate), x)
