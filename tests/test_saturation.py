"""device.overflow_mode=saturation: Ascend's saturation mode emulated at the taps. The rule equals a numpy
transcription on every special value, going forward and coming back; with an overflow injected at step 7
no tapped tensor holds an inf or a NaN, the emulated flag is raised there and only there, the check that
reads it skips what infnan skips, and the check of the values alone lets the corrupted update through."""

import csv
import math

import numpy as np
import pytest

from conftest import run_cli
from helpers.refusal import assert_refused
from helpers.scalers import configure

# Ascend's rule (docs/saturation.md): a result beyond the type's range is its largest finite value with
# the result's sign, a NaN result is 0, every other value is itself.
LARGEST = {np.float16: 65504.0, np.float32: float(np.finfo(np.float32).max)}


def saturate_reference(a: np.ndarray) -> np.ndarray:
    top = a.dtype.type(LARGEST[a.dtype.type])
    return np.where(np.isfinite(a), a, np.where(a > 0, top, np.where(a < 0, -top, a.dtype.type(0))))


def _specials(dtype):
    with np.errstate(over="ignore"):
        values = np.array([np.inf, -np.inf, np.nan, -np.nan, 65504.0, -65504.0, 65505.0, 65519.0, 65520.0,
                           -65520.0, 1e30, -1e30, 3.4e38, 0.0, -0.0, 6e-8, -6e-8, 1e-40, 1.0, -2.5],
                          np.float32).astype(dtype)
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(64) * 1e4).astype(dtype)
    return np.concatenate([values, noise])


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
def test_saturation_acts_on_each_tensor_as_the_rule_says_going_forward_and_back(dtype):
    import mindspore as ms
    from mindspore import nn

    from lsexp.saturation import saturate, saturated

    configure()

    class Saturated(nn.Cell):  # forward through the rule; its bprop, as a tap's, through it again
        def construct(self, x):
            return saturate(x)

        def bprop(self, x, out, dout):
            return (saturate(dout),)

    class Forward(nn.Cell):
        def __init__(self):
            super().__init__()
            self.s = Saturated()

        def construct(self, x):
            return self.s(x), saturated(x, x)

    class Backward(nn.Cell):  # the gradient of sum(s(x) * g) reaching x is s(g)
        def __init__(self):
            super().__init__()
            self.s = Saturated()

        def construct(self, x, g):
            return (self.s(x) * g).sum()

    a = _specials(dtype)
    want = saturate_reference(a)
    got, count = Forward()(ms.Tensor(a))
    bits = np.uint16 if dtype == np.float16 else np.uint32
    np.testing.assert_array_equal(got.asnumpy().view(bits), want.view(bits))  # -0 and subnormals too
    assert float(count.asnumpy()) == 1.0  # the tensor held an inf or a NaN
    finite = a[np.isfinite(a)]
    same, none = Forward()(ms.Tensor(finite))
    np.testing.assert_array_equal(same.asnumpy().view(bits), finite.view(bits))
    assert float(none.asnumpy()) == 0.0
    back = ms.grad(Backward(), grad_position=1)  # d/dg: s(x), through the forward; d/dx: s(g)
    grad_x = ms.grad(Backward(), grad_position=0)(ms.Tensor(np.ones_like(a)), ms.Tensor(a))
    np.testing.assert_array_equal(grad_x.asnumpy().view(bits), want.view(bits))
    np.testing.assert_array_equal(back(ms.Tensor(a), ms.Tensor(np.ones_like(a))).asnumpy().view(bits),
                                  want.view(bits))


SWEEP = ("device.overflow_mode=infnan,saturation", "device.status_check=true,false", "hydra.sweep.dir=sweep",
         "hydra.sweep.subdir=${device.overflow_mode}-${device.status_check}")


