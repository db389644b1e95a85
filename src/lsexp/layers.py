"""`lsexp layers [OVERRIDES]`: the layers of a config's model that lsexp's taps wrap, in execution order,
which are the names inject.layer takes and the rows of telemetry=layers. It builds the network (not the
train step) from the config the same overrides give `python -m lsexp`."""

from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] = ()) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print("usage: lsexp layers [OVERRIDES ...]\n\nPrints the tapped layers of the model the overrides "
              "select (e.g. lsexp layers model=resnet dataset=digits): name, class, parameters.")
        return 0
    from hydra import compose, initialize_config_dir

    from lsexp.config import hydra_errors, paths
    from lsexp.config.errors import ConfigError
    from lsexp.config.registry import register_configs
    from lsexp.preflight import validate

    register_configs()
    try:
        with hydra_errors.reported_in_one_line(list(argv)):
            with initialize_config_dir(config_dir=str(paths.conf_dir()), version_base="1.3"):
                cfg = compose("config", overrides=list(argv))
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    from lsexp.taps.layers import NoLayers, layer_names
    from lsexp.training.build import network

    try:
        validate(cfg)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    net = network(cfg)
    try:
        names = layer_names(net)
    except NoLayers as err:
        print(f"lsexp: model._target_={cfg.model._target_}: {err}", file=sys.stderr)
        return 2
    cells = dict(net.cells_and_names())
    width = max(len(n) for n in names)
    for name in names:
        cell = cells[name]
        count = sum(p.size for p in cell.get_parameters())
        print(f"{name:<{width}}  {type(cell).__name__:<28} {count:>9,d} parameters")
    return 0
