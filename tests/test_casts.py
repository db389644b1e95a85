"""amp=auto and the cast lists (lsexp.casts): the cast map a run records in casts.csv equals the one the
graph compiler makes of MindSpore's own auto_mixed_precision(net, "auto") on the same network, for every
built-in model; a black list naming one layer keeps exactly that layer in float32, a white list naming one
runs exactly that one in float16; a name that is no cell is refused in one line."""

import csv
import glob
import os
import re
import tempfile
from collections import Counter

import pytest

from conftest import compose_cfg, run_cli
from helpers.refusal import assert_refused

MODELS = {
    "lenet5": [],
    "mlp": ["model=mlp", "dataset=digits"],
    "resnet": ["model=resnet", "model.depth=8", "dataset=digits"],
    "transformer_sequence": ["workload=transformer_sequence"],
    "transformer_text": ["workload=transformer_text"],
    "gpt": ["workload=gpt_python", "dataset.max_bytes=200000", "dataset.seq_len=32", "dataset.batch_size=16"],
}
FAST = {"lenet5", "mlp"}
SKIP = {"Cast", "Load", "MakeTuple", "UpdateState", "TupleGetItem", "Depend", "Return", "Assign",
        "StopGradient", "Reshape", "Shape", "ZerosLike", "OnesLike"}


def compiled_ops(net, x) -> Counter:
    """(cell, op, dtype) -> count of the operators in the graph MindSpore compiles for net(x), read from
    its IR after the last pass; written here apart from lsexp.casts.graph, as this test's reference."""
    import mindspore as ms

    net.set_train(True)  # as the train step runs it
    with tempfile.TemporaryDirectory() as d:
        os.environ["MS_DEV_DUMP_IR_PASSES"] = "execute"
        ms.set_context(mode=ms.GRAPH_MODE, save_graphs=1, save_graphs_path=d)
        try:
            net.compile(x)
        finally:
            ms.set_context(save_graphs=0)
            os.environ.pop("MS_DEV_DUMP_IR_PASSES")
        [path] = [f for f in glob.glob(f"{d}/*.ir")
                  if re.fullmatch(r"\d+_execute_\d+\.ir", os.path.basename(f))]
        text = open(path).read()
    found = Counter()
    for block in text.split("\n  %")[1:]:
        head = re.match(r"\d+\(\S*\) = (?:PrimFunc_)?(\w+)\(", block)
        out = re.search(r"\) -> \((?:[^\n]*?Tensor\[(\w+)\])?", block)  # a tuple's first tensor
        scope = re.search(r"# Fullname with scope: \((\S+)\)", block)
        if not (head and out and out.group(1) and scope) or head.group(1) in SKIP:
            continue
        # Default/<attr>-<Class>/.../<Op>-opN; MindSpore's amp wrappers hold the cell as _backbone
        cell = ".".join(p.split("-")[0] for p in scope.group(1).split("/")[1:-1]
                        if not p.startswith("_backbone-"))
        found[(cell, head.group(1), out.group(1).lower())] += 1
    return found


def recorded(run_dir) -> Counter:
    with open(run_dir / "casts.csv") as f:
        return Counter({(r["cell"], r["op"], r["dtype"]): int(r["count"]) for r in csv.DictReader(f)})


def _reference(overrides, level: str) -> Counter:
    import mindspore as ms

    from lsexp.training.build import load_data, network

    cfg = compose_cfg(*overrides)
    x, _ = next(iter(load_data(cfg).batches(cfg.dataset, 0, 0)))
    return compiled_ops(ms.amp.auto_mixed_precision(network(cfg), level, dtype=ms.float16), x)


@pytest.mark.parametrize("model", [m if m in FAST else pytest.param(m, marks=pytest.mark.slow)
                                   for m in MODELS])
