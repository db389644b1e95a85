"""amp=auto and the cast lists (lsexp.amp): the cast map a run records in casts.csv under amp=auto equals
the one MindSpore's published auto lists (transcribed in helpers.mindspore_amp_lists) give, walked here over
the network's float32 graph without auto_mixed_precision, for every built-in model; a black list naming one
layer keeps exactly that layer in float32, a white list naming one runs exactly that one in float16; a name
that is no cell is refused in one line."""

import csv
import glob
import os
import re
import tempfile
from collections import Counter

import pytest

from conftest import compose_cfg, run_cli
from helpers import mindspore_amp_lists as published
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


def compiled_ir(net, x) -> str:
    """The text of the IR MindSpore compiles for net(x), after its last pass."""
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
        return open(path).read()


def _cell(scope: str) -> str:
    # Default/<attr>-<Class>/.../<Op>-opN; MindSpore's amp wrappers hold the cell as _backbone
    return ".".join(p.split("-")[0] for p in scope.split("/")[1:-1] if not p.startswith("_backbone-"))


def compiled_ops(net, x) -> Counter:
    """(cell, op, dtype) -> count of the operators in the graph MindSpore compiles for net(x), read from
    its IR after the last pass; written here apart from lsexp.amp.graph, as this test's reference."""
    found = Counter()
    for block in compiled_ir(net, x).split("\n  %")[1:]:
        head = re.match(r"\d+\(\S*\) = (?:PrimFunc_)?(\w+)\(", block)
        out = re.search(r"\) -> \((?:[^\n]*?Tensor\[(\w+)\])?", block)  # a tuple's first tensor
        scope = re.search(r"# Fullname with scope: \((\S+)\)", block)
        if not (head and out and out.group(1) and scope) or head.group(1) in SKIP:
            continue
        found[(_cell(scope.group(1)), head.group(1), out.group(1).lower())] += 1
    return found


FLOATS = ("float16", "bfloat16", "float32", "float64")  # narrow to wide


