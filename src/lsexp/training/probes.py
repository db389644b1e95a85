"""The probes of the network itself, run before anything is written: one that cannot take the data, a
bfloat16 operator the CPU kernels lack, and the names the taps, the cast lists and a precision recipe
give against the network's cells. The network they build is the one the step then trains."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from lsexp import amp
from lsexp.config import families
from lsexp.config.errors import ConfigError
from lsexp.training.build import load_data, loss, network
from lsexp.training.keys import step_problems


@dataclass(frozen=True)
class Probed:
    """What the probes built: the data (for a user's own model or data set) and the network, or None."""

    data: Any = None
    net: Any = None


def probe(cfg, plan) -> Optional[Probed]:
    """Every probe the config needs, in order; ConfigError with the first that fails."""
    # where lsexp emulates bfloat16 (lsexp.amp.emulated), every cast cell computes in float32: no probe
    emulated = amp.emulates(cfg.amp, cfg.device.device_target)
    if cfg.amp.dtype == "bfloat16" and cfg.amp.level != "O0" and not emulated:
        refusal = bfloat16_refusal(cfg)
        if refusal:
            raise ConfigError([refusal])
    own = (families.of("model", cfg.model._target_) is None
           or families.of("dataset", cfg.dataset._target_) is None)
    data, net = trace_shapes(cfg, plan) if own else (None, None)
    if plan.probes_network:
        net = network(cfg) if net is None else net
        problems = tap_problems(cfg, plan, net)
        if problems:
            raise ConfigError(problems)
    return Probed(data, net) if net is not None else None


def trace_shapes(cfg, plan):
    """Build the data and the network and run two samples forward, eagerly (PyNative), so that a
    network that cannot take the data fails with one line before anything is written. Returns the
    (data, network) for the run to train, so that neither is built twice."""
    from lsexp import device
    from lsexp.models.loss import SoftmaxCrossEntropy

    device.configure(cfg.device, "pynative", cfg.device.threads_num, device.onednn_isa(cfg.device))
    try:
        data = load_data(cfg)
        x, y = next(iter(data.batches(cfg.dataset, 0, 0)))
        net = network(cfg)
        SoftmaxCrossEntropy()(net(x[:2]), y[:2])
    except Exception as err:  # MindSpore's shape and type errors, a user's own exceptions
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ConfigError(
            [
                f"model._target_={cfg.model._target_} with dataset._target_={cfg.dataset._target_}: "
                f"{first}; make the model take the data set's batches"
            ]
        ) from None
    # Only now is a user's data set's size known: the checks validation could not make for it.
    problems = step_problems(cfg, plan, data.num_train)
    if problems:
        raise ConfigError(problems)
    return data, net


def tap_problems(cfg, plan, net) -> List[str]:
    """inject.layer and telemetry.layers against the network's layers (lsexp.taps.layers), the cast lists
    against its cells, and a precision recipe against its matrix products."""
    from lsexp.taps.layers import NoLayers, layer_names

    unknown = amp.name_problems(cfg.amp, net)
    if unknown:
        return [unknown]
    if plan.precision is not None:
        from lsexp.precision.recipes import products

        if not products(net):
            return [f"precision={plan.precision} with model._target_={cfg.model._target_}: the model has "
                    f"no nn.Dense or nn.Conv2d for the recipe to quantise; use precision=none"]
    asks = plan.asks_of_layers
    if not asks:
        return []
    try:
        names = layer_names(net)
    except NoLayers as err:
        return [f"{' and '.join(asks)} with model._target_={cfg.model._target_}: {err}"]
    if plan.per_layer:
        from lsexp.taps.chain import not_a_chain

        cells = dict(net.cells_and_names())
        why = not_a_chain(net, [cells[name] for name in names])
        if why is not None:
            return [f"loss_scale=per_layer with model._target_={cfg.model._target_}: {why}; use a model "
                    f"whose layers are one chain, such as model=mlp (docs/per_layer.md)"]
    if plan.inject_layer is not None and plan.inject_layer not in names:
        return [f"inject.layer={plan.inject_layer}: model._target_={cfg.model._target_} has no such layer; "
                f"use one of {', '.join(names)} (lsexp layers lists them)"]
    return []


def bfloat16_refusal(cfg) -> Optional[str]:
    """amp.dtype=bfloat16 on a CPU: one forward and backward pass of two samples, eagerly, of the network
    as the run casts it (lsexp.amp.emulated computes in float32 the cells amp casts to bfloat16, since
    MindSpore's CPU kernels mostly lack it). The line naming an operator that still meets a CPU kernel
    without bfloat16 (under amp.level=auto, which casts operator by operator, or in a user's own cells),
    or None when the pass runs (or the target is not a CPU): preflight refuses the run with it before
    anything is written, instead of a kernel-selection traceback from the compiled step."""
    import mindspore as ms

    from lsexp import device
    from lsexp.amp.lists import with_amp
    from lsexp.training.plan import plan_of

    isa = device.onednn_isa(cfg.device)
    if device.configure(cfg.device, "pynative", cfg.device.threads_num, isa) != "CPU":
        return None
    data = load_data(cfg)
    x, y = next(iter(data.batches(cfg.dataset, 0, 0)))
    with tempfile.TemporaryDirectory() as scratch:  # O1's rewritten source
        net = with_amp(network(cfg), cfg.amp, Path(scratch))
        loss_net = ms.nn.WithLossCell(net, loss(cfg, plan_of(cfg)))
        try:
            ms.value_and_grad(loss_net, None, net.trainable_params())(x[:2], y[:2])
        except (TypeError, RuntimeError) as err:
            found = re.search(r"Select CPU operator\[(\w+)\]", str(err))
            if found is None:
                raise
            return (f"amp.dtype=bfloat16: MindSpore {ms.__version__}'s CPU kernels have no bfloat16 "
                    f"{found.group(1)}, which model._target_={cfg.model._target_} needs at "
                    f"amp.level={cfg.amp.level}; use amp=O2 or O3 (lsexp emulates bfloat16 there on a CPU), "
                    f"amp.dtype=float16 with a loss_scale, or a GPU or Ascend device")
    return None