def _runs(tmp_path, engine: str, *extra: str) -> dict:
    """infnan, saturation with its flag, and saturation with the values-only check, as one sweep: the MLP at
    a fixed scale no step of 9 overflows by itself, the gradient flowing into layers.3 made inf at step 7
    (issue 22's layer injection, inside the compiled step), every layer's statistics (telemetry=layers)."""
    out = run_cli("-m", "model=mlp", "dataset=digits", "amp=O2", f"engine={engine}", "loss_scale=fixed_drop",
                  "loss_scale.loss_scale=1024", "inject.layer=layers.3", "inject.pass=backward",
                  "inject.overflow_steps=[7]", "train.max_steps=9", "telemetry=layers", "tracking=none",
                  "train.checkpoint=false", *extra,
                  *SWEEP, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {}
    for name in ("infnan-True", "saturation-True", "saturation-False"):
        d = tmp_path / "sweep" / name
        with open(d / "history.csv") as f:
            history = list(csv.DictReader(f))
        with open(d / "layers.csv") as f:
            layers = list(csv.DictReader(f))
        runs[name] = (history, layers)
    return runs


def _column(rows, key):
    return [float(r[key]) for r in rows]


def _check(runs):
    infnan, _ = runs["infnan-True"]
    flagged, flagged_layers = runs["saturation-True"]
    silent, silent_layers = runs["saturation-False"]
    # infnan: step 7's gradients are inf, and the step is skipped
    assert _column(infnan, "overflow") == [0, 0, 0, 0, 0, 0, 1, 0, 0]
    for rows in (flagged_layers, silent_layers):  # no tapped tensor holds an inf or NaN, in either pass
        for r in rows:
            for key in ("out_amax", "grad_amax"):
                assert math.isfinite(float(r[key])), (r["step"], r["layer"], key)
            assert float(r["overflow_fraction"]) == 0, (r["step"], r["layer"])
    step7 = [r for r in flagged_layers if r["step"] == "7" and r["layer"] == "layers.3"]
    assert float(step7[0]["grad_amax"]) == 65504.0  # the inf, saturated at float16's largest value
    assert _column(flagged, "float_status") == [0, 0, 0, 0, 0, 0, 1, 0, 0]  # raised at step 7 only
    # the same, up to the step whose corrupted update the values-only check let through (which may make
    # the next steps overflow as well)
    assert _column(silent, "float_status")[:7] == [0, 0, 0, 0, 0, 0, 1]
    # with the flag, exactly infnan's skips, and the same run
    assert _column(flagged, "overflow") == _column(infnan, "overflow")
    assert _column(flagged, "skipped_steps") == _column(infnan, "skipped_steps")
    assert _column(flagged, "loss") == _column(infnan, "loss")
    # values only: step 7 is neither seen nor skipped, and its update changes what step 8 computes
    assert _column(silent, "overflow") == [0] * 9 and _column(silent, "skipped_steps") == [0] * 9
    assert _column(silent, "loss")[:7] == _column(flagged, "loss")[:7]
    assert _column(silent, "loss")[7] != _column(flagged, "loss")[7]


@pytest.mark.parametrize("engine", ["cell", pytest.param("functional", marks=pytest.mark.slow)])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_an_injected_overflow_under_saturation_is_flagged_at_its_step_and_passes_a_values_only_check(
        tmp_path, engine):
    _check(_runs(tmp_path, engine))


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["cell", "functional"])
def test_a_natural_overflow_under_saturation_skips_as_infnan_with_the_flag_and_never_without(tmp_path,
                                                                                              engine):
    # dynamic's first scale, 2^24, overflows the MLP's float16 gradients by itself until it has halved
    # enough: infnan and the flag skip the same steps, the values-only check none, at a scale that never drops
    out = run_cli("-m", "model=mlp", "dataset=digits", "amp=O2", f"engine={engine}", "loss_scale=dynamic",
                  "train.max_steps=8", "tracking=none", "train.checkpoint=false",
                  *SWEEP, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]

    def history(name):
        with open(tmp_path / "sweep" / name / "history.csv") as f:
            return list(csv.DictReader(f))

    infnan, flagged, silent = (history(n) for n in ("infnan-True", "saturation-True", "saturation-False"))
    skipped = _column(infnan, "overflow")
    assert 0 < sum(skipped) < 8
    assert _column(flagged, "overflow") == skipped
    assert _column(flagged, "loss_scale") == _column(infnan, "loss_scale")
    assert _column(flagged, "float_status") == skipped
    assert sum(_column(silent, "overflow")) == 0 and set(_column(silent, "loss_scale")) == {2.0**24}
    assert sum(_column(silent, "float_status")) >= sum(skipped)  # raised, and never read


