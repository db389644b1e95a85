"""The optimizer group: MindSpore's optimizers, built from their option's keys, with lsexp's own two
(clip_grad_norm, decay_filter) taken out first.

Momentum, SGD and Adam take a `loss_scale` and divide the gradients by it, which is how ms.Model
leaves fixed_nodrop's gradients scaled for the optimizer. AdamWeightDecay and Lamb take none: under
fixed_nodrop the train step divides the gradients itself before the update (lsexp.engines.recorder's
Recipe), so every strategy runs with every optimizer. Each family is its `<name>_schema.py` here
and its YAML under conf/optimizer/; nothing here names them.
"""

from __future__ import annotations

from typing import List, Optional

from omegaconf import DictConfig, OmegaConf

OWN_KEYS = ("clip_grad_norm", "decay_filter")
# the names MindSpore gives biases and normalisation parameters (nn.Dense/Conv2d, BatchNorm, LayerNorm)
NO_DECAY = ("bias", "beta", "gamma", "moving_mean", "moving_variance")


def divides_itself(cfg_optimizer: DictConfig) -> bool:
    """Whether the optimizer's class takes loss_scale: its schema has the key, as the class has it."""
    return "loss_scale" in cfg_optimizer


def param_groups(params: List, weight_decay: float) -> List[dict]:
    """decay_filter's parameter groups, as MindSpore's examples build them: no decay on biases and
    normalisation parameters, and the network's own order kept."""
    decay = [p for p in params if not p.name.endswith(NO_DECAY)]
    rest = [p for p in params if p.name.endswith(NO_DECAY)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0},
            {"order_params": params}]


def divisor_correction(cfg_optimizer: DictConfig) -> Optional[str]:
    """How the optimizer's float32 update is kept unchanged when train.mean_over_tokens makes the gradients
    K times smaller: "loss_scale" for a class that takes one (MindSpore multiplies the gradients by
    1/loss_scale after adding weight_decay * loss_scale * w, so loss_scale / K gives back exactly the
    gradients and decay of the batch's mean), the key its family names in MEAN_OVER_TOKENS (the Adam
    family without a loss_scale: eps / K, as m / (sqrt(v) + eps) is then unchanged), or None: none."""
    from lsexp.config import families

    if divides_itself(cfg_optimizer):
        return "loss_scale"
    family = families.of("optimizer", cfg_optimizer._target_)
    return getattr(family, "MEAN_OVER_TOKENS", None)


def divisor_params(cfg: DictConfig) -> dict:
    """train.mean_over_tokens' correction as the run's params: K, and the optimizer key divided by it."""
    from lsexp.config.facts import gradient_divisor

    if cfg.train.get("mean_over_tokens") is None:
        return {}
    k = gradient_divisor(cfg)
    return {"train.gradient_divisor": f"{k:g}",
            "train.optimizer_correction": f"optimizer.{divisor_correction(cfg.optimizer)} / {k:g}"}


def build(cfg_optimizer: DictConfig, params: List, learning_rate, loss_scale: float, device_target: str,
          gradient_divisor: float = 1.0):
    """The optimizer over params at learning_rate (a float or a LearningRateSchedule), with loss_scale
    passed to a class that takes it; on a device target where the class has no kernel, the one its family
    names in CLASS_ON (lamb on CPU). gradient_divisor: train.mean_over_tokens' K, corrected for as
    divisor_correction says."""
    from hydra.utils import get_class

    from lsexp.config import families

    kwargs = OmegaConf.to_container(cfg_optimizer, resolve=True)
    target = kwargs.pop("_target_")
    family = families.of("optimizer", target)
    target = getattr(family, "CLASS_ON", {}).get(device_target, target)
    for key in OWN_KEYS:
        kwargs.pop(key, None)
    kwargs["learning_rate"] = learning_rate
    if "loss_scale" in kwargs:
        kwargs["loss_scale"] = loss_scale
    if gradient_divisor != 1.0:
        key = divisor_correction(cfg_optimizer)
        kwargs[key] = kwargs[key] / gradient_divisor
    if cfg_optimizer.decay_filter:
        params = param_groups(list(params), kwargs["weight_decay"])
    return get_class(target)(params, **kwargs)
