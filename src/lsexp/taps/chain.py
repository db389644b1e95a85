"""A chain of layers whose taps hand each other, coming back, the scale their gradient carries.

A layer-wise scaling rule (lsexp.taps.cells.LinkedTransform) needs, at each layer, the scale its incoming
gradient already carries: the product of the scales of the layers after it. In Chainer, where adaptive
loss scaling was written, that scale rides on the gradient variable; a MindSpore gradient is a bare
tensor, and a custom bprop may not read a Parameter. So the taps are threaded by a link: a zero scalar
each tap passes on going forward, whose gradient coming back is the scale, an edge of the graph like any
other. A network whose layers are one nn.SequentialCell (model=mlp) is such a chain; the threaded
SequentialCell is replaced in place by a LinkedChain holding the same cells.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
from mindspore import Parameter, Tensor, nn
from mindspore import dtype as mstype

from lsexp.taps.cells import Tap


class NotAChain(ValueError):
    """The linked taps are not one chain of layers, or a trained parameter lies outside them."""


class LinkedChain(nn.Cell):
    """An nn.SequentialCell's cells, called in order, the linked taps with the link."""

    def __init__(self, cells: List[nn.Cell]):
        super().__init__(auto_prefix=False)
        self.cell_list = nn.CellList(cells, auto_prefix=False)
        self.linked = tuple(isinstance(c, Tap) and c.is_linked for c in cells)
        self.count = len(cells)
        # a Parameter, not a constant: the compiler folds a constant that a cell hands back unchanged,
        # and the link's gradient, the scale, would not reach the taps before it
        self.start = Parameter(Tensor(np.float32(0.0), mstype.float32), name="lsexp_chain_link",
                               requires_grad=False)

    def construct(self, x):
        link = self.start
        for i in range(self.count):
            if self.linked[i]:
                x, link = self.cell_list[i].linked(x, link)
            else:
                x = self.cell_list[i](x)
        return x


def _holder(net: nn.Cell, cells: List[nn.Cell]):
    """(path, the nn.SequentialCell holding every one of `cells` directly), or None."""
    ids = {id(c) for c in cells}
    for path, cell in net.cells_and_names():
        if isinstance(cell, nn.SequentialCell) and ids <= {id(c) for c in cell.cell_list}:
            return path, cell
    return None


def not_a_chain(net: nn.Cell, cells: List[nn.Cell]) -> Optional[str]:
    """Why `cells` (the layers to scale) cannot be threaded as a chain, or None: they are not the direct
    cells of one nn.SequentialCell inside the network, or a trained parameter lies outside them (its
    gradient would carry a scale no tap records)."""
    held = _holder(net, cells)
    if held is None or held[0] == "":
        return ("its layers are not the cells of one nn.SequentialCell, through which each layer's scale "
                "is handed back (lsexp.taps.chain)")
    inside = {id(p) for c in cells for p in c.get_parameters()}
    outside = [p.name for p in net.trainable_params() if id(p) not in inside]
    if outside:
        return f"{', '.join(outside)} lie outside its layers, and their gradients would carry no known scale"
    return None


def thread(net: nn.Cell, taps: List[Tap]) -> None:
    """Replace the nn.SequentialCell that holds every linked tap by a LinkedChain of the same cells;
    NotAChain (not_a_chain's reason) when they are not one."""
    linked = [t for t in taps if t.is_linked]
    why = not_a_chain(net, linked)
    if why is not None:
        raise NotAChain(why)
    path, cell = _holder(net, linked)
    chain = LinkedChain(list(cell.cell_list))
    names = [(p, p.name) for p in chain.get_parameters()]
    parent_path, _, attr = path.rpartition(".")
    parent = dict(net.cells_and_names())[parent_path] if parent_path else net
    setattr(parent, attr, chain)
    for p, name in names:
        p.name = name
