"""The optimizer group: MindSpore's optimizers, built from their option's keys, with lsexp's own two
(clip_grad_norm, decay_filter) taken out first.

Momentum, SGD and Adam take a `loss_scale` and divide the gradients by it, which is how ms.Model
leaves fixed_nodrop's gradients scaled for the optimizer. AdamWeightDecay and Lamb take none: under
fixed_nodrop the train step divides the gradients itself before the update (lsexp.engines.body's
StepOptions.optimizer_divides), so every strategy runs with every optimizer. Each family is its
`<name>_schema.py` here and its YAML under conf/optimizer/; nothing here names them.
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
    from lsexp.config.facts import gradient_divisor, shrinking_tokens

    if shrinking_tokens(cfg) is None:  # no key, or gradients it does not shrink (unit scaling)
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


def loss_scale_problems(cfg: DictConfig) -> List[str]:
    """optimizer.loss_scale, where it is given: the strategy's otherwise."""
    from lsexp.config.values import finite_positive

    opt_scale = cfg.optimizer.get("loss_scale")
    if opt_scale is not None and not finite_positive(opt_scale):
        return [f"optimizer.loss_scale={opt_scale}: must be a finite number > 0; leave it unset"]
    return []


def problems(cfg: DictConfig) -> List[str]:
    """The optimizer group's keys, and its family's own checks."""
    from lsexp.config import families
    from lsexp.config.values import finite_positive

    o, p = cfg.optimizer, []
    if not finite_positive(o.learning_rate):
        p.append(f"optimizer.learning_rate={o.learning_rate}: must be a finite number > 0")
    if o.weight_decay < 0:
        p.append(f"optimizer.weight_decay={o.weight_decay}: must be >= 0; e.g. 0.01")
    if o.clip_grad_norm is not None and not finite_positive(o.clip_grad_norm):
        p.append(f"optimizer.clip_grad_norm={o.clip_grad_norm}: must be a finite number > 0, e.g. 1.0, "
                 f"or null for no clipping")
    family = families.of("optimizer", o._target_)
    return p + list(getattr(family, "problems", lambda _: [])(cfg))


def token_problems(cfg: DictConfig) -> List[str]:
    """train.mean_over_tokens: a token count no smaller than the step's own, with an optimizer whose float32
    update a correction keeps (divisor_correction)."""
    from lsexp.config.facts import batch_tokens

    n = cfg.train.get("mean_over_tokens")
    if n is None or cfg.dataset.batch_size < 1:
        return []
    own = batch_tokens(cfg)
    if n < own:
        return [f"train.mean_over_tokens={n}: below the {own} tokens a step already averages (world size x "
                f"train.accumulate_steps x dataset.batch_size, x dataset.seq_len for a language model); use "
                f">= {own}, or null for the batch's own count"]
    p = []
    if divisor_correction(cfg.optimizer) is None:
        p.append(f"train.mean_over_tokens={n} with optimizer._target_={cfg.optimizer._target_}: no "
                 f"correction keeps its float32 update unchanged; use optimizer=adamw, adam, momentum or "
                 f"sgd, or train.mean_over_tokens=null")
    if cfg.optimizer.clip_grad_norm is not None:
        p.append(f"train.mean_over_tokens={n} with optimizer.clip_grad_norm={cfg.optimizer.clip_grad_norm}: "
                 f"the clip would see the smaller gradients; set optimizer.clip_grad_norm=null")
    return p
