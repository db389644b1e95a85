"""A run is checked once, and a model or data set of the user's own is built once, for the shape probe
and the training both."""

import subprocess
import sys
import textwrap

import pytest

from conftest import run_cli

COUNTING = '''
from pathlib import Path

import numpy as np
from mindspore import nn

LOG = Path(__file__).with_name("built.log")


class Net(nn.Cell):
    def __init__(self, num_class, num_channel, image_size):
        super().__init__()
        with open(LOG, "a") as f:
            f.write("network\\n")
        self.flat = nn.Flatten()
        self.head = nn.Dense(num_channel * image_size * image_size, num_class)

    def construct(self, x):
        return self.head(self.flat(x))


def data(num_classes=10, num_channel=1, image_size=8, seed=1, **_):
    with open(LOG, "a") as f:
        f.write("data\\n")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, num_channel, image_size, image_size)).astype(np.float32)
    return x, rng.integers(0, 10, 64)
'''


def test_a_single_run_validates_once(tmp_path):
    code = textwrap.dedent("""\
        import atexit, sys
        import lsexp.preflight as preflight
        calls = []
        validate = preflight.validate
        preflight.validate = lambda cfg: calls.append(1) or validate(cfg)
        atexit.register(lambda: print("validations", len(calls)))
        sys.argv = ["lsexp", "train.max_steps=2", "tracking=none", "train.progress=false"]
        from lsexp.app import main
        main()
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "validations 1"


def test_a_network_and_data_of_ones_own_are_built_once_for_the_probe_and_the_run(tmp_path):
    (tmp_path / "counting.py").write_text(COUNTING)
    out = run_cli("model._target_=counting.Net", "dataset._target_=counting.data", "dataset.image_size=8",
                  "dataset.num_channel=1", "train.max_steps=3", "tracking=none", "train.progress=false",
                  cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "built.log").read_text().split() == ["data", "network"]


def test_what_a_job_imports_before_its_tracker_opens_imports_no_mindspore():
    # tracking=none in a config file lets the early worker go only when the tracker opens: MindSpore's
    # ~3 s import must come after that, not with the modules the job needs to get there
    code = ("import sys, lsexp.app, lsexp.training.loop, lsexp.tracking.run, lsexp.device.decided, "
            "lsexp.scaleout.msrun; print('mindspore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


COUNT_LENET5 = """\
import atexit, sys
from lsexp.models import lenet5
built = []
init = lenet5.LeNet5.__init__
def counted(self, *args, **kwargs):
    built.append(1)
    init(self, *args, **kwargs)
lenet5.LeNet5.__init__ = counted
atexit.register(lambda: print("built", len(built)))
sys.argv = ["lsexp", *sys.argv[1:]]
from lsexp.app import main
main()
"""


@pytest.mark.parametrize("amp,built", [("O2", 1), ("auto", 2)])
def test_a_run_builds_its_network_once_before_the_step_and_once_more_for_its_cast_map(tmp_path, amp, built):
    """The probes of the network (its layers for the taps, here) build the network the step then trains;
    only the cast map of amp=auto (or a cast list) compiles a copy of its own."""
    out = subprocess.run([sys.executable, "-c", COUNT_LENET5, "train.max_steps=3", "tracking=none",
                          "train.progress=false", "telemetry=layers", "inject.layer=fc2",
                          "inject.overflow_steps=[2]", f"amp={amp}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"built {built}"


def test_a_refusal_from_a_probe_of_the_network_leaves_a_folder_of_ones_own_as_it_was(tmp_path):
    """A single run is probed when it starts, after Hydra has made its folder: the refusal takes away what
    Hydra wrote for it, and only that, into a hydra.run.dir that holds files of the user's."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    (folder / "lsexp.log").write_text("an earlier run's log\n")
    out = run_cli("inject.layer=nope", "inject.overflow_steps=[2]", "tracking=none",
                  f"hydra.run.dir={folder}", cwd=tmp_path)
    assert out.returncode == 2 and "inject.layer=nope: model._target_=" in out.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["lsexp.log", "notes.txt"]
    assert (folder / "lsexp.log").read_text() == "an earlier run's log\n"
