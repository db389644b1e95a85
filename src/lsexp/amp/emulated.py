"""bfloat16 on a CPU, emulated. MindSpore 2.10's CPU kernels compute almost nothing in bfloat16 (MatMul,
Conv2D, Gather, ReLU, Softmax and the reductions among those that lack it; docs/casts.md lists what was
measured), so a network amp casts to bfloat16 cannot compile there. Here every cell amp would run in
bfloat16 computes in float32 instead, and the values that cross its boundary are rounded to bfloat16: its
tensor input and its output on the way forward, and so the gradient on the way back (the gradient of a
Cast is a Cast). On GPU and Ascend, whose kernels compute in bfloat16, nothing here runs.

What is not rounded: a cell's own parameters as it computes with them (its float32 master weights, so
its weight gradients too), and the values inside one cell between its own operators. Every cell is a
boundary, the nested ones included (a Transformer block's output as well as each Dense's in it), so
what is left unrounded is only what one cell's construct computes between its calls of sub-cells."""

from __future__ import annotations

from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

# cells that read their sub-cells' parameters in one functional call instead of calling them: one
# boundary (MindSpore's MultiheadAttention never calls its out_proj)
CALLS_AS_ONE = (nn.MultiheadAttention,)
_CONTAINERS = (nn.SequentialCell, nn.CellList)


def _rounded(x):
    if isinstance(x, tuple):
        return tuple(_rounded(t) for t in x)
    if isinstance(x, Tensor) and x.is_floating_point():
        return ops.cast(ops.cast(x, mstype.bfloat16), mstype.float32)
    return x


class RoundedToBfloat16(nn.Cell):
    """`cell` computing in float32 on its first input rounded to bfloat16, its output handed on rounded to
    bfloat16 and held in float32 (so that the operators of the cell that calls it, which compute in
    float32 too, can take it). The attribute is MindSpore's amp wrappers' `_backbone`, so that the cast
    map names the cell as without it."""

    def __init__(self, cell: nn.Cell):
        super().__init__(auto_prefix=False)
        self._backbone = cell

    def construct(self, x, *args, **kwargs):
        return _rounded(self._backbone(_rounded(x), *args, **kwargs))


def _low(cell) -> bool:
    return bool(cell.get_flags().get("bf16"))


def _kept_by_o2(cell) -> bool:
    """MindSpore's own wrapper of a cell its O2 keeps in float32 (_OutputTo16), which casts the cell's
    output to bfloat16: under emulation the output is rounded instead."""
    return type(cell).__name__ == "_OutputTo16"


def emulate(net: nn.Cell) -> nn.Cell:
    """`net` as amp cast it to bfloat16, emulated as the module says, in place; returns the network.
    MindSpore's O2 and O3 wrap the model in _OutputTo32, whose place the model's own wrapper takes, so
    that the cells' paths stay as amp made them. The cast map finds the wrapped cells
    (lsexp.amp.graph)."""
    model = net._backbone if type(net).__name__ == "_OutputTo32" else net
    kept = [(p, p.name) for p in net.get_parameters()]
    cells = list(model.cells_and_names())
    low = {id(cell) for _, cell in cells if _low(cell)}
    for _, cell in cells:
        if id(cell) in low:  # one by one: a cell amp kept in float32 inside one it cast keeps its flags
            cell.add_flags(fp16=False, fp32=True, bf16=False)
    one = {id(c) for _, cell in cells if isinstance(cell, CALLS_AS_ONE) for _, c in cell.cells_and_names()}
    for _, cell in reversed(cells):  # the innermost first, so that each wrapper holds its wrapped cells
        if id(cell) in one:
            continue
        for attr, child in list(cell.name_cells().items()):
            if isinstance(child, _CONTAINERS) or not (id(child) in low or _kept_by_o2(child)):
                continue
            new = RoundedToBfloat16(child._backbone if _kept_by_o2(child) else child)
            if isinstance(cell, _CONTAINERS):
                cell[int(attr)] = new
            else:
                setattr(cell, attr, new)
    if id(model) in low:
        net = RoundedToBfloat16(model)
    for p, name in kept:  # the wrappers would put their attribute names into theirs
        p.name = name
    return net