@pytest.mark.parametrize("args,says", [
    (["device.overflow_mode=saturate"], "device.overflow_mode=saturate: no such mode; use infnan"),
    (["device.overflow_mode=saturation", "amp=O0"],
     "device.overflow_mode=saturation with amp.level=O0: float32 does not overflow where float16 "
     "saturates"),
    (["device.overflow_mode=saturation", "amp=O2", "train.mode=pynative"],
     "device.overflow_mode=saturation with train.mode=pynative: the taps are in the compiled step"),
    (["device.status_check=sometimes"],
     "device.status_check=sometimes: Value 'sometimes' is not a valid bool"),
])
def test_bad_overflow_mode_options_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    out = run_cli(*args, "train.max_steps=2", cwd=tmp_path)
    assert_refused(out, says, tmp_path)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16", np.float32])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_the_native_kernels_saturate_and_flag_as_the_rule_and_the_mindspore_ops(dtype):
    """On CPU a tap saturates, and raises the flag, in lsexp's C++ kernels (MindSpore aot operators built
    from lsexp/saturation/kernels.cc); elsewhere in MindSpore ops: the same bits and the same flag,
    forward and back, and a backward that saturates and flags in one kernel agrees with both."""
    import mindspore as ms
    import ml_dtypes
    from mindspore import nn

    from lsexp.taps.saturating import SaturatingTransform

    configure()
    if dtype == "bfloat16":  # bfloat16's largest value and its own specials
        a = _specials(np.float32).astype(ml_dtypes.bfloat16)
        # without its subnormals: the CPU's bfloat16 multiply in the backward below flushes them to 0
        with np.errstate(invalid="ignore"):
            a = a[~((a != 0) & (np.abs(a) < ml_dtypes.finfo(ml_dtypes.bfloat16).tiny))]
        top = ml_dtypes.bfloat16(float.fromhex("0x1.fep127"))
        with np.errstate(invalid="ignore"):
            want = np.where(np.isfinite(a), a, np.where(a > 0, top, np.where(a < 0, -top, a.dtype.type(0))))
        as_tensor = lambda v: ms.Tensor(np.asarray(v, np.float32), ms.bfloat16)  # noqa: E731
    else:
        a, want = _specials(dtype), saturate_reference(_specials(dtype))
        as_tensor = lambda v: ms.Tensor(np.asarray(v, dtype))  # noqa: E731
    bits = np.uint32 if a.dtype == np.float32 else np.uint16

    class Tapped(nn.Cell):  # forward and backward through one transform, as a tap's exit does
        def __init__(self, transform):
            super().__init__()
            self.t = transform

        def construct(self, x):
            return self.t.forward(x)

        def bprop(self, x, out, dout):
            return (self.t.backward(dout, self.t.state()),)

    class Weighted(nn.Cell):  # d/dx sum(t(x) * g) is what t's backward makes of g
        def __init__(self, transform):
            super().__init__()
            self.tapped = Tapped(transform)

        def construct(self, x, g):
            return (self.tapped(x) * g).sum()

    class BackwardStatus(nn.Cell):
        def __init__(self, transform):
            super().__init__()
            self.t = transform

        def construct(self, y, dout):
            return self.t.backward_status(y, dout, self.t.state())

    native, ops_only = SaturatingTransform(native=True), SaturatingTransform(native=False)
    assert native.native and not ops_only.native  # the kernels were built on this machine
    ones = as_tensor(np.ones(a.shape, np.float32))
    for transform in (native, ops_only):
        np.testing.assert_array_equal(Tapped(transform)(as_tensor(a)).asnumpy().view(bits), want.view(bits))
        back = ms.grad(Weighted(transform))(ones, as_tensor(a))
        np.testing.assert_array_equal(back.asnumpy().view(bits), want.view(bits))
        out, flag = BackwardStatus(transform)(ones, as_tensor(a))
        np.testing.assert_array_equal(out.asnumpy().view(bits), want.view(bits))
        assert float(flag.asnumpy()) == 1.0
    state = native.state()
    for y, dout in [(1.0, 2.0), (np.inf, 2.0), (1.0, -np.inf), (np.nan, 1.0), (65504.0, -65504.0)]:
        y_t, d_t = as_tensor(np.array([0.5, y], np.float32)), as_tensor(np.array([dout, -0.25], np.float32))
        flag = float(not (np.isfinite(y) and np.isfinite(dout)))
        for transform in (native, ops_only):
            assert float(transform.status(y_t, d_t, state).asnumpy()) == flag
            assert float(BackwardStatus(transform)(y_t, d_t)[1].asnumpy()) == flag


