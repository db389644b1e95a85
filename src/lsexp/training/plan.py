"""The run's plan: what its train step needs, read once from the checked config. Every module that
builds or drives the step asks the plan, so that a feature (the taps, the locator, saturation, a
precision recipe, the cast map, the telemetry kinds, accumulation, data parallel) is decided in one
place. Nothing here imports MindSpore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from lsexp import amp
from lsexp.config.facts import shrinking_tokens


@dataclass(frozen=True)
class Plan:
    observe_layers: bool  # telemetry.layers: the taps measure every layer in every step
    inject_layer: Optional[str]  # inject.layer: the tap whose transform poisons a layer
    inject_backward: bool  # inject.pass=backward: the gradient flowing into it, not its output
    inject_steps: Tuple[int, ...]  # inject.overflow_steps (micro-batches under accumulation)
    inject_rank: Optional[int]  # inject.rank: the one rank that injects, None for every rank
    saturation: bool  # device.overflow_mode=saturation: every tap saturates, as Ascend's mode would
    status_check: bool  # device.status_check: the overflow check reads the emulated flag
    locate: bool  # telemetry.locate in the compiled step: an overflowed step is replayed
    precision: Optional[str]  # precision.recipe, None for none
    cast_lists: bool  # amp.white_list or amp.black_list names cells of the network
    grads: bool  # telemetry.grads: the gradients' statistics in every step
    histogram_steps: Tuple[int, ...]  # telemetry.histogram_steps
    accumulate_steps: int  # train.accumulate_steps
    micro_batch: int  # dataset.batch_size: one micro-batch's samples
    data_parallel: bool  # parallel=data
    mean_over_tokens: Optional[int]  # train.mean_over_tokens, as it acts on the gradients
    per_layer: bool = False  # loss_scale=per_layer (a strategy that scales_layers): every layer's tap scales

    @property
    def records_layers(self) -> bool:
        """Whether the step reports every layer's statistics (layers.csv): telemetry.layers, or per-layer
        scales, whose record is a column of that table."""
        return self.observe_layers or self.per_layer

    @property
    def tapped(self) -> bool:
        """Whether the step's own network is tapped: the taps act or report in every step. The locator
        alone replays an overflowed step on a tapped copy, so a clean run compiles no tap."""
        return self.observe_layers or self.inject_layer is not None or self.saturation or self.per_layer

    @property
    def asks_of_layers(self) -> Tuple[str, ...]:
        """The keys that need the network's layers, as a refusal names them."""
        return tuple(key for key, on in (("telemetry.layers=true", self.observe_layers),
                                         (f"inject.layer={self.inject_layer}", self.inject_layer is not None),
                                         ("device.overflow_mode=saturation", self.saturation),
                                         ("loss_scale=per_layer", self.per_layer)) if on)

    @property
    def probes_network(self) -> bool:
        """Whether the checks need the network itself: its layers, its matrix products, its cell names."""
        return self.tapped or self.cast_lists or self.precision is not None

    def injects_on(self, rank: int) -> Tuple[int, ...]:
        """The steps this rank poisons: inject.rank picks one rank under data parallel."""
        return self.inject_steps if self.inject_rank is None or self.inject_rank == rank else ()


def plan_of(cfg) -> Plan:
    """The plan of a config that passed validation."""
    precision = cfg.get("precision")
    recipe = None if precision is None or precision.recipe == "none" else str(precision.recipe)
    saturation = cfg.device.get("overflow_mode", "infnan") == "saturation"
    inject, telemetry = cfg.inject, cfg.telemetry
    return Plan(
        observe_layers=bool(telemetry.layers),
        inject_layer=inject.get("layer") or None,
        inject_backward=inject.get("pass") == "backward",
        inject_steps=tuple(inject.overflow_steps),
        inject_rank=inject.get("rank"),
        saturation=saturation,
        status_check=saturation and bool(cfg.device.get("status_check")),
        locate=cfg.train.mode == "graph" and bool(telemetry.get("locate")),
        precision=recipe,
        cast_lists=any(amp.lists_of(cfg.amp)),
        grads=bool(telemetry.grads),
        histogram_steps=tuple(telemetry.histogram_steps),
        accumulate_steps=int(cfg.train.accumulate_steps),
        micro_batch=int(cfg.dataset.batch_size),
        data_parallel=cfg.parallel.parallel_mode == "data_parallel",
        mean_over_tokens=shrinking_tokens(cfg),
        per_layer=_scales_layers(cfg),
    )


def _scales_layers(cfg) -> bool:
    from lsexp import strategies
    from lsexp.config.errors import ConfigError

    try:
        return strategies.resolve(cfg).scales_layers
    except ConfigError:  # validation names the unknown strategy
        return False
