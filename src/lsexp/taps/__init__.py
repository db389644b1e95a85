"""Per-layer taps inside the compiled step: each layer of the network wrapped in a cell that sees its
forward output and the gradient flowing back into it, to observe (statistics out of the step through a
probe's gradient) or to transform (a function of each). Names, layer discovery and the host-side reading
of the statistics are here; the cells are in lsexp.taps.cells, which imports MindSpore."""

# The statistics one tap carries out of the step. EXIT_STATS, from the cell after the layer: the largest
# magnitude of the layer's (transformed) output; grad_*: of the gradient flowing into that output, as the
# backward pass has it (scaled by the loss scale), the fractions by float16's limits. ENTRY_STATS, from the
# cell before it, which only the locator's replay asks for: the largest magnitude of the layer's input and
# of the gradient the layer passes back to it (not measured for an integer input).
EXIT_STATS = ("out_amax", "grad_amax", "underflow_fraction", "zero_fraction", "overflow_fraction")
ENTRY_STATS = ("in_amax", "grad_out_amax")
STATS = ("in_amax",) + EXIT_STATS + ("grad_out_amax",)  # a layer's, in the order values pass it
PASSES = ("forward", "backward")
# A layer-wise scaling rule's record per layer and step (loss_scale=per_layer; layers.csv's last columns):
# the layer's own scale, and the scale the gradient its backward receives carries (its own times those
# of the layers after it, and the global scale), which its weight gradient is unscaled by.
RECORD = ("layer_scale", "carried_scale")


def problems(cfg, plan) -> list:
    """inject.* and telemetry.layers, as far as the network's layers are not needed (those checks are
    lsexp.training.probes'): the rank, the pass, the steps, and what the taps cannot do."""
    from lsexp.config.facts import world_size

    i, p = cfg.inject, []
    k = cfg.train.accumulate_steps
    if i.rank is not None and not 0 <= i.rank < world_size(cfg):
        p.append(f"inject.rank={i.rank}: there are ranks 0..{world_size(cfg) - 1}; use one of them, or null "
                 f"for every rank")
    if i["pass"] not in PASSES:
        p.append(f"inject.pass={i['pass']}: use forward (the layer's output) or backward (the gradient "
                 f"flowing into it)")
    if i.layer is not None:
        if not i.overflow_steps:
            p.append(f"inject.layer={i.layer} without inject.overflow_steps: name the steps to poison, "
                     f"e.g. inject.overflow_steps=[7]")
        if k > 1:
            p.append(f"inject.layer={i.layer} with train.accumulate_steps={k}: injection at a layer counts "
                     f"optimizer steps, not micro-batches; set train.accumulate_steps=1 or drop inject.layer")
    asks = plan.asks_of_layers
    if asks and cfg.train.mode != "graph":
        p.append(f"{' and '.join(asks)} with train.mode={cfg.train.mode}: the taps are in the compiled step; "
                 f"set train.mode=graph")
    if plan.observe_layers and k > 1:
        p.append(f"telemetry.layers=true with train.accumulate_steps={k}: the taps measure one micro-batch; "
                 f"set train.accumulate_steps=1 or use telemetry=grads")
    return p
