"""Ascend's saturation mode as a conversion rule (device.overflow_mode=saturation): on Atlas training
chips (910A), and on 910B/C with INF_NAN_MODE_ENABLE=0, an operation whose result overflows its type
returns the type's largest finite value with the result's sign, and one whose result is NaN returns 0.
The chip raises its float-status register when it does; no value shows it.

saturate() applies the rule to a tensor in MindSpore ops, as the compiled step runs it: finite values
pass bit for bit (nan_to_num selects; it does no arithmetic that a CPU kernel's flush of subnormals
could touch). Float16, bfloat16 and float32 saturate at their own largest value; another type passes.

KERNELS (kernels.cc) are the same rule and its flag as CPU kernels on a float16, bfloat16 or float32
tensor's bits, for MindSpore's aot Custom operators (lsexp.taps.saturating builds them): MindSpore's CPU
nan_to_num and isfinite walk float16 one value at a time."""

from __future__ import annotations

from pathlib import Path

from mindspore import dtype as mstype
from mindspore import ops

from lsexp.formats.spec import BF16_MAX, FP16_MAX, FP32_MAX

KERNELS = Path(__file__).with_name("kernels.cc")
FALLBACK = "saturation runs in MindSpore ops, slower on CPU"  # said where KERNELS cannot be built


def _largest(dtype):
    top = FP32_MAX
    if dtype == mstype.float16:
        top = FP16_MAX
    if dtype == mstype.bfloat16:
        top = BF16_MAX
    return top


def _saturates(dtype):
    return dtype == mstype.float16 or dtype == mstype.bfloat16 or dtype == mstype.float32


def saturate(x):
    """x with +-inf as +-its type's largest finite value and NaN as 0; every finite value unchanged."""
    return saturate_at(x, _largest(x.dtype))


def saturate_at(x, largest):
    """saturate() with +-`largest` for +-inf: a float32 gradient that a float16 operation made saturates
    at float16's largest value."""
    out = x
    if _saturates(x.dtype):  # one kernel, which leaves finite values (subnormals, -0) as they are
        out = ops.cast(ops.nan_to_num(_readable(x), nan=0.0, posinf=largest, neginf=-largest), x.dtype)
    return out


def saturated(x, y):
    """1 (float32) where saturate() would change a value of x or of y (one holds an inf or a NaN), else 0:
    a tap's forward output and incoming gradient, in as few kernels as a step can afford per layer."""
    return ops.cast(ops.logical_not(ops.logical_and(_finite(x), _finite(y))), mstype.float32)


def _finite(x):
    return ops.isfinite(_readable(x)).all()


def _readable(x):
    """x as MindSpore's CPU nan_to_num and isfinite read it: bfloat16, which they do not, as float32, which
    holds each of its values exactly; another type as it is."""
    if x.dtype == mstype.bfloat16:
        return ops.cast(x, mstype.float32)
    return x


def native_saturates(dtype) -> bool:
    """Whether KERNELS read this MindSpore type (float16, bfloat16, float32)."""
    return _saturates(dtype)


class Kernels:
    """KERNELS as MindSpore aot operators, from `library`, the shared object built from them
    (lsexp.native): rule(x), flag(y, dout) (float32 [1]), rule_flag(y, dout) (both at once, on
    dout), and as(largest), the rule for a parameter gradient that saturates at FP16_MAX or BF16_MAX."""

    def __init__(self, library: str):
        def custom(name, shape, dtype):
            return ops.Custom(f"{library}:{name}", out_shape=shape, out_dtype=dtype, func_type="aot")

        self.rule = custom("Saturate", lambda x: x, lambda x: x)
        self.flag = custom("Nonfinite", lambda y, dout: (1,), lambda y, dout: mstype.float32)
        self.rule_flag = custom("SaturateFlag", lambda y, dout: (dout, (1,)),
                                lambda y, dout: (dout, mstype.float32))
        self._as = {FP16_MAX: custom("SaturateAsHalf", lambda x: x, lambda x: x),
                    BF16_MAX: custom("SaturateAsBfloat", lambda x: x, lambda x: x)}

    def rule_as(self, largest: float):
        return self._as[largest]
