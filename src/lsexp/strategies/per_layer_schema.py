"""loss_scale=per_layer: adaptive loss scaling per layer (Zhao et al. 2019, arXiv 1910.12385), the rule of
its Chainer implementation (github.com/kumasento/gradient-scaling, AdaLoss with the "approx_range"
method): each layer scales the gradient its backward pass receives by a power of two chosen from that
gradient's and the layer's weight's statistics, and the weight gradients are unscaled by the scale they
carry. The global part is a constant scale on the loss (AdaLossScaled's init_scale); an overflowed update
is skipped, as fixed_drop skips it. The rule and the cells: lsexp.taps.adaptive and lsexp.taps.chain;
docs/per_layer.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, finite_positive, scale_ok


@dataclass
class PerLayerLossScaleConfig(LossScaleConfig):
    _target_: str = "lsexp.strategies.per_layer.PerLayerLossScaleManager"
    init_scale: float = 1.0  # AdaLossScaled(init_scale=1.0): the loss's own scale
    scale_upper_bound: float = 16.0  # AdaLoss's defaults: no layer scales by more
    accum_upper_bound: float = 1024.0  # nor takes the scale its gradient carries past this
    n_uf_threshold: float = 1e-3  # the fraction of a layer's products allowed to underflow


class PerLayer(Strategy):
    name = "per_layer"
    scales_layers = True

    @property
    def scale(self) -> float:
        return float(self.config.init_scale)

    def problems(self, cfg) -> List[str]:
        ls, p = self.config, []
        if not scale_ok(ls.init_scale):
            p.append(f"loss_scale.init_scale={ls.init_scale}: must be a finite number >= 1; e.g. 1, the "
                     f"reference's default")
        for key in ("scale_upper_bound", "accum_upper_bound"):
            if not (finite_positive(ls[key]) and ls[key] >= 1):
                p.append(f"loss_scale.{key}={ls[key]}: must be a finite number >= 1 (a scale below 1 would "
                         f"shrink the gradient it is there to save); e.g. "
                         f"{16 if key == 'scale_upper_bound' else 1024}")
        if not (isinstance(ls.n_uf_threshold, (int, float)) and 0 < ls.n_uf_threshold < 1):
            p.append(f"loss_scale.n_uf_threshold={ls.n_uf_threshold}: must lie strictly between 0 and 1; "
                     f"e.g. 0.001")
        if cfg.amp.dtype != "float16":
            p.append(f"loss_scale=per_layer with amp.dtype={cfg.amp.dtype}: the rule's limits are float16's "
                     f"(6e-8 to 65504, AdaLoss's u_min and u_max); use amp.dtype=float16, or "
                     f"loss_scale=none for bfloat16's range")
        k = cfg.train.accumulate_steps
        if k > 1:
            p.append(f"loss_scale=per_layer with train.accumulate_steps={k}: each micro-batch's gradients "
                     f"would carry scales of their own; set train.accumulate_steps=1")
        if cfg.parallel.parallel_mode == "data_parallel":
            p.append("loss_scale=per_layer with parallel=data: each rank's scales would come from its own "
                     "shard's gradients; use parallel=none")
        precision = cfg.get("precision")
        if precision is not None and precision.recipe != "none":
            p.append(f"loss_scale=per_layer with precision.recipe={precision.recipe}: the recipe's quantised "
                     f"gradients would meet scales it does not know; use precision=none")
        if cfg.device.get("overflow_mode", "infnan") == "saturation":
            p.append("loss_scale=per_layer with device.overflow_mode=saturation: the saturating taps and the "
                     "per-layer scales would share a layer; use device.overflow_mode=infnan")
        if cfg.inject.get("layer"):
            p.append(f"loss_scale=per_layer with inject.layer={cfg.inject.layer}: the layer's tap scales its "
                     f"gradient; inject by step alone (inject.overflow_steps) or drop inject.layer")
        return p + super().problems(cfg)

    def layer_rule(self) -> dict:
        ls = self.config
        return dict(init_scale=float(ls.init_scale), scale_upper_bound=float(ls.scale_upper_bound),
                    accum_upper_bound=float(ls.accum_upper_bound), n_uf_threshold=float(ls.n_uf_threshold))

    def scaler(self):
        from mindspore.amp import StaticLossScaler

        return StaticLossScaler(self.scale)

    def state_names(self, engine: str) -> Tuple[str, ...]:
        return ()  # every step computes its scales afresh: there is nothing to restore


SCHEMA, STRATEGY = PerLayerLossScaleConfig, PerLayer
