"""Ascend's saturation mode as a conversion rule (device.overflow_mode=saturation): on Atlas training
chips (910A), and on 910B/C with INF_NAN_MODE_ENABLE=0, an operation whose result overflows its type
returns the type's largest finite value with the result's sign, and one whose result is NaN returns 0.
The chip raises its float-status register when it does; no value shows it.

saturate() applies the rule to a tensor in MindSpore ops, as the compiled step runs it: finite values
pass bit for bit (nan_to_num selects; it does no arithmetic that a CPU kernel's flush of subnormals
could touch). Float16, bfloat16 and float32 saturate at their own largest value; another type passes.

saturate_np() and nonfinite_np() are the same rule and its flag on a float16 or float32 array's bits,
for the CPU step's host kernels (lsexp.taps.saturation): integer operations that numpy vectorises, where
MindSpore's CPU kernels and numpy's own isfinite walk float16 one value at a time."""

from __future__ import annotations

import numpy as np
from mindspore import dtype as mstype
from mindspore import ops

FP16_MAX = 65504.0
BF16_MAX = float(np.float32(3.3895313892515355e38))  # 0x7F7F: bfloat16's largest finite value
FP32_MAX = float(np.finfo(np.float32).max)


# float type: (its bits, exponent mask, mantissa mask, sign bit, largest finite value's magnitude bits)
_BITS = {np.dtype(np.float16): (np.uint16, 0x7C00, 0x03FF, 0x8000, 0x7BFF),
         np.dtype(np.float32): (np.uint32, 0x7F800000, 0x007FFFFF, 0x80000000, 0x7F7FFFFF)}


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
        out = ops.nan_to_num(x, nan=0.0, posinf=largest, neginf=-largest)
    return out


def saturated(x, y):
    """1 (float32) where saturate() would change a value of x or of y (one holds an inf or a NaN), else 0:
    a tap's forward output and incoming gradient, in as few kernels as a step can afford per layer."""
    return ops.cast(ops.logical_not(ops.logical_and(ops.isfinite(x).all(), ops.isfinite(y).all())),
                    mstype.float32)


def host_saturates(dtype) -> bool:
    """Whether saturate_np() reads this MindSpore type (float16, float32)."""
    return dtype == mstype.float16 or dtype == mstype.float32


def _special(a: np.ndarray):
    unsigned, exponent, mantissa, sign, top = _BITS[a.dtype]
    bits = a.view(unsigned)
    return bits, (bits & unsigned(exponent)) == exponent, unsigned, mantissa, sign, top


def saturate_np(a: np.ndarray) -> np.ndarray:
    """saturate() of a float16 or float32 array, on its bits; the array itself when it holds no inf or NaN."""
    bits, special, unsigned, mantissa, sign, top = _special(a)
    if not special.any():
        return a
    out = bits.copy()
    out[special] = (bits[special] & unsigned(sign)) | unsigned(top)
    out[special & ((bits & unsigned(mantissa)) != 0)] = 0
    return out.view(a.dtype)


def nonfinite_np(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """saturated() on the host: [1.] (float32) when x or y (float16 or float32) holds an inf or a NaN,
    else [0.]. Two arguments, not *arrays: a pyfunc kernel takes its inputs from the signature."""
    return np.array([_special(x)[1].any() or _special(y)[1].any()], np.float32)
