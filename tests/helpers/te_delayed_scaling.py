"""The reference lsexp's delayed-scaling rule is checked against: NVIDIA Transformer Engine's
recipe.DelayedScaling amax-history and scale update, transcribed step for step in numpy float32.

Source: github.com/NVIDIA/TransformerEngine at commit d0067d0da6cb01811b8072a7d304f0e00344ce2b
(2026-08-22, build_tools/VERSION.txt 2.20.0.dev0). Read there:

- transformer_engine/common/recipe/delayed_scaling.cu
  (last changed in 830ef60fd89508ee7c372bcc1489c0beb86094cb):
  ``kernel_bulk`` (lines 162-253) and its host launcher ``amax_and_scale_update_after_reduction``
  (lines 313-388; ``scaled_max`` at line 331), reached through
  ``nvte_delayed_scaling_recipe_amax_and_scale_update_after_reduction`` (lines 405-420);
  ``fp8_dtype_max`` (lines 32-42: 448 for E4M3, 57344 for E5M2).
- transformer_engine/pytorch/csrc/extensions/recipe.cpp: ``fused_amax_and_scale_update_after_reduction``
  (lines 32-62), which calls the function above.
- transformer_engine/pytorch/quantization.py: ``FP8GlobalStateManager.add_fp8_tensors_to_global_buffer``
  (lines 501-566), ``reduce_and_update_fp8_tensors`` (lines 656-712), ``autocast_exit`` (lines 772-782),
  ``DelayedScalingRecipeState.__init__`` (lines 1417-1442: ``scale = torch.ones``, ``amax_history =
  torch.zeros(amax_history_len, n)``) and ``make_quantizers`` (lines 1444-1451: each quantizer's amax
  is a view of ``amax_history[0]``); the unfused Python path ``_update_amax_history``,
  ``_default_get_amax_and_update_history``, ``_default_sf_compute``, ``_amax_and_scale_update``
  (lines 1067-1166), described below but not the one transcribed.
- transformer_engine/common/recipe/__init__.py: ``Format`` (lines 29-50) and ``DelayedScaling``
  (lines 172-260, fields at 253-258).
- transformer_engine/common/utils.cuh: ``atomicMaxFloat`` (lines 934-937) and ``reciprocal<float>``
  (lines 949-952); transformer_engine/common/cast/fp8/quantize_fp8.cuh (lines 216-229), where a
  quantisation records its amax and writes scale_inv.

Which path. ``reduce_and_update_fp8_tensors`` calls the fused CUDA update
(``tex.fused_amax_and_scale_update_after_reduction`` -> ``kernel_bulk``) unless NVTE_UNFUSED_FP8_UPDATE=1
or the recipe's amax_compute_algo / scaling_factor_compute_algo is a callable. With the string algorithms
"max" and "most_recent" and the environment unset, the fused kernel is what runs, so that is what is
transcribed here.

DelayedScaling defaults at that commit: margin=0, fp8_format=Format.HYBRID (E4M3 forward, fp8_max 448;
E5M2 backward, fp8_max 57344), amax_history_len=1024, amax_compute_algo="max",
scaling_factor_compute_algo=None, reduce_amax=True (the all-reduce (MAX) of the amaxes over the
amax-reduction group, done only when torch.distributed is initialised with world size > 1), fp8_dpa=False,
fp8_mha=False. Format: E4M3 max 448, E5M2 max 57344.

Order within a step (per FP8 tensor; forward tensors and backward tensors have separate states):

1. The quantisation in the forward pass (or backward pass, for gradients) uses the current ``scale``
   (and writes ``scale_inv = __frcp_rn(scale)``, i.e. float32 1/scale) and records the tensor's amax
   into ``amax_history[0]`` by ``atomicMaxFloat`` -- an int32 atomicMax on the float's bits, which for
   non-negative floats is max(). ``amax_history[0]`` is 0 after every update, so one quantisation per
   step simply writes it. (The tensor amax itself is fmaxf(amax, fabsf(x)) over the elements, so NaN
   elements are skipped and an Inf element gives Inf.)
2. At the end of the pass -- forward: ``autocast_exit`` of the outermost fp8_autocast/autocast
   (with grad enabled); backward: at the end of the backward of the module that ran first in the forward
   -- ``reduce_and_update_fp8_tensors`` concatenates the ``amax_history[0]`` slots into a copied buffer,
   all-reduces it (if reduce_amax and distributed), and ``kernel_bulk`` does, per tensor:

   a. ``last_amax = buffer if buffer != 0 else amax_history[0]`` (single process: ``amax_history[0]``).
   b. Only if ``last_amax != 0`` (NaN != 0 is true): roll the history by -1 and zero slot 0, i.e.
      ``new[0] = 0; new[i] = old[i+1] for 0 < i < L-1; new[L-1] = last_amax`` (= torch.roll(h, -1)
      then h[0] = 0); meanwhile ``amax = fmaxf`` over all L pre-roll values (old[1..L-1] and last_amax),
      starting from 0. fmaxf ignores NaN, so a NaN entry never becomes the amax under "max".
      If ``last_amax == 0`` nothing is rolled: the history does not advance and amax stays 0.
   c. "most_recent": ``amax = last_amax``. "max": amax from b (0 when nothing was rolled).
   d. ``scale = scaled_max / amax`` if ``isfinite(amax) and amax > 0``, else the previous scale is kept;
      then ``if isinf(scale): scale = FLT_MAX`` (3.4028235e38). Here
      ``scaled_max = fp8_max * std::pow(2.f, -margin)``, computed in float32 on the host (exact for integer
      margins), and the division is one IEEE float32 division (delayed_scaling.cu is not built with
      --use_fast_math, so no flush-to-zero and correctly rounded).

   So: amax 0 -> scale kept and history not advanced (under "max" too, even if older entries are
   positive); amax Inf -> scale kept (under "max", for as long as the Inf is in the window: L updates);
   amax NaN -> "most_recent": scale kept; "max": NaN ignored, scale from the other entries (and it
   does take a history slot); amax so small that scaled_max/amax overflows float32 -> FLT_MAX.
   A subnormal amax is used as is.
3. The next step's quantisation uses the new scale. Step 0 uses the initial scale 1.0 (torch.ones), and
   the history starts as zeros. Under "max" the window is therefore the last L non-zero amaxes,
   including the one just recorded.

The unfused Python path (NVTE_UNFUSED_FP8_UPDATE=1, quantization.py lines 1067-1166) differs, and is NOT
what this module computes: it always rolls (also when amax_history[0] is 0, and under "max" then takes
max(history) of the older entries), torch.max propagates NaN (so a NaN in the window keeps the scale),
and it computes ``sf = (fp8_max / amax) / (2**margin)``, then ``torch.where(amax > 0.0, sf, scale)``,
``torch.where(torch.isfinite(amax), sf, scale)``, and inf -> FLT_MAX: the same bits as the fused
``(fp8_max * 2**-margin) / amax`` except where fp8_max / amax overflows (unfused: FLT_MAX; fused: finite
for margin > 0) or the result is subnormal (two roundings).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

# Format enum (transformer_engine/common/recipe/__init__.py lines 47-50) and fp8_dtype_max
# (delayed_scaling.cu lines 32-42)
E4M3_MAX = 448.0
E5M2_MAX = 57344.0

FLT_MAX = np.float32(np.finfo(np.float32).max)  # std::numeric_limits<float>::max()

_F32 = np.float32


def _atomic_max_float(current: np.float32, value: np.float32) -> np.float32:
    """utils.cuh atomicMaxFloat: atomicMax on the int32 bit patterns (max() for non-negative floats)."""
    cur_bits = np.array(current, dtype=np.float32).view(np.int32)
    new_bits = np.array(value, dtype=np.float32).view(np.int32)
    return _F32(value) if new_bits > cur_bits else _F32(current)


class DelayedScaling:
    """One FP8 tensor's delayed-scaling state: its amax history and scale, as TE's fused update keeps
    them (float32). ``amax_history[0]`` is the slot the current step's quantisation records into;
    ``amax_history[L-1]`` holds the most recent completed step's amax after an update."""

    def __init__(self, fp8_max: float, margin: int = 0, amax_history_len: int = 1024,
                 amax_compute_algo: str = "max"):
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"Unsupported amax compute algorithm ({amax_compute_algo})")
        if amax_history_len < 1:
            raise ValueError("amax_history_len must be at least 1")
        self.fp8_max = _F32(fp8_max)
        self.margin = margin
        self.amax_history_len = int(amax_history_len)
        self.amax_compute_algo = amax_compute_algo
        # const float scaled_max = fp8_dtype_max(fp8_dtype) * std::pow(2.f, -margin);
        with np.errstate(under="ignore"):
            self.scaled_max = _F32(self.fp8_max * np.power(_F32(2.0), _F32(-margin), dtype=np.float32))
        # DelayedScalingRecipeState: scale = torch.ones, amax_history = torch.zeros(len, n)
        self.amax_history = np.zeros(self.amax_history_len, dtype=np.float32)
        self.scale = _F32(1.0)

    @property
    def scale_inv(self) -> np.float32:
        """What the quantisation writes next to its output: __frcp_rn(scale) = float32 1/scale."""
        with np.errstate(divide="ignore", over="ignore"):
            return _F32(_F32(1.0) / self.scale)

    def record(self, amax: float) -> None:
        """A quantisation with the current scale: atomicMaxFloat(&amax_history[0], tensor_amax)."""
        self.amax_history[0] = _atomic_max_float(self.amax_history[0], _F32(amax))

    def update(self, reduced_amax: Optional[float] = None) -> None:
        """kernel_bulk for one tensor. ``reduced_amax`` is this tensor's entry of the (all-reduced)
        amax buffer; None (single process) means the buffer holds amax_history[0] unchanged."""
        history = self.amax_history
        length = self.amax_history_len
        buffered = history[0] if reduced_amax is None else _F32(reduced_amax)
        # last_amax = (buffer != nullptr && buffer[...] != 0.0f) ? buffer[...] : amax_history[0];
        last_amax = _F32(buffered) if buffered != 0.0 else _F32(history[0])

        amax = _F32(0.0)
        if last_amax != 0.0:
            old = history.copy()
            for i in range(length):
                a = old[i + 1] if i < length - 1 else last_amax
                amax = _F32(np.fmax(amax, a))  # fmaxf: NaN ignored
                history[i] = a if i > 0 else _F32(0.0)

        if self.amax_compute_algo == "most_recent":
            amax = last_amax
        # "max": the fmaxf reduction above (the shared-memory tree of fmaxf gives the same value)

        with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
            if np.isfinite(amax) and amax > 0:
                scale = _F32(self.scaled_max / amax)
            else:
                scale = self.scale
        if np.isinf(scale):
            scale = FLT_MAX
        self.scale = _F32(scale)


def scales(amaxes: Sequence[float], fp8_max: float, margin: int = 0, amax_history_len: int = 1024,
           amax_compute_algo: str = "max") -> List[np.float32]:
    """The scale each step's quantisation uses, for a tensor whose amax at step t is amaxes[t].

    Per step t: the quantisation uses the current scale (appended to the result), records amaxes[t]
    into amax_history[0], then the update at the end of the pass (autocast exit for forward tensors,
    end of backward for gradients) rolls the history and computes the scale step t+1 uses. Step 0 uses
    the initial scale 1.0. The last update's scale is not in the result (no step uses it here).
    """
    state = DelayedScaling(fp8_max, margin, amax_history_len, amax_compute_algo)
    column = []
    for amax in amaxes:
        column.append(state.scale)
        state.record(amax)
        state.update()
    return column
