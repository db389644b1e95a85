"""The run's MindSpore objects from its config: the data, the network in its precision, the optimizer and
the engine's train step around the strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def load_data(cfg):
    """The dataset group as one of lsexp.datasets.kinds, whatever its `_target_` returned."""
    from hydra.utils import call

    from lsexp.datasets.kinds import as_data

    return as_data(call(cfg.dataset, _convert_="all"), cfg.dataset)


def network(cfg):
    """The model group's nn.Cell, initialised from train.seed."""
    import mindspore as ms
    from hydra.utils import instantiate

    ms.set_seed(cfg.train.seed)
    return instantiate(cfg.model, _convert_="all")


def loss(cfg, plan):
    """The loss every workload trains on, its gradients as train.mean_over_tokens makes them."""
    from lsexp.config.facts import batch_tokens
    from lsexp.models.loss import loss_cell

    return loss_cell(batch_tokens(cfg), plan.mean_over_tokens)


def build_optimizer(cfg, params, loss_scale: float, run_steps: int, device_target: str):
    """(optimizer, what the train step does around its update): the optimizer group at the lr_schedule
    group's learning rate, with the loss_scale the strategy leaves the gradients scaled by where its
    class takes one."""
    from lsexp import optimizers, schedules
    from lsexp.config.facts import gradient_divisor

    learning_rate, advances = schedules.build(cfg.lr_schedule, cfg.optimizer.learning_rate, run_steps)
    optimizer = optimizers.build(cfg.optimizer, params, learning_rate, loss_scale, device_target,
                                 gradient_divisor(cfg))
    return optimizer, dict(clip_grad_norm=cfg.optimizer.clip_grad_norm, advance_schedule=advances,
                           optimizer_divides=optimizers.divides_itself(cfg.optimizer))


def build(job, last_step: int, net=None):
    """(network, train step, taps): the network (or the one the shape probe built) in amp.level's
    precision, tapped and quantised as the job's plan says, with the loss and the optimizer, in the train
    step that engine._target_ builds around the strategy."""
    from hydra.utils import get_method
    from mindspore import nn

    from lsexp.engines.body import StepOptions

    cfg, plan = job.cfg, job.plan
    net = network(cfg) if net is None else net
    layers = tapped_layers(plan, net) if plan.tapped else {}
    net = with_amp(cfg, net, job.out_dir)
    taps, injection = None, None
    if layers:  # after amp, so that the taps take no part in its casts
        taps, injection = install_taps(plan, net, layers, rule=job.strategy.layer_rule() if plan.per_layer
                                       else None)
    advance = with_precision(cfg, plan, net)
    loss_net = nn.WithLossCell(net, loss(cfg, plan))
    optimizer, around = build_optimizer(cfg, net.trainable_params(), job.decided.optimizer_loss_scale,
                                        last_step, job.target)
    saturation = step_saturation(cfg, plan, taps, job.target) if plan.saturation else {}
    options = StepOptions(
        inject_steps=plan.injects_on(job.rank), last_step=last_step, native_check=job.target != "CPU",
        telemetry=plan.grads, histogram=bool(plan.histogram_steps), inject_graph=bool(plan.inject_steps),
        accumulate_steps=plan.accumulate_steps, micro_batch=plan.micro_batch,
        probes=taps.probes(entry=False) if plan.observe_layers else (),
        **per_layer_records(net, taps) if plan.per_layer else {},
        layer_factor=None if injection is None else injection.factor, keep_weights=plan.locate,
        advance=advance, **around, **saturation)
    build_train_step = get_method(cfg.engine._target_)  # lsexp.engines.cell's or .functional's
    step_cell = build_train_step(job.strategy, loss_net, optimizer, options)
    step_cell.set_train()
    return net, step_cell, taps


def with_amp(cfg, net, out_dir: Path):
    """`net` in amp.level's precision, with amp.white_list or amp.black_list (lsexp.amp.lists)."""
    from lsexp.amp.lists import with_amp as cast

    return cast(net, cfg.amp, out_dir)


def record_casts(cfg, data, out_dir: Path) -> dict:
    """casts.csv, the cast map of the network as amp.level and the cast lists make it (lsexp.amp.graph),
    compiled on a copy of it on the first batch's shapes; returns its summary. Built before the step's own
    network, which then starts from the same random state."""
    from lsexp.amp.graph import CASTS_CSV, cast_map, summary, write_csv

    x, _ = next(iter(data.batches(cfg.dataset, 0, 0)))
    rows = cast_map(with_amp(cfg, network(cfg), out_dir), x)
    write_csv(rows, out_dir / CASTS_CSV)
    return summary(rows)


