"""Which sub-cells of a network are its layers, by name, in execution order.

A model declares them with a `tap_layers` attribute (names as `cells_and_names` gives them). Otherwise
they are its sub-cells that hold parameters, in the order the model declares them, with
nn.SequentialCell and nn.CellList opened up: a parameter-free cell (an activation, a pooling) is often
one object called at several places (LeNet5's ReLU), and a tap on it would add up its calls."""

from __future__ import annotations

from typing import List


class NoLayers(ValueError):
    """The network has no layer a tap could wrap."""


HOW_TO_DECLARE = ("declare them on the model as tap_layers = ('<sub-cell name>', ...), names as "
                  "cells_and_names() gives them")


def layer_names(net) -> List[str]:
    from mindspore import nn

    declared = getattr(net, "tap_layers", None)
    cells = dict(net.cells_and_names())
    if declared is not None:
        unknown = [name for name in declared if name not in cells or not name]
        if unknown:
            raise NoLayers(f"{type(net).__name__}.tap_layers names {', '.join(map(str, unknown))}, which are "
                           f"not its sub-cells; {HOW_TO_DECLARE}")
        return list(declared)

    found: List[str] = []

    def walk(cell, prefix: str) -> None:
        for name, child in cell.name_cells().items():
            path = f"{prefix}{name}"
            if isinstance(child, (nn.SequentialCell, nn.CellList)):
                walk(child, path + ".")
            elif any(True for _ in child.get_parameters()):
                found.append(path)

    walk(net, "")
    if not found:
        raise NoLayers(f"{type(net).__name__} has no sub-cell with parameters to tap; {HOW_TO_DECLARE}")
    return found
