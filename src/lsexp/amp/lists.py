"""amp.level and the cast lists, applied to a network.

A list names cells by their name as cells_and_names() gives it (`lsexp layers` lists the layers) or by
their class. Where MindSpore's own list takes the classes, the classes go through
amp.custom_mixed_precision, on top of the level's own list: at O2 a black list extends
amp.get_black_list(), at O0 and O1 a white list runs the classes (and O1's amp.get_white_list()) in low
precision. Named cells, and a black list at O3 or auto, are cast one by one: a black-listed cell computes
in float32 (Cell.to_float), and the cells after it cast its output as they take it; a white-listed cell
computes in low precision inside a LowPrecision cell that hands its output on in float32, as
custom_mixed_precision's white list does."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Dict, List, Tuple

import mindspore as ms
from mindspore import dtype as mstype
from mindspore import nn, ops

from lsexp.amp import lists_of


class Float32Output(nn.Cell):
    """`cell` with its output handed on in float32. The attribute is MindSpore's wrappers' `_backbone`, so
    that a cell's name in the cast map is the same as without the wrapper."""

    def __init__(self, cell: nn.Cell):
        super().__init__(auto_prefix=False)
        self._backbone = cell

    def construct(self, *args, **kwargs):
        return ops.cast(self._backbone(*args, **kwargs), mstype.float32)


class LowPrecision(Float32Output):
    """`cell` computing in `dtype` (Cell.to_float), its output handed on in float32."""

    def __init__(self, cell: nn.Cell, dtype):
        super().__init__(cell.to_float(dtype))


def valid_names(net) -> Tuple[List[str], set]:
    """(every cell's name, every cell's class name) in `net`, as a cast list may give them."""
    paths, classes = [], set()
    for name, cell in net.cells_and_names():
        if name:
            paths.append(name)
            classes.add(type(cell).__name__)
    return paths, classes


def _named(net, names) -> Tuple[List[str], List[type]]:
    """(the names that are cells' names, the classes the other names are), looked up in `net`."""
    paths, _ = valid_names(net)
    by_class: Dict[str, type] = {type(c).__name__: type(c) for _, c in net.cells_and_names()}
    return [n for n in names if n in paths], [by_class[n] for n in names if n not in paths]


def _replace(net, path: str, new: nn.Cell) -> None:
    parent_path, _, attr = path.rpartition(".")
    parent = dict(net.cells_and_names())[parent_path] if parent_path else net
    kept = [(p, p.name) for p in new.get_parameters()]
    if isinstance(parent, (nn.SequentialCell, nn.CellList)):
        parent[int(attr)] = new
    else:
        setattr(parent, attr, new)
    for p, name in kept:  # the wrapper would put its own path into the parameters' names
        p.name = name


def with_amp(net, amp, out_dir: Path):
    """`net` in amp.level's precision with amp.white_list or amp.black_list applied; bfloat16 on a CPU
    emulated (lsexp.amp.emulated)."""
    dtype = ms.float16 if amp.dtype == "float16" else ms.bfloat16
    white, black = lists_of(amp)
    names = white or black or []
    paths, classes = _named(net, names)
    cells = dict(net.cells_and_names())
    # O1 rewrites the network into Python source under ./rewritten_network, which graph mode reads back
    # when it compiles: keep it in the run's directory, not wherever lsexp was started.
    with contextlib.chdir(out_dir):
        if black and amp.level == "O2" and classes:
            net = ms.amp.custom_mixed_precision(net, black_list=ms.amp.get_black_list() + classes,
                                                dtype=dtype)
            classes = []
        elif white and classes:
            extra = ms.amp.get_white_list() if amp.level == "O1" else []
            net = ms.amp.custom_mixed_precision(net, white_list=extra + classes, dtype=dtype)
            classes = []
        else:
            net = ms.amp.auto_mixed_precision(net, amp.level, dtype=dtype)
    if black:  # the cells are the ones amp cast, in place (O2 wraps some, O3 and auto none)
        for cell in [cells[p] for p in paths] + [c for c in cells.values() if isinstance(c, tuple(classes))]:
            cell.to_float(mstype.float32)
    elif white:  # O1 rewrote the network: its cells are found again by name
        after = dict(net.cells_and_names())
        for path in paths:
            found = path if path in after else next(k for k in after if k.endswith("." + path))
            _replace(net, found, LowPrecision(after[found], dtype))
    if dtype == ms.bfloat16 and ms.get_context("device_target") == "CPU":
        from lsexp.amp.emulated import emulate

        net = emulate(net)
    return net
