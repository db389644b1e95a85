"""The train step, built by the engine group around the strategy: as ms.Model builds it (cell), or as
MindSpore 2.x teaches for custom loops (functional); what both share is the recorder (recorder)."""

# Here, not in the step modules, which import MindSpore: the loop reads the stats by these names, and a
# job must not import MindSpore before its tracker has let an early worker go (tracking=none).
# float16's smallest subnormal and largest finite value: a scaled gradient below the first
# flushes to zero, above the second overflows (Micikevicius et al. 2018).
FP16_TINY, FP16_MAX = 2.0**-24, 65504.0
# the stats a step reports after its five (loss, overflow, scale, skipped, finite) and its learning rate:
# with telemetry, the gradients' statistics as backprop made them (grad_norm is before the reducer); with
# clipping, last, the unscaled global norm the clip saw (after the reducer; the loop adds `clipped`, that
# norm above clip_norm on a step that updated)
CLIP = ("global_norm",)
# a strategy that measures_amax: the largest unscaled gradient magnitude after the reducer, which its
# update read (NaN on a step that overflowed); before clipping's norm
AMAX = ("grad_amax",)
# headroom_log2: log2(FP16_MAX / max|S*g|), how many powers of two the largest scaled gradient stayed below
# float16's largest value; the loop makes it NaN on a step that overflowed
TELEMETRY = ("grad_norm", "underflow_fraction", "overflow_fraction", "zero_fraction", "headroom_log2")
# device.overflow_mode=saturation: 1 where the emulated float-status register was raised (a value saturated
# in a tapped layer or a parameter gradient), whether or not the check read it; last
STATUS = ("float_status",)
