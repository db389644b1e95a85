"""dataset.cache: a file data set read once into memory gives the pipeline's batches bit for bit."""

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import compose_cfg, run_cli
from helpers.data_files import write_cifar10, write_image_folder, write_mnist
from lsexp.config.errors import ConfigError
from lsexp.preflight import validate

# pytest -n: on one worker, as its tests share the data files it writes (a module-scoped fixture)
pytestmark = pytest.mark.xdist_group("test_data_cache")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")  # session: kept when xdist interleaves other modules
def mnist_dir(tmp_path_factory):
    return write_mnist(tmp_path_factory.mktemp("mnist"), train=2000, test=300)


@pytest.fixture(scope="session")  # session: kept when xdist interleaves other modules
def cifar_dir(tmp_path_factory):  # Cifar10Dataset takes whole 10 000-record files only: written once
    return write_cifar10(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="session")  # session: kept when xdist interleaves other modules
def image_dir(tmp_path_factory):
    return write_image_folder(tmp_path_factory.mktemp("images"), classes=3, per_class=20, size=16)


@pytest.fixture
def data_args(request, mnist_dir, cifar_dir, image_dir):
    """The overrides of a data set case, by name."""
    return {
        "mnist_resized": ["dataset=mnist", f"dataset.path={mnist_dir}"],  # Resize 28 -> 32 per sample
        "mnist_28": ["dataset=mnist", f"dataset.path={mnist_dir}", "dataset.image_size=28"],
        "cifar10": ["dataset=cifar10", f"dataset.path={cifar_dir}"],
        "image_folder": ["dataset=image_folder", f"dataset.path={image_dir}", "dataset.image_size=16",
                         "dataset.batch_size=8"],
        "image_folder_gray": ["dataset=image_folder", f"dataset.path={image_dir}", "dataset.num_channel=1",
                              "dataset.batch_size=8", "dataset.drop_remainder=false"],
    }[request.param]


def _load(*overrides):
    from lsexp.training.build import load_data

    cfg = compose_cfg(*overrides)
    validate(cfg)
    return load_data(cfg), cfg.dataset


# --- the same run either way ----------------------------------------------------------------------
@pytest.mark.parametrize("data_args", [pytest.param("mnist_resized", marks=pytest.mark.slow), "mnist_28",
                                       pytest.param("cifar10", marks=pytest.mark.slow), "image_folder"],
                         indirect=True)
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_memory_and_stream_train_and_evaluate_the_same(train_run, data_args):
    # Overflows injected under a dynamic scale: the scale's back-offs and the skips are in the history too.
    common = [*data_args, "loss_scale=dynamic", "inject.overflow_steps=[2,5]", "train.max_steps=6"]
    memory, rows_memory, _ = train_run(*common, "dataset.cache=memory")
    stream, rows_stream, _ = train_run(*common, "dataset.cache=stream")
    assert len(rows_memory) == 6 and [r["overflow"] for r in rows_memory] == [0, 1, 0, 0, 1, 0]
    assert rows_memory == rows_stream
    assert memory["epoch_eval"] == stream["epoch_eval"] and memory["eval_accuracy"] == stream["eval_accuracy"]
    assert memory["eval_loss"] == stream["eval_loss"]
    assert (memory["dataset_cache"], stream["dataset_cache"]) == ("memory", "stream")  # what each run did


def _batches(data, d, epoch, start):
    return [(x.asnumpy(), y.asnumpy()) for x, y in data.batches(d, epoch, start)]


@pytest.mark.parametrize("data_args", ["mnist_resized", "image_folder_gray"], indirect=True)
def test_resumed_and_sharded_slices_are_the_pipelines_batches(data_args):
    memory, d = _load(*data_args, "dataset.cache=memory")
    stream, _ = _load(*data_args, "dataset.cache=stream")
    assert (memory.cache, stream.cache) == ("memory", "stream")
    sharded = OmegaConf.create({**OmegaConf.to_container(d, resolve=True), "num_shards": 2, "shard_id": 1,
                                "drop_remainder": True})  # as data parallel's rank 1 of 2 sees it
    # a fresh epoch, a resume, one rank's slice
    for d_, epoch, start in ((d, 0, 0), (d, 1, 3), (sharded, 2, 1)):
        ours, theirs = _batches(memory, d_, epoch, start), _batches(stream, d_, epoch, start)
        assert len(ours) == len(theirs) > 0
        for (x, y), (x_, y_) in zip(ours, theirs):
            assert (x.dtype == x_.dtype and y.dtype == y_.dtype
                    and np.array_equal(x, x_) and np.array_equal(y, y_))
    for (x, y), (x_, y_) in zip(memory.eval_batches(16), stream.eval_batches(16), strict=True):
        assert np.array_equal(x.asnumpy(), x_.asnumpy()) and np.array_equal(y, y_)


