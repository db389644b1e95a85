"""The optimizer group: MindSpore's optimizers, built from their option's keys, with lsexp's own two
(clip_grad_norm, decay_filter) taken out first.

Momentum, SGD and Adam take a `loss_scale` and divide the gradients by it, which is how ms.Model
leaves fixed_nodrop's gradients scaled for the optimizer. AdamWeightDecay and Lamb take none: under
fixed_nodrop the train step divides the gradients itself before the update (lsexp.engines.recorder's
Recipe), so every strategy runs with every optimizer. Each family is its `<name>_schema.py` here
and its YAML under conf/optimizer/; nothing here names them.
"""

from __future__ import annotations

from typing import List

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


def build(cfg_optimizer: DictConfig, params: List, learning_rate, loss_scale: float, device_target: str):
    """The optimizer over params at learning_rate (a float or a LearningRateSchedule), with loss_scale
    passed to a class that takes it; on a device target where the class has no kernel, the one its family
    names in CLASS_ON (lamb on CPU)."""
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
    if cfg_optimizer.decay_filter:
        params = param_groups(list(params), kwargs["weight_decay"])
    return get_class(target)(params, **kwargs)