def test_amp_auto_records_the_cast_map_mindspore_makes_of_auto_mixed_precision(train_run, model):
    from mindspore.train import amp

    summary, _, run_dir = train_run(*MODELS[model], "amp=auto", "loss_scale=dynamic", "train.max_steps=1")
    got = recorded(run_dir)
    assert got == _reference(MODELS[model], "auto")
    # and it is what MindSpore's lists say: its auto white list's operators in float16, its black list's
    # in float32
    white = {p.__name__ for p in amp.AMP_AUTO_WHITE_LIST}
    black = {p.__name__ for p in amp.AMP_AUTO_BLACK_LIST}
    ops = {(op, dtype) for (_, op, dtype) in got}
    assert any(op in white for op, _ in ops)
    assert all(dtype == "float16" for op, dtype in ops if op in white)
    assert all(dtype == "float32" for op, dtype in ops if op in black)
    low = sum(n for (_, _, d), n in got.items() if d == "float16")
    assert summary["casts"]["ops_by_dtype"]["float16"] == low


def _differs(got: Counter, reference: Counter) -> set:
    return {cell for (cell, _, _) in (got - reference) + (reference - got)}


@pytest.mark.parametrize("model,level,layer", [
    ("mlp", "O2", "layers.3"),
    pytest.param("lenet5", "O3", "fc2", marks=pytest.mark.slow),
    pytest.param("gpt", "auto", "blocks.1.dense1", marks=pytest.mark.slow),
])
def test_a_black_list_naming_one_layer_keeps_exactly_that_layer_in_float32(train_run, model, level, layer):
    _, _, run_dir = train_run(*MODELS[model], f"amp={level}", f"amp.black_list=[{layer}]",
                              "loss_scale=dynamic", "train.max_steps=1")
    got, reference = recorded(run_dir), _reference(MODELS[model], level)
    assert _differs(got, reference) == {layer}  # every other cell computes as the level alone has it
    mine = {(op, dtype) for (cell, op, dtype) in got if cell == layer}
    assert mine and all(dtype == "float32" for _, dtype in mine)
    assert any(dtype == "float16" for (cell, _, dtype) in reference if cell == layer)


def test_a_white_list_naming_one_layer_runs_exactly_that_layer_in_float16(train_run):
    _, rows, run_dir = train_run("amp=O0", "amp.white_list=[fc2]", "loss_scale=dynamic",
                                 "loss_scale.init_loss_scale=1024", "train.max_steps=2")
    got = recorded(run_dir)
    assert {cell for (cell, _, dtype) in got if dtype == "float16"} == {"fc2"}
    assert {dtype for (cell, _, dtype) in got if cell == "fc2"} == {"float16"}
    assert all(r["loss"] == r["loss"] for r in rows)  # it trains


def test_a_cast_list_of_classes_goes_through_custom_mixed_precision(train_run):
    import mindspore as ms
    from mindspore import nn

    from lsexp.training.build import load_data, network

    _, _, run_dir = train_run("amp=O2", "amp.black_list=[Dense]", "loss_scale=dynamic", "train.max_steps=1")
    cfg = compose_cfg()
    x, _ = next(iter(load_data(cfg).batches(cfg.dataset, 0, 0)))
    net = ms.amp.custom_mixed_precision(network(cfg), black_list=ms.amp.get_black_list() + [nn.Dense])
    assert recorded(run_dir) == compiled_ops(net, x)


@pytest.mark.parametrize("args,says", [
    (["amp=O2", "amp.black_list=[fc9]"],
     "amp.black_list=fc9: LeNet5 has no cell of that name or class; use a cell name (conv1, conv2, fc1, fc2, "
     "fc3, relu, max_pool2d, flatten) or a cell class (Conv2d, Dense, Flatten, MaxPool2d, ReLU)"),
    (["amp=O0", "amp.white_list=[Linear]"],
     "amp.white_list=Linear: LeNet5 has no cell of that name or class"),
    (["amp=O2", "amp.white_list=[fc1]"],
     "amp.white_list with amp.level=O2: the level already runs the cells"),
    (["amp=O0", "amp.black_list=[fc1]"], "amp.black_list with amp.level=O0: the level runs nothing in low"),
    (["amp=auto", "amp.dtype=float32"], "amp.dtype=float32: unknown low-precision type; use float16 or "
                                        "bfloat16"),
    (["amp.level=O4"], "amp.level=O4: unknown amp level; use one of O0, O1, O2, O3, auto"),
])
def test_bad_cast_options_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    out = run_cli(*args, "train.max_steps=2", cwd=tmp_path)
    assert_refused(out, says, tmp_path)