def test_the_lookup_is_what_the_transforms_make_of_any_image():
    from mindspore.dataset import vision

    from lsexp.datasets import cifar10, mnist
    from lsexp.datasets.kinds import _lookup_table

    rng = np.random.default_rng(0)
    for each, c in (([vision.Rescale(1.0 / (255 * mnist.STD), -mnist.MEAN / mnist.STD)], 1),
                    ([vision.Normalize(cifar10.MEAN, cifar10.STD)], 3),
                    ([vision.Rescale(1.0 / 255, 0.0)], 3)):
        table = _lookup_table(each, c)
        # odd sizes: any vector tail of the kernels
        for shape in ((1, 1), (15, 15), (7, 13), (28, 28), (32, 32)):
            image = rng.integers(0, 256, (*shape, c), dtype=np.uint8)
            assert np.array_equal(table[np.arange(c), image], each[0](image))


# --- the choice ---------------------------------------------------------------------------------------
def test_auto_reads_into_memory_under_the_limit_and_streams_over_it(mnist_dir, caplog):
    common = ["dataset=mnist", f"dataset.path={mnist_dir}"]  # 2300 records of 32x32: 2.3 MB
    with caplog.at_level(logging.INFO, logger="lsexp"):
        under, _ = _load(*common)
        over, _ = _load(*common, "dataset.cache_max_mb=1")
    assert (under.cache, over.cache) == ("memory", "stream")
    assert [r.getMessage() for r in caplog.records] == [
        "dataset.cache=auto: 2.3 MB of uint8 records, under dataset.cache_max_mb=1024: read once into memory",
        "dataset.cache=auto: 2.3 MB of uint8 records, over dataset.cache_max_mb=1: "
        "streamed from the files every epoch",
    ]


def test_the_choice_is_made_from_the_headers_and_reads_nothing_until_the_first_batch(mnist_dir):
    code = ("import sys; from lsexp.datasets.mnist import mnist\n"
            f"data = mnist({str(mnist_dir)!r}, cache_max_mb=1024)\n"
            "print(data.cache, 'mindspore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "memory False"


# --- errors -----------------------------------------------------------------------------------------
def _problems(*overrides):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    return err.value.problems


def test_a_bad_cache_value_is_one_line_naming_the_accepted_ones(tmp_path, mnist_dir, cifar_dir, image_dir):
    out = run_cli("dataset=mnist", f"dataset.path={mnist_dir}", "dataset.cache=foo", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "lsexp: config error: dataset.cache=foo: use one of auto, memory, stream"]
    assert list(tmp_path.iterdir()) == []  # nothing written
    for data in (["dataset=cifar10", f"dataset.path={cifar_dir}"],
                 ["dataset=image_folder", f"dataset.path={image_dir}"]):
        assert _problems(*data, "dataset.cache=RAM") == ["dataset.cache=RAM: use one of auto, memory, stream"]
    assert _problems("dataset=mnist", f"dataset.path={mnist_dir}", "dataset.cache_max_mb=-1") == [
        "dataset.cache_max_mb=-1: must be >= 0 (MB); e.g. 1024"]
    # with the files wrong too, both are said at once
    assert len(_problems("dataset=mnist", "dataset.path=/no/such/dir", "dataset.cache=foo")) == 2


def test_memory_is_refused_when_the_machine_cannot_hold_the_records(monkeypatch, cifar_dir):
    from lsexp.datasets import files

    monkeypatch.setattr(files, "_available_bytes", lambda: 100 * files.MB)  # a machine with 100 MB free
    (line,) = _problems("dataset=cifar10", f"dataset.path={cifar_dir}", "dataset.cache=memory")
    assert line == ("dataset.cache=memory: the records take 176 MB, more than the 100 MB this machine has "
                    "available; use dataset.cache=stream")
    validate(compose_cfg("dataset=cifar10", f"dataset.path={cifar_dir}"))  # auto under its limit: no refusal