def _split(text: str) -> list:
    """text's items separated by the commas outside any bracket."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([{<") - (ch in ")]}>")
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    return items + [text[start:].strip()] if text.strip() else items


def _element_types(abstract: str):
    """The element types of an IR abstract: ['float32'] for <Tensor[Float32], ...> (a parameter's
    <Ref[Tensor[Float32]], ...> too), one for each element of <Tuple[Tensor[Float32]*3], ...>, None for
    what holds no tensor (a scalar, a monad)."""
    tensor = re.match(r"<(?:Ref\[)?Tensor\[(\w+)\]", abstract)
    if tensor:
        return [tensor.group(1).lower()]
    items = re.match(r"<Tuple\[(.*?)\], TupleShape", abstract)
    if not items:
        return None
    types = []
    for item in _split(items.group(1)):
        element, _, times = item.partition("*")
        t = re.fullmatch(r"Tensor\[(\w+)\]", element)
        types += [t.group(1).lower() if t else None] * int(times or 1)
    return types


def ir_operators(text: str):
    """Each node of a one-graph IR in order, as (node id, op, arguments, each argument's element types,
    the output's element types, scope): the arguments as written (%12 for node 12's output, %para3_fc1.weight
    for a parameter, I64(0) for a constant)."""
    for block in text.split("\n  %")[1:]:
        head = re.match(r"(\d+)\(\S*\) = (?:PrimFunc_)?(\w+)\((.*)", block)
        types = re.search(r"\n\s*: \((.*)\) -> \((.*)\)\n", block)
        assert head and types, f"an IR node this test cannot read: %{block[:200]}"
        depth = 1  # the arguments end at the parenthesis that closes the call
        for end, ch in enumerate(head.group(3)):
            depth += (ch in "([{") - (ch in ")]}")
            if depth == 0:
                break
        args, ins = _split(head.group(3)[:end]), [_element_types(a) for a in _split(types.group(1))]
        assert len(args) == len(ins), block[:200]
        scope = re.search(r"# Fullname with scope: \((\S+)\)", block)
        yield (head.group(1), head.group(2), args, ins, _element_types(types.group(2)),
               scope.group(1) if scope else None)


def _widest(types) -> str | None:
    floats = {t for t in types if t in FLOATS}
    if {"float16", "bfloat16"} <= floats and floats <= {"float16", "bfloat16"}:
        return "float32"  # neither holds the other
    return max(floats, key=FLOATS.index) if floats else None


# Unlisted operators that take their floating inputs in one type, so that MindSpore promotes them to the
# wider (their signature puts the inputs in one dtype group: Add's is (T, T)): the one such operator the
# six models give inputs of two floating types (in MultiheadAttention, Add of a float16 matmul output and a
# float32 bias or attention mask).
ONE_TYPE_INPUTS = {"Add"}


def auto_cast_map(float32_ir: str, low: str = "float16") -> Counter:
    """(cell, op, dtype) -> count, as amp_level="auto" would have the operators of a network compute, from
    the IR of the network compiled as it is, in float32, and MindSpore's published auto lists alone: each
    operator in order, its inputs in the types this walk gave the operators before it, then

    - an auto white-list operator computes in `low`, a black-list one in float32 (the level casts its
      floating inputs to that type),
    - a promote-list operator in the widest floating type of its inputs (the level casts the others to it),
    - any other operator in the type its inputs give it: their floating type; where they have two, the
      wider if it is one of ONE_TYPE_INPUTS, and the walk refuses to guess for any other.

    Narrow rules, for what those do not decide:
    - an output that is no floating type in the float32 graph (an int index, a bool mask) keeps its type,
      and so does every output of an operator with no floating input (the models' int and bool slices):
      amp casts floating tensors alone;
    - Cast computes in the type its second argument names, as in the float32 graph (a float32 attention
      mask made from a bool one stays float32);
    - Load, Depend, MakeTuple and TupleGetItem hand on the types of what they hold (they compute nothing
      and, as in compiled_ops, are not counted; neither is a Cast or a Reshape);
    - a parameter, a network input and a constant keep their float32 graph's type: the level casts them
      where an operator takes them, not where they are."""
    white, black, promote = (set(published.AUTO_WHITE_LIST), set(published.AUTO_BLACK_LIST),
                             set(published.PROMOTE_LIST))
    given = {}  # node id -> its output's element types, as the walk has them
    found = Counter()
    for node, op, args, ins, out, scope in ir_operators(float32_ir):
        inputs = []
        for arg, types in zip(args, ins):
            ref = re.fullmatch(r"%(\d+)", arg)
            inputs.append(given[ref.group(1)] if ref else types)
        floating = {t for types in inputs if types for t in types if t in FLOATS}
        if op == "TupleGetItem":
            types = [inputs[0][int(re.fullmatch(r"I64\((\d+)\)", args[1]).group(1))]]
        elif op == "MakeTuple":
            types = [t for held in inputs for t in (held or [None])]
        elif op in ("Load", "Depend"):
            types = inputs[0]
        elif out is None:  # UpdateState: a monad
            types = None
        else:
            if op in white:
                to = low
            elif op in black:
                to = "float32"
            elif op in promote:
                to = _widest(floating)
            elif op == "Cast":
                to = None
            else:
                assert len(floating) < 2 or op in ONE_TYPE_INPUTS, \
                    f"{op} at {scope} takes inputs in {sorted(floating)}: which does it compute in?"
                to = _widest(floating)
            types = [to if to and t in FLOATS else t for t in out]
        given[node] = types
        first = next((t for t in types or [] if t), None)
        if scope and first and op not in SKIP:
            found[(_cell(scope), op, first)] += 1
    return found


def recorded(run_dir) -> Counter:
    with open(run_dir / "casts.csv") as f:
        return Counter({(r["cell"], r["op"], r["dtype"]): int(r["count"]) for r in csv.DictReader(f)})


def _reference(overrides, level: str) -> Counter:
    """The cast map `level` gives the network: for auto, walked over its float32 graph from MindSpore's
    published lists (auto_cast_map), without auto_mixed_precision, which lsexp calls; for O2 and O3, that of
    MindSpore's auto_mixed_precision itself (the tests of a black list check what lsexp adds to the level)."""
    import mindspore as ms

    from lsexp.training.build import load_data, network

    cfg = compose_cfg(*overrides)
    x, _ = next(iter(load_data(cfg).batches(cfg.dataset, 0, 0)))
    if level == "auto":
        return auto_cast_map(compiled_ir(network(cfg), x))
    return compiled_ops(ms.amp.auto_mixed_precision(network(cfg), level, dtype=ms.float16), x)


@pytest.mark.parametrize("model", [m if m in FAST else pytest.param(m, marks=pytest.mark.slow)
                                   for m in MODELS])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_amp_auto_records_the_cast_map_mindspore_makes_of_auto_mixed_precision(train_run, model):
    summary, _, run_dir = train_run(*MODELS[model], "amp=auto", "loss_scale=dynamic", "train.max_steps=1")
    got = recorded(run_dir)
    # every operator, in the type MindSpore's published lists give it, walked over the float32 graph
    assert got == _reference(MODELS[model], "auto")
    # and directly: the auto white list's operators in float16, its black list's in float32
    white, black = set(published.AUTO_WHITE_LIST), set(published.AUTO_BLACK_LIST)
    ops = {(op, dtype) for (_, op, dtype) in got}
    assert any(op in white for op, _ in ops)
    assert all(dtype == "float16" for op, dtype in ops if op in white)
    assert all(dtype == "float32" for op, dtype in ops if op in black)
    low = sum(n for (_, _, d), n in got.items() if d == "float16")
    assert summary["casts"]["ops_by_dtype"]["float16"] == low


def test_the_transcribed_auto_lists_are_those_of_the_installed_mindspore():
    """helpers.mindspore_amp_lists against the wheel it was read from, apart from the test above, which
    takes the names from the transcription alone: another MindSpore needs its lists read again, and the
    lines they are on."""
    import mindspore
    from mindspore.train import amp

    assert mindspore.__version__ == published.MINDSPORE_VERSION
    assert tuple(p.__name__ for p in amp.AMP_AUTO_WHITE_LIST) == published.AUTO_WHITE_LIST
    assert tuple(p.__name__ for p in amp.AMP_AUTO_BLACK_LIST) == published.AUTO_BLACK_LIST
    promote = amp.auto_mixed_precision.__doc__.split("Operators in `promote_list` are:")[1].split("Note:")[0]
    assert tuple(re.findall(r"``(\w+)``", promote)) == published.PROMOTE_LIST


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
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_bad_cast_options_are_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    out = run_cli(*args, "train.max_steps=2", cwd=tmp_path)
    assert_refused(out, says, tmp_path)