@pytest.mark.parametrize("largest", ["FP16_MAX", "BF16_MAX"])
def test_the_gradient_kernels_saturate_a_float32_gradient_at_the_amp_dtypes_largest_value(largest):
    """A float32 parameter gradient that a float16 (bfloat16) operation made saturates at float16's
    (bfloat16's) largest value, in lsexp's kernel as in MindSpore ops (saturate_at); finite values pass."""
    import mindspore as ms

    from lsexp import saturation
    from lsexp.native import library

    configure()
    top = getattr(saturation, largest)
    path, why = library(saturation.KERNELS)
    assert path is not None, why
    a = _specials(np.float32)
    want = np.where(np.isfinite(a), a, np.where(a > 0, top, np.where(a < 0, -top, 0.0))).astype(np.float32)
    got = saturation.Kernels(str(path)).rule_as(top)(ms.Tensor(a)).asnumpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ops_got = saturation.saturate_at(ms.Tensor(a), top).asnumpy()
    np.testing.assert_array_equal(ops_got.view(np.uint32), want.view(np.uint32))


def test_without_a_compiler_saturation_says_so_once_and_runs_in_mindspore_ops(tmp_path):
    """No C++ compiler: one warning line naming the cause and the fix, and the same run in MindSpore ops."""
    out = run_cli("device.overflow_mode=saturation", "amp=O2", "train.max_steps=3", cwd=tmp_path,
                  env={"CXX": "no-such-compiler"})
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in (out.stdout + out.stderr).splitlines()
            if "saturation runs in MindSpore ops" in line]
    assert len(said) == 1 and "no C++ compiler (no-such-compiler)" in said[0] and "set CXX" in said[0]


def test_the_kernels_build_once_into_the_cache_and_nowhere_else(tmp_path, monkeypatch):
    from lsexp import native
    from lsexp.saturation import KERNELS

    monkeypatch.setenv("LSEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    path, why = native.library(KERNELS)
    assert why == "" and path.parent == tmp_path / "cache" / "kernels" and path.suffix == ".so"
    built = path.stat().st_mtime_ns
    native.forget()  # as a new process finds it
    again, _ = native.library(KERNELS)
    assert again == path and path.stat().st_mtime_ns == built  # from the cache, not compiled again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no akg_kernel_meta, no temporary
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize("chained", [False, True], ids=["alone", "in_a_chain"])
def test_a_saturating_tap_reports_its_status_through_its_probe(chained):
    """A tap's status probe's gradient carries the flag out of the backward pass: raised where the layer's
    output or the gradient into it held an inf, alone or inside a Chain."""
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor, nn, ops

    from lsexp.taps.cells import Chain, install
    from lsexp.taps.saturating import SaturatingTransform

    configure()

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(4, 4).to_float(ms.float16)
            self.b = nn.Dense(4, 2).to_float(ms.float16)

        def construct(self, x):
            return self.b(self.a(x))

    net = Net()
    taps = install(net, ["a", "b"], {"a": net.a, "b": net.b},
                   lambda name: Chain([SaturatingTransform()]) if chained else SaturatingTransform(),
                   observe=False)

    class StatusStep(nn.Cell):  # what it needs as attributes: a free variable of construct can make
        def __init__(self, net, probes):  # MindSpore parse this whole test function (an 'Import')
            super().__init__()
            self.net = net
            self.probes = probes
            self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

        def construct(self, x, sens):
            return self.grad(self.net, self.probes)(x, sens)

    step = StatusStep(net, ParameterTuple(taps.status_probes()))
    x = Tensor(np.ones((2, 4), np.float32))
    clean = [float(g.asnumpy()) for g in step(x, Tensor(np.ones((2, 2), np.float16)))]
    assert clean == [0.0, 0.0]
    hot = [float(g.asnumpy()) for g in step(x, Tensor(np.array([[np.inf, 1], [1, 1]], np.float16)))]
    assert hot == [0.0, 1.0]  # b's incoming gradient held the inf; a's was saturated before it got there
