"""The loss_scale group: each option is one Strategy object, made once from the validated config and
passed down; the engines, the validation and the tracking ask it, and nothing outside this package
names a strategy or compares a `loss_scale._target_`.

A family is a schema module `<family>_schema.py` here (SCHEMA, the typed keys, registered as
`base_<family>`; STRATEGY, the Strategy subclass), its YAML options under conf/loss_scale/, and, where
MindSpore lacks the scaler, a module with the MindSpore classes (dynamic_hysteresis.py). A family from
outside lsexp is found the same way: the schema module beside the module its `_target_` names, on
PYTHONPATH, with its YAML on hydra.searchpath. Schema modules import nothing heavy; a Strategy imports
MindSpore only when an engine asks it for a cell or a scaler.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lsexp.config import families
from lsexp.config.errors import ConfigError
from lsexp.config.values import finite_positive


def scale_ok(value) -> bool:
    # MindSpore's managers and scalers refuse a scale below 1 (ValueError at construction).
    return finite_positive(value) and value >= 1


class Strategy:
    """What lsexp asks of a loss_scale option. A subclass answers from its own keys (self.config)."""

    name: str = "strategy"  # as run names, params and summaries show it
    drops_overflow: bool = True  # an update whose gradients overflowed is skipped
    changes: bool = False  # the scale moves during training (a dynamic strategy)
    scales_layers: bool = False  # each layer scales its own gradient (the taps carry its rule)
    # its update reads the step's unscaled gradient amax (after the reducer): the engines measure it,
    # pass it to the update cell or the scaler's adjust, and record it as the grad_amax column
    measures_amax: bool = False

    def __init__(self, config: DictConfig):
        self.config = config

    @property
    def scale(self) -> float:
        """The scale of the first step."""
        raise NotImplementedError

    @property
    def floor(self) -> Optional[float]:
        """The lowest scale a dynamic strategy backs off to; None for one whose scale never changes."""
        return None

    @property
    def optimizer_loss_scale(self) -> float:
        """What the optimizer's own loss_scale must divide the gradients by: 1 unless the strategy leaves
        them scaled for it."""
        return 1.0

    def problems(self, cfg: DictConfig) -> List[str]:
        """The checks its keys' types cannot express, and optimizer.loss_scale against it."""
        opt = cfg.optimizer.get("loss_scale")
        if opt is None or not finite_positive(opt) or self.optimizer_loss_scale != 1 or opt == 1:
            return []
        return [
            f"optimizer.loss_scale={opt} with loss_scale={self.name}: the train step already divides the "
            f"gradients by the scale, so they would be divided twice; set optimizer.loss_scale=1 or "
            f"leave it unset"
        ]

    def update_cell(self):
        """Cell engine, when drops_overflow: the scale_sense of nn.TrainOneStepWithLossScaleCell, from the
        mindspore.amp.LossScaleManager that `_target_` names."""
        from hydra.utils import instantiate

        return instantiate(self.config).get_update_cell()

    def layer_rule(self) -> dict:
        """With scales_layers: the keyword arguments of the rule each layer's tap carries
        (lsexp.taps.adaptive.AdaLossTransform)."""
        raise NotImplementedError

    def scaler(self):
        """Functional engine: the mindspore.amp.LossScaler, or None for no scaling."""
        raise NotImplementedError

    def state_names(self, engine: str) -> Tuple[str, ...]:
        """The checkpoint entries that carry its state under engine (cell or functional)."""
        return ()


def resolve(cfg: DictConfig) -> Strategy:
    """The Strategy of cfg.loss_scale: lsexp's own families first, then one beside its `_target_`."""
    target = cfg.loss_scale._target_
    module = families.of("loss_scale", target) or families.beside(target)
    if module is None or not hasattr(module, "STRATEGY"):
        raise ConfigError(
            [
                f"loss_scale._target_={target}: not a loss-scale strategy lsexp knows; pick one of "
                f"conf/loss_scale/ (e.g. loss_scale=dynamic), or put a schema module with SCHEMA and "
                f"STRATEGY beside {target.rsplit('.', 1)[0]} (docs/architecture.md)"
            ]
        )
    try:  # a family from outside lsexp is typed here, where lsexp's own are typed at compose time
        typed = OmegaConf.merge(OmegaConf.structured(module.SCHEMA), cfg.loss_scale)
    except OmegaConfBaseException as err:
        raise ConfigError([f"loss_scale: {str(err).splitlines()[0]}; see {module.__name__}.SCHEMA"]) from None
    return module.STRATEGY(typed)