def with_precision(cfg, plan, net) -> list:
    """precision.recipe: the network's matrix products quantised in place (lsexp.precision), after amp,
    so that the quantisers see the types amp gives them, and inside the taps, so that a tap sees a layer's
    output as the recipe makes it. Returns the delayed scales the train step advances."""
    if plan.precision is None:
        return []
    from lsexp.precision.recipes import delayed_scales, install

    return delayed_scales(install(net, cfg.precision))


def step_saturation(cfg, plan, taps, target: str) -> dict:
    """What the train step takes of device.overflow_mode=saturation (lsexp.engines.body.StepOptions): the
    taps' status probes, whether its check reads the emulated flag, and where a parameter gradient
    saturates."""
    from lsexp.native import built
    from lsexp.saturation import BF16_MAX, FALLBACK, FP16_MAX, KERNELS, Kernels

    largest = FP16_MAX if cfg.amp.dtype == "float16" else BF16_MAX
    lib = built(KERNELS, FALLBACK) if target == "CPU" else None
    return dict(saturation=True, status_probes=tuple(taps.status_probes()), status_check=plan.status_check,
                grad_largest=largest, grad_rule=Kernels(lib).rule_as(largest) if lib else None)


def tapped_layers(plan, net) -> dict:
    """{name: cell} of the layers the taps wrap, in execution order; empty when the network has no layers
    and only the locator asks (it then locates nothing)."""
    from lsexp.taps.layers import NoLayers, layer_names

    try:
        names = layer_names(net)
    except NoLayers:
        if plan.records_layers or plan.inject_layer is not None:
            raise  # preflight refuses these first, in one line
        return {}
    cells = dict(net.cells_and_names())
    return {name: cells[name] for name in names}


def install_taps(plan, net, layers: dict, saturating: Optional[bool] = None, rule: Optional[dict] = None,  # noqa: PLR0913
                 observe: Optional[bool] = None):
    """(Taps, the inject.layer transform or None), installed in `net` in place; where the plan saturates
    (or `saturating` says so), every tap saturates (lsexp.taps.saturating), after the injection where
    there is one. With `rule` (loss_scale=per_layer) every tap scales its layer's gradient by the rule
    (lsexp.taps.adaptive), the taps threaded as one chain (lsexp.taps.chain), measuring the layers where
    `observe` (None: as telemetry.layers says)."""
    from lsexp.taps.cells import LayerInjection, install

    if rule is not None:
        import mindspore as ms

        from lsexp.taps.adaptive import AdaLossTransform
        from lsexp.taps.chain import thread

        host = ms.get_context("device_target") == "CPU"
        # the statistics only with telemetry.layers: the scales alone cost less than half as much
        taps = install(net, list(layers), layers, lambda name: AdaLossTransform(**rule, host=host),
                       observe=plan.observe_layers if observe is None else observe)
        thread(net, taps.taps)
        return taps, None
    saturating = plan.saturation if saturating is None else saturating
    injection = None
    if plan.inject_layer is not None:
        injection = LayerInjection(backward=plan.inject_backward)

    def transform_for(name):
        mine = injection if name == plan.inject_layer else None
        if not saturating:
            return mine
        from lsexp.taps.saturating import SaturatingTransform

        return SaturatingTransform(mine)

    # saturating taps need measure nothing unless telemetry=layers reads them: the locator replays on a copy
    observe = not saturating or plan.observe_layers
    return install(net, list(layers), layers, transform_for, observe=observe), injection


def per_layer_records(net, taps) -> dict:
    """StepOptions' records and, by trained parameter's name, the tap whose record's carried scale it
    carries."""
    linked = [t for t in taps.taps if t.is_linked]
    return dict(records=tuple(taps.record_probes()),
                unscale_by=tuple((p.name, i) for i, t in enumerate(linked)
                                 for p in t.layer.trainable_params()))


def tapped_copy(cfg, plan, out_dir: Path, rule: Optional[dict] = None):
    """The locator's loss network when the step's own is not tapped (or its taps saturate, which would hide
    what the locator looks for): the model built again, in amp.level's precision, every layer tapped; or
    None when it has no layers. Its parameters have the step's names."""
    from mindspore import nn

    net = network(cfg)
    layers = tapped_layers(plan, net)
    if not layers:
        return None
    net = with_amp(cfg, net, out_dir)
    # with per_layer's rule (`rule`), the step's scales, so that the replay's gradients are the step's
    taps, _ = install_taps(plan, net, layers, saturating=False, rule=rule, observe=True)
    with_precision(cfg, plan, net)
    return nn.WithLossCell(net, loss(cfg, plan)), taps
