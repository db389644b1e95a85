"""The cast map: every computing operator of the compiled forward pass, with the cell it belongs to and
the type it computes in, as MindSpore's graph compiler leaves it (its IR after the last pass, dumped to a
scratch folder and read back). That is what amp.level=auto decides, operator by operator, and what a cast
list changed: a cell's output type alone would not show it (under auto a Dense's MatMul runs in float16,
its BiasAdd in float32)."""

from __future__ import annotations

import csv
import glob
import os
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Dict, List

CASTS_CSV = "casts.csv"
# emulates: "bfloat16" where the operator computes in float32 on values rounded to bfloat16 at its cell's
# boundary, because MindSpore's CPU kernels lack bfloat16 (lsexp.amp.emulated)
COLUMNS = ("cell", "class", "op", "dtype", "count", "emulates")
# bookkeeping, not computation: the casts themselves are what the map shows the effect of
_SKIP = {"Cast", "Load", "MakeTuple", "UpdateState", "TupleGetItem", "Depend", "Return", "Assign",
         "StopGradient", "Reshape", "Shape", "ZerosLike", "OnesLike"}
_NODE = re.compile(r"= (?:PrimFunc_)?(\w+)\(.*\n\s*: \(.*\) -> \((.*?)\)\n"
                   r"\s*# Fullname with scope: \((\S+)\)")
_WRAPPER_ATTRS = {"_backbone"}  # MindSpore's amp wrappers (_OutputTo16, _OutputTo32) and lsexp's LowPrecision


def _cell_of(scope: str):
    """(cell name, class) of an operator's scope: Default/a-Dense/MatMul-op0 is ('a', 'Dense'); an amp
    wrapper's own level is dropped, and an operator of the network itself is ('', its class)."""
    parts = scope.split("/")[1:-1]  # Default ... op
    names, cls = [], ""
    for part in parts:
        attr, _, cls = part.partition("-")
        if attr not in _WRAPPER_ATTRS:
            names.append(attr)
    return ".".join(names), cls


def read_ir(text: str) -> List[Dict[str, object]]:
    """The cast map's rows from the text of a dumped IR file."""
    counts: Counter = Counter()
    for op, outputs, scope in _NODE.findall(text):
        if op in _SKIP:
            continue
        dtypes = re.findall(r"Tensor\[(\w+)\]", outputs)
        if not dtypes:
            continue
        cell, cls = _cell_of(scope)
        counts[(cell, cls, op, dtypes[0].lower())] += 1
    return [dict(zip(COLUMNS, key + (n, ""))) for key, n in counts.items()]


def _emulated_cells(net) -> List[str]:
    """The paths, as the cast map names cells, of the cells lsexp.amp.emulated wrapped."""
    return [".".join(p for p in path.split(".") if p not in _WRAPPER_ATTRS)
            for path, cell in net.cells_and_names() if type(cell).__name__ == "RoundedToBfloat16"]


def _mark_emulated(rows: List[Dict[str, object]], cells: List[str]) -> None:
    for r in rows:
        cell = str(r["cell"])
        if any(c == "" or cell == c or cell.startswith(c + ".") for c in cells):
            r["emulates"] = "bfloat16"


def cast_map(net, *inputs) -> List[Dict[str, object]]:
    """The cast map of `net`'s forward pass on inputs shaped as `inputs`, compiled in graph mode as the
    train step runs it (set_train: BatchNorm computes as it trains)."""
    import mindspore as ms

    net.set_train(True)
    mode = ms.get_context("mode")
    previous = os.environ.get("MS_DEV_DUMP_IR_PASSES")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["MS_DEV_DUMP_IR_PASSES"] = "execute"  # the last pass's file only
        ms.set_context(mode=ms.GRAPH_MODE, save_graphs=1, save_graphs_path=scratch)
        try:
            net.compile(*inputs)
        finally:
            ms.set_context(mode=mode, save_graphs=0)
            if previous is None:
                os.environ.pop("MS_DEV_DUMP_IR_PASSES", None)
            else:
                os.environ["MS_DEV_DUMP_IR_PASSES"] = previous
        # <n>_execute_<id>.ir; the passes named *_to_execute_* are earlier ones
        files = sorted(f for f in glob.glob(os.path.join(scratch, "*.ir"))
                       if re.fullmatch(r"\d+_execute_\d+\.ir", os.path.basename(f)))
        if not files:
            raise RuntimeError("MindSpore wrote no IR for the cast map")
        rows = read_ir(Path(files[-1]).read_text())
    _mark_emulated(rows, _emulated_cells(net))
    return rows


def write_csv(rows: List[Dict[str, object]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def summary(rows: List[Dict[str, object]]) -> Dict[str, object]:
    """For summary.json and the run's params: how many operators computed in each type (and of them, how
    many emulate bfloat16), and the cells that computed in float32 while others computed in low precision
    (or emulated it)."""
    by_dtype: Counter = Counter()
    for r in rows:
        by_dtype[r["dtype"]] += int(r["count"])
        if r.get("emulates"):
            by_dtype[f"emulated_{r['emulates']}"] += int(r["count"])
    low = {r["cell"] for r in rows if r["dtype"] in ("float16", "bfloat16") or r.get("emulates")}
    kept = sorted({r["cell"] for r in rows if r["dtype"] == "float32" and r["cell"] not in low and r["cell"]})
    return {"ops_by_dtype": dict(sorted(by_dtype.items())), "float32_cells": kept}
